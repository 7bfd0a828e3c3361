"""Fencing (worker/core/fencing.py, docs/operations.md: Leader election): a real worker refuses a lifecycle command of
a reconciler that lost its lease, once it has seen the newer leader's epoch. The epochs come from real campaigns on
the lease bucket of the session's nats-server; the old leader "pauses" (its campaign stops without a word, as a
stopped VM's would) and the standby takes the lease after its TTL."""
from __future__ import annotations

import asyncio
import time

import pytest

from contracts import (
    ErrorCode,
    LifecycleAction,
    LifecycleCommand,
    LifecycleReply,
    ModelState,
    WorkerHeartbeat,
    subjects,
)
from planner.leader import Leadership
from runtime.service import cancel_and_wait, run_service
from runtime.settings import ClusterConfig, JanusSettings
from tests.bus.cluster import stop_services, wait_for

pytestmark = pytest.mark.slow

WORKER = "fence-w0"
INSTANCE = f"{WORKER}/demo-tiny"


def _command(action: LifecycleAction, leader: Leadership, n: int) -> LifecycleCommand:
    return LifecycleCommand(command_id=f"fence-{n}", worker_id=WORKER, model="demo-tiny", instance_id=INSTANCE,
                            action=action, issued_unix_ms=time.time() * 1e3, epoch=leader.epoch,
                            issued_by=leader.holder, deadline_ms=20_000)


async def test_a_worker_refuses_a_command_from_a_deposed_reconcilers_epoch(nats_url, bus_factory, demo_models_dir):
    from worker.shell.service import WorkerService

    cluster = ClusterConfig.model_validate({"models": [{"name": "demo-tiny", "demo": "demo-tiny"}],
                                            "workers": {"count": 1, "engine": "echo"}})
    settings = JanusSettings(nats_url=nats_url, instance=WORKER, state_dir=demo_models_dir.parent)
    worker = WorkerService(settings, cluster, worker_id=WORKER, device="cpu")
    task = asyncio.create_task(run_service(worker, install_signals=False))
    bus = await bus_factory("fence-test")
    beats: list[WorkerHeartbeat] = []

    async def on_beat(hb: WorkerHeartbeat, env) -> None:
        beats.append(hb)

    await bus.subscribe(subjects.worker_telemetry(WORKER), WorkerHeartbeat, on_beat)
    old = Leadership(await bus_factory("reconciler"), "reconciler", "fence-reconciler-0")
    new = Leadership(await bus_factory("reconciler"), "reconciler", "fence-reconciler-1")
    try:
        await wait_for(lambda: worker.residents and all(r.is_ready for r in worker.residents.values()),
                       timeout_s=120, what="the worker's instance ready", tasks=[task])
        assert (await wait_for(lambda: beats, timeout_s=10, what="a heartbeat"))[-1].device.device == "cpu"
        await old.start()
        await wait_for(old.is_leader, timeout_s=10, what="the first copy leading")
        await new.start()
        reply = await bus.request(subjects.worker_cmd(WORKER), _command(LifecycleAction.ACTIVATE, old, 1),
                                  LifecycleReply, timeout_s=20)
        assert reply.ok and reply.state == ModelState.ACTIVE  # the old leader's term, while it leads

        await cancel_and_wait(old._task, what="the paused leader")  # paused: no refresh, no word
        await wait_for(new.is_leader, timeout_s=10, what="the standby leading")
        assert new.epoch > old.epoch
        reply = await bus.request(subjects.worker_cmd(WORKER), _command(LifecycleAction.ACTIVATE, new, 2),
                                  LifecycleReply, timeout_s=20)
        assert reply.ok

        # the old leader wakes up and acts on what it decided before: refused, the instance untouched
        reply = await bus.request(subjects.worker_cmd(WORKER), _command(LifecycleAction.COLD, old, 3),
                                  LifecycleReply, timeout_s=20)
        assert not reply.ok and reply.error.code == ErrorCode.STALE_EPOCH, reply
        assert reply.error.detail == {"epoch": str(old.epoch), "newest_epoch": str(new.epoch)}
        assert reply.state == ModelState.ACTIVE and worker.residents[INSTANCE].state == ModelState.ACTIVE
        assert worker.fence.newest_epoch == new.epoch
    finally:
        await new.stop()
        await stop_services({"worker": worker}, [task])

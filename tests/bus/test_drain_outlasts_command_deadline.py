"""A drain may outlast the reconciler's command deadline: the removal is waited for, not retried and reported failed.
Through a real nats-server, the real reconciler service and a real worker process whose stream runs past the
deadline (`planner.reconciler.command_deadline_ms`, 1 s here; 60 s by default against a drain of up to the
gateway's 300 s request timeout, docs/lifecycle.md "Leaving Active: drain first").

Before the reconciler knew this, the worker's "still running" answer at the deadline counted as a failure: the
removal was sent again (queued behind the drain on the worker), and after three tries reported failed, with a cooldown
on that model and worker, while the drain was going well (docs/reliability.md, "a drain longer than the command
deadline")."""
from __future__ import annotations

import asyncio
import time

import pytest
import yaml

from contracts import BinAssignment, NeedVector, PlanAction, RequestDone, SteadyPlan, TokenChunk, subjects
from runtime.bus import Bus
from runtime.service import run_service
from runtime.settings import ClusterConfig, JanusSettings
from tests.bus.cluster import stop_services
from tests.bus.planner_bus_helpers import fast_planner, fresh_plans_stream
from tests.bus.worker_procs import MODEL, Observer, make_request, run_on, running_workers
from tests.polling import wait_for

pytestmark = pytest.mark.slow  # a worker process starts (torch, an engine): ~10 s on a shared 2-core box

WORKER = "deadline-w"
INSTANCE = f"{WORKER}/{MODEL}"
COMMAND_DEADLINE_MS = 1_000.0
MAX_TOKENS = 3_000  # of 4096 positions: ~4 s on this host, past the deadline and past three tries of it


def _steady(plan_id: str, models: tuple[str, ...]) -> SteadyPlan:
    bins = (BinAssignment(worker_id=WORKER, models=models, used=NeedVector(hbm=0.1, compute=0.1, bandwidth=0.1)),)
    return SteadyPlan(plan_id=plan_id, created_unix_ms=time.time() * 1e3, trigger="periodic", steady_models=models,
                      elastic_models=(), bins=bins if models else (), reason="test")


async def test_a_removal_whose_drain_outlasts_the_command_deadline_succeeds_once(nats_url, demo_models_dir,
                                                                                 tmp_path):
    from planner.reconciler_service import ReconcilerService
    from planner.shell import publish_event

    planner = fast_planner(heartbeat_timeout_ms=5_000, retry_backoff_ms=300)
    planner["reconciler"]["command_deadline_ms"] = COMMAND_DEADLINE_MS
    config = {
        "models": [{"name": MODEL, "path": str(demo_models_dir / MODEL), "ttft_slo_ms": 60_000}],
        "workers": {"pool_bytes": 96 << 20, "max_num_seqs": 4, "placement": {WORKER: [MODEL]}},
        "gateway": {"request_timeout_s": 120.0},  # the drain lets the stream run this long
        "planner": planner,
    }
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(config))
    bus = await Bus.connect(nats_url, "deadline-test")
    await fresh_plans_stream(bus)
    obs = Observer()
    await obs.start(bus)
    actions: list[PlanAction] = []

    async def on_action(action: PlanAction, env) -> None:
        actions.append(action)

    await bus.subscribe(subjects.PLAN_ACTION, PlanAction, on_action, traced=False)
    reconciler = ReconcilerService(JanusSettings(nats_url=nats_url, instance="deadline-reconciler"),
                                   ClusterConfig.model_validate(config))
    tasks = [asyncio.create_task(run_service(reconciler, install_signals=False))]
    try:
        async with running_workers(bus, (WORKER,), tmp_path / "cluster.yaml", tmp_path, nats_url):
            await publish_event(bus, subjects.PLAN_STEADY, _steady("keep", (MODEL,)))
            await wait_for(lambda: reconciler.core.is_done("keep"), timeout_s=60, tasks=tasks,
                           what="the reconciler adopting the bootstrapped instance")
            req = make_request([5, 11, 17, 23], max_tokens=MAX_TOKENS)
            await run_on(bus, WORKER, INSTANCE, req)
            await wait_for(lambda: any(isinstance(e, TokenChunk) for e in obs.streams.get(req.request_id, ())),
                           timeout_s=30, interval_s=0.01, what="the request streaming")
            await publish_event(bus, subjects.PLAN_STEADY, _steady("remove", ()))
            tokens, end = await obs.result(req.request_id, timeout_s=120)
            assert isinstance(end, RequestDone) and len(tokens) == MAX_TOKENS, end
            await wait_for(lambda: any(a.status == "succeeded" and a.plan_id == "remove" for a in actions),
                           timeout_s=30, tasks=tasks, what="the removal reported done")
    finally:
        await stop_services({"reconciler": reconciler}, tasks)
        await bus.close()

    removal = [a for a in actions if a.plan_id == "remove" and a.instance_id == INSTANCE]
    issued = next(a for a in removal if a.status == "issued")
    done = next(a for a in removal if a.status == "succeeded")
    if done.unix_ms - issued.unix_ms <= COMMAND_DEADLINE_MS:  # a host that drained it within the deadline
        pytest.skip(f"{MAX_TOKENS} tokens drained within {COMMAND_DEADLINE_MS:.0f} ms")
    assert [a.status for a in removal] == ["issued", "succeeded"], [(a.status, a.reason) for a in removal]
    assert done.attempt == 1

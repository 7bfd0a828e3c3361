"""The reconciler's registry watch outlives a JetStream election, through a real nats-server.

Found by the three-node test (tests/e2e/test_supervision.py) on a loaded host: the reconciler lost its lease while its
NATS node was down, set up a fresh watch for the next term, and that JetStream request timed out during the election.
It led again with no watch at all, saw no instance become ready, and after three "not ready" retries took a live
instance down with its streams. Injected here: the same nats TimeoutError from `watchall`, and a watch that ends."""
from __future__ import annotations

import asyncio
import time

import pytest
from nats.errors import TimeoutError as NatsTimeoutError

from contracts import InstanceRecord, InstanceRole, ModelState, Pool, subjects
from runtime.jetstream import ensure_kv
from runtime.service import run_service
from runtime.settings import ClusterConfig, JanusSettings
from tests.bus.cluster import stop_services
from tests.bus.planner_bus_helpers import fast_planner
from tests.polling import wait_for

pytestmark = pytest.mark.slow


def _record(instance_id: str) -> InstanceRecord:
    return InstanceRecord(instance_id=instance_id, model="m", worker_id="ww0", role=InstanceRole.COLOCATED,
                          pool=Pool.ELASTIC, state=ModelState.ACTIVE,
                          is_ready=True, updated_unix_ms=time.time() * 1e3)


async def test_a_term_whose_watch_times_out_and_a_watch_that_ends_both_see_the_registry_again(nats_url,
                                                                                             bus_factory):
    from planner.reconciler_service import ReconcilerService

    bus = await bus_factory("watch-test")
    kv = await ensure_kv(bus.js, subjects.INSTANCES_BUCKET)
    cluster = ClusterConfig.model_validate({"models": [{"name": "m"}],
                                            "planner": fast_planner(heartbeat_timeout_ms=3000, retry_backoff_ms=200)})
    reconciler = ReconcilerService(JanusSettings(nats_url=nats_url, instance="watch-reconciler"), cluster)
    tasks = [asyncio.create_task(run_service(reconciler, install_signals=False))]

    async def put_and_see(instance_id: str, what: str) -> None:
        await kv.put(subjects.instance_key(instance_id), _record(instance_id).model_dump_json().encode())
        await wait_for(lambda: reconciler.core.view.record(instance_id) is not None, timeout_s=10,
                       what=f"the reconciler seeing {instance_id} {what}", tasks=tasks)

    try:
        await wait_for(lambda: reconciler.is_leader(), timeout_s=30, what="the reconciler leading", tasks=tasks)
        await put_and_see("ww0/a", "at first")

        # a new term while JetStream elects: the watch's consumer request times out, twice
        real_watchall, num_failures = reconciler._kv.watchall, [0]

        async def electing_watchall(**kwargs):
            if num_failures[0] < 2:
                num_failures[0] += 1
                raise NatsTimeoutError
            return await real_watchall(**kwargs)

        reconciler._kv.watchall = electing_watchall
        await reconciler._on_leadership(False)
        assert num_failures[0] == 2
        await put_and_see("ww0/b", "after a term whose watch timed out twice")

        # the watch ends under it (its consumer gone for good): the next period starts another
        await reconciler._watcher.stop()
        await put_and_see("ww0/c", "after its watch ended")
        assert {r.instance_id for r in reconciler.core.view.records()} >= {"ww0/a", "ww0/b", "ww0/c"}
    finally:
        await stop_services({"reconciler": reconciler}, tasks)

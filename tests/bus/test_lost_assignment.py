"""An assignment the bus drops does not strand its request, through a real nats-server (gateway, dispatcher and a
worker in this process, echo engine).

NATS core is at-most-once: a failover can drop the dispatcher's RunAssignment, or the worker's hand-back of a request
it could not start. Nobody then knew the request but the gateway, which waited out its request timeout (120 s) with
no worker to ask: 8 streams of tests/e2e/test_supervision.py's three-node test ended that way once in a full run.
Now the dispatcher asks the worker about assignments unconfirmed for `confirm_assignment_after_ms`
(janus.worker.<w>.holds) and queues again what it does not hold. Injected here: a worker that drops assignments."""
from __future__ import annotations

import time

import httpx
import pytest

from runtime.client import stream_completion
from worker.shell.service import WorkerService

from .cluster import start_cluster

pytestmark = pytest.mark.slow

CONFIRM_AFTER_MS = 1000.0
REQUEST_TIMEOUT_S = 60.0


class DroppingWorker(WorkerService):
    """Loses the first `num_to_drop` assignments it is sent, as a bus failover would: never seen, never answered."""

    num_to_drop = 2

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.dropped: list[str] = []

    async def _on_run(self, run, env) -> None:
        if len(self.dropped) < self.num_to_drop:
            self.dropped.append(run.request.request_id)
            return
        await super()._on_run(run, env)


@pytest.fixture
async def cluster(nats_url, demo_models_dir):
    config = {"models": [{"name": "demo-tiny", "path": str(demo_models_dir / "demo-tiny"), "ttft_slo_ms": 30000}],
              "workers": {"engine": "echo"}, "gateway": {"request_timeout_s": REQUEST_TIMEOUT_S},
              "dispatcher": {"confirm_assignment_after_ms": CONFIRM_AFTER_MS}}
    c = await start_cluster(nats_url, config, demo_models_dir, tag="lost", worker_cls=DroppingWorker)
    yield c
    await c.stop()


async def test_dropped_assignments_are_queued_again_and_served(cluster):
    worker = cluster.services["lost-worker-0"]
    started_s = time.monotonic()
    async with httpx.AsyncClient(base_url=cluster.url, timeout=None) as client:
        outcome = await stream_completion(client, {"model": "demo-tiny", "prompt": "hello", "max_tokens": 8},
                                          timeout_s=REQUEST_TIMEOUT_S + 10)
    took_s = time.monotonic() - started_s
    assert outcome.status == "completed" and outcome.num_tokens == 8, outcome
    assert len(worker.dropped) == 2, "the first two dispatches of the request were lost"
    # each lost dispatch is found within confirm_assignment_after_ms and a check period (1 s): far short of the
    # gateway's timeout, which used to be the only thing that ended such a request
    assert took_s < 2 * (CONFIRM_AFTER_MS / 1e3 + 1.0) + 3.0, took_s
    assert not cluster.dispatcher.core.inflight_ids(), "nothing is left unconfirmed"

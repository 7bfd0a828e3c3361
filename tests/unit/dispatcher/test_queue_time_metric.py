"""janus_dispatcher_request_queue_time_seconds: from a request's arrival at the dispatcher (or its requeue) to its
assignment to an instance, one observation per assignment; a request that leaves the queue otherwise adds none."""
from __future__ import annotations

import time

from contracts import CancelRequest, GenerateRequest, SamplingParams
from dispatcher.core.effects import Assign, Requeued
from dispatcher.core.requests import DispatchRequest
from dispatcher.service import DispatcherService
from runtime.metrics import REGISTRY
from runtime.settings import ClusterConfig, JanusSettings

MODEL = "queue-time-model"


class _Nats:
    is_connected = True
    stats = {"reconnects": 0}


class _Bus:
    """What _assign and _on_request touch: publish, and a connected client."""

    def __init__(self) -> None:
        self.nc = _Nats()
        self.published: list[tuple[str, object]] = []

    async def publish(self, subject: str, msg: object, **kw) -> None:
        self.published.append((subject, msg))


def _dispatcher() -> DispatcherService:
    cluster = ClusterConfig.model_validate({"models": [{"name": MODEL, "path": "unused", "ttft_slo_ms": 1000}]})
    svc = DispatcherService(JanusSettings(instance="queue-time-test", metrics_port=None), cluster)
    svc.bus = _Bus()
    return svc


def _request(request_id: str) -> GenerateRequest:
    now_ms = time.time() * 1e3
    return GenerateRequest(request_id=request_id, model=MODEL, prompt_token_ids=(1, 2, 3),
                           sampling=SamplingParams(max_tokens=4), arrival_unix_ms=now_ms,
                           ttft_deadline_unix_ms=now_ms + 1000, tpot_slo_ms=50, reply_subject=f"reply.{request_id}")


def _assign(req: GenerateRequest) -> Assign:
    return Assign(request_id=req.request_id, model=MODEL, instance_id="i0", worker_id="w0", predicted_prefill_ms=1.0,
                  expected_done_ms=0.0, ttft_deadline_ms=req.ttft_deadline_unix_ms, is_late=False, attempt=0,
                  request=DispatchRequest.from_generate(req))


def _queue_time() -> tuple[float, float]:
    name = "janus_dispatcher_request_queue_time_seconds"
    count = REGISTRY.get_sample_value(f"{name}_count", {"model": MODEL}) or 0.0
    return count, REGISTRY.get_sample_value(f"{name}_sum", {"model": MODEL}) or 0.0


async def test_the_wait_from_arrival_to_assignment_is_observed_once():
    svc = _dispatcher()
    req = _request("qt-1")
    await svc._on_request(req, None)  # no instance yet: it waits in the queue
    assert req.request_id in svc._queued_since_s
    svc._queued_since_s[req.request_id] -= 0.3  # as if it arrived 0.3 s ago
    count, total_s = _queue_time()
    await svc._assign(_assign(req))
    new_count, new_total_s = _queue_time()
    assert new_count == count + 1
    assert 0.3 <= new_total_s - total_s < 5.0
    assert svc._queued_since_s == {}
    await svc._assign(_assign(req))  # a duplicate assignment is not a second wait
    assert _queue_time()[0] == new_count


async def test_a_requeued_request_waits_again_from_its_requeue_and_a_cancel_forgets_it():
    svc = _dispatcher()
    req = _request("qt-2")
    await svc._on_request(req, None)
    svc._queued_since_s[req.request_id] -= 100.0  # its first wait, already counted before the instance failed
    await svc._apply([Requeued(req.request_id, MODEL, "i0", 1)])
    count, total_s = _queue_time()
    await svc._assign(_assign(req))
    assert _queue_time()[0] == count + 1
    assert _queue_time()[1] - total_s < 50.0  # from the requeue, not the arrival
    other = _request("qt-3")
    await svc._on_request(other, None)
    await svc._on_cancel(CancelRequest(request_id=other.request_id), None)
    assert svc._queued_since_s == {}
    await svc._apply([Requeued("unknown", MODEL, "i0", 1)])  # not held here: nothing to time
    assert svc._queued_since_s == {}

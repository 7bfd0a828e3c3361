"""`/ready` (readiness) answers 503 while the gateway could not serve; `/health` (liveness) stays 200 throughout."""
from __future__ import annotations

from dataclasses import dataclass

import httpx

from gateway.app import create_app
from gateway.core.limits import TenantLimiter
from gateway.core.readiness import Readiness, StartupGate, readiness
from runtime.liveness import PeerLiveness


def test_not_ready_without_nats_or_without_a_dispatcher_heard_recently():
    assert not readiness(is_nats_connected=False, dispatcher_silent_s=0.1, dispatcher_timeout_s=2.0).is_ready
    never = readiness(is_nats_connected=True, dispatcher_silent_s=None, dispatcher_timeout_s=2.0)
    assert not never.is_ready and "no dispatcher" in never.reason
    silent = readiness(is_nats_connected=True, dispatcher_silent_s=2.5, dispatcher_timeout_s=2.0)
    assert not silent.is_ready and "2.5 s" in silent.reason
    assert readiness(is_nats_connected=True, dispatcher_silent_s=0.4, dispatcher_timeout_s=2.0).is_ready


def test_not_ready_until_every_served_model_has_come_up():
    # a first start: the dispatcher answers before the models' first instances are ACTIVE; a request sent then
    # waited for one (and was refused as overloaded when the wait outlasted its SLO and relaxations)
    gate = StartupGate(["demo-small", "demo-tiny"], grace_s=60.0)
    assert gate.waiting_for(0.0) == ["demo-small", "demo-tiny"]
    gate.observe(1.0, [])
    state = readiness(is_nats_connected=True, dispatcher_silent_s=0.1, dispatcher_timeout_s=2.0,
                      models_not_up=gate.waiting_for(1.0))
    assert not state.is_ready and "demo-small, demo-tiny" in state.reason
    gate.observe(5.0, ["demo-tiny"])
    gate.observe(5.5, [])  # another dispatcher, or the same one a moment later: what came up stays up
    assert gate.waiting_for(5.5) == ["demo-small"]
    gate.observe(9.0, ["demo-small", "demo-tiny"])
    assert gate.waiting_for(9.0) == []
    assert readiness(is_nats_connected=True, dispatcher_silent_s=0.1, dispatcher_timeout_s=2.0,
                     models_not_up=gate.waiting_for(9.0)).is_ready
    # later, a model parked at zero instances (no traffic) leaves the gateway ready: its next request wakes it
    gate.observe(200.0, ["demo-tiny"])
    assert gate.waiting_for(200.0) == []


def test_a_model_that_never_comes_up_holds_readiness_back_only_for_the_grace():
    # a gateway restarted into a running cluster whose scaler parked a model: ready once the grace has passed
    gate = StartupGate(["parked", "served"], grace_s=60.0)
    gate.observe(100.0, ["served"])
    assert gate.waiting_for(159.9) == ["parked"]
    assert gate.waiting_for(160.0) == []
    assert StartupGate(["m"], grace_s=60.0).waiting_for(1e6) == ["m"]  # no dispatcher ever heard: no grace


def test_the_freshest_peer_counts():
    live = PeerLiveness(timeout_s=2.0, check_period_s=0.25)
    assert live.least_silent_s(10.0) is None
    live.heard("dispatcher-0", 1.0)  # dead since
    live.heard("dispatcher-1", 9.5)
    assert live.least_silent_s(10.0) == 0.5


@dataclass
class _Backend:
    state: Readiness
    gateway_id: str = "gw"
    api_keys: dict = None
    max_request_bytes: int = 1 << 20
    limiter: TenantLimiter = None

    def __post_init__(self) -> None:
        self.models, self.api_keys, self.limiter = {}, {}, TenantLimiter()

    def readiness(self) -> Readiness:
        return self.state


async def _get(backend: _Backend, path: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=create_app(backend))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        return await client.get(path)


async def test_ready_is_503_with_a_reason_and_retry_after_while_health_stays_200():
    backend = _Backend(Readiness(False, "no NATS connection"))
    resp = await _get(backend, "/ready")
    assert resp.status_code == 503 and resp.headers["retry-after"] == "1"
    assert resp.json()["error"]["code"] == "unavailable" and "no NATS connection" in resp.json()["error"]["message"]
    assert (await _get(backend, "/health")).status_code == 200
    backend.state = Readiness(True, "ok")
    resp = await _get(backend, "/ready")
    assert resp.status_code == 200 and resp.json()["status"] == "ready"

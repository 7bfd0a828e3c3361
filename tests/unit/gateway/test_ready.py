"""`/ready` (readiness) answers 503 while the gateway could not serve; `/health` (liveness) stays 200 throughout."""
from __future__ import annotations

from dataclasses import dataclass

import httpx

from gateway.app import create_app
from gateway.core.limits import TenantLimiter
from gateway.core.readiness import Readiness, readiness
from runtime.liveness import PeerLiveness


def test_not_ready_without_nats_or_without_a_dispatcher_heard_recently():
    assert not readiness(is_nats_connected=False, dispatcher_silent_s=0.1, dispatcher_timeout_s=2.0).is_ready
    never = readiness(is_nats_connected=True, dispatcher_silent_s=None, dispatcher_timeout_s=2.0)
    assert not never.is_ready and "no dispatcher" in never.reason
    silent = readiness(is_nats_connected=True, dispatcher_silent_s=2.5, dispatcher_timeout_s=2.0)
    assert not silent.is_ready and "2.5 s" in silent.reason
    assert readiness(is_nats_connected=True, dispatcher_silent_s=0.4, dispatcher_timeout_s=2.0).is_ready


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

from __future__ import annotations

from typing import Literal

from .base import Message


class HealthReply(Message):
    service: str
    instance: str
    status: Literal["ok", "degraded", "stopping"]
    uptime_s: float
    detail: dict[str, str] = {}


class DispatcherHeartbeat(Message):
    """janus.telemetry.dispatcher.<id>, every 0.5 s: gateways resubmit what a silent dispatcher held, and turn
    ready (`/ready`) once every served model has been routable (gateway/core/readiness.py)."""

    dispatcher_id: str
    sent_unix_ms: float
    num_queued: int = 0
    # models with at least one instance this dispatcher routes a new request to now (ready, ACTIVE, its worker heard)
    routable_models: tuple[str, ...] = ()

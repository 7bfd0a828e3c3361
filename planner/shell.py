"""What the planner services share: the clock, worker liveness from heartbeats, the PLANS stream."""
from __future__ import annotations

import time

from pydantic import BaseModel

from contracts import WorkerHeartbeat, subjects
from runtime import tracing
from runtime.bus import Bus
from runtime.jetstream import ensure_stream

from .core.cluster_view import worker_order
from .metrics import observe_event


def now_ms() -> float:
    """Wall-clock Unix ms: the one clock of every service."""
    return time.time() * 1000.0


class WorkerLiveness:
    """Which workers beat recently (by our receipt time), and their last heartbeats."""

    def __init__(self, timeout_ms: float) -> None:
        self.timeout_ms = timeout_ms
        self._seen_ms: dict[str, float] = {}
        self._heartbeats: dict[str, WorkerHeartbeat] = {}

    def on_heartbeat(self, hb: WorkerHeartbeat, at_ms: float) -> None:
        self._seen_ms[hb.worker_id] = at_ms
        self._heartbeats[hb.worker_id] = hb

    def alive(self, at_ms: float) -> list[str]:
        """Live workers, in natural order."""
        return sorted((w for w, t in self._seen_ms.items() if at_ms - t <= self.timeout_ms), key=worker_order)

    def heartbeats(self, at_ms: float) -> list[WorkerHeartbeat]:
        """The last heartbeat of every live worker."""
        return [self._heartbeats[w] for w in self.alive(at_ms)]


async def ensure_plans_stream(bus: Bus, max_age_s: float) -> None:
    await ensure_stream(bus.js, subjects.PLANS_STREAM, [subjects.PLAN_WILDCARD], max_age_s=max_age_s)


async def publish_event(bus: Bus, subject: str, message: BaseModel) -> None:
    """Into the PLANS stream, acknowledged (an audit event that is not stored is not an audit event)."""
    headers = tracing.inject_headers({}) or None
    await bus.js.publish(subject, message.model_dump_json().encode(), headers=headers)
    observe_event(message)


async def last_plan(bus: Bus, subject: str, payload_type: type[BaseModel]) -> BaseModel | None:
    """The latest event on `subject` in PLANS (a restarted service picks up where the last one left)."""
    try:
        raw = await bus.js.get_last_msg(subjects.PLANS_STREAM, subject)
    except Exception:  # noqa: BLE001 - no such message (or no stream yet): nothing to recover
        return None
    try:
        return payload_type.model_validate_json(raw.data)
    except ValueError:
        return None

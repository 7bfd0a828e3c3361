"""`/ready`: may a load balancer send this gateway requests? (`/health` only says the process is alive.)

Pure: the shell passes in what it already tracks, so a probe costs no NATS round trip however often it comes. A
dispatcher that heartbeats (every 0.5 s) is one that answers submissions: its heartbeat goes out on the same
connection and event loop that take them, and names the models it can route a new request for now.

On a first start a dispatcher answers seconds before the models' first instances are ACTIVE; a request sent then
waited in the dispatcher's queue for one. So the gateway is ready only once every model it serves has come up
(`StartupGate`). After that a model without a routable instance does not make the gateway unready: the elastic
scaler parks a model without traffic at zero instances (keepalive_s), its next request wakes it, and an unready
gateway would get no requests at all, for any model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

# a model still not routable this long after the first dispatcher was heard does not hold readiness back: it was
# parked when this gateway started (a restart into a running cluster), or its load failed, which the planners report
STARTUP_GRACE_S = 60.0


@dataclass(frozen=True)
class Readiness:
    is_ready: bool
    reason: str  # why not, or what it is ready with


class StartupGate:
    """Which served models have not come up yet: routable by some dispatcher at least once since this gateway
    started. Times are the caller's monotonic seconds."""

    def __init__(self, models: Iterable[str], *, grace_s: float = STARTUP_GRACE_S) -> None:
        self._waiting = set(models)
        self.grace_s = grace_s
        self._first_heard_s: float | None = None

    def observe(self, now_s: float, routable_models: Iterable[str]) -> None:
        """A dispatcher's heartbeat: the models it routes now."""
        if self._first_heard_s is None:
            self._first_heard_s = now_s
        self._waiting.difference_update(routable_models)

    def waiting_for(self, now_s: float) -> list[str]:
        """The models readiness still waits for (sorted); none once the grace has passed."""
        if self._first_heard_s is not None and now_s - self._first_heard_s >= self.grace_s:
            return []
        return sorted(self._waiting)


def readiness(*, is_nats_connected: bool, dispatcher_silent_s: float | None, dispatcher_timeout_s: float,
              models_not_up: Iterable[str] = ()) -> Readiness:
    """Ready while connected to NATS, some dispatcher was heard within `dispatcher_timeout_s` (the gateway's own
    dead-dispatcher timeout) and no served model is still coming up (`StartupGate.waiting_for`).
    `dispatcher_silent_s`: since the most recent dispatcher heartbeat; None: never heard."""
    if not is_nats_connected:
        return Readiness(False, "no NATS connection")
    if dispatcher_silent_s is None:
        return Readiness(False, "no dispatcher heard yet")
    if dispatcher_silent_s >= dispatcher_timeout_s:
        return Readiness(False, f"no dispatcher heard for {dispatcher_silent_s:.1f} s")
    not_up = list(models_not_up)
    if not_up:
        return Readiness(False, f"no ready instance of {', '.join(not_up)} yet (starting)")
    return Readiness(True, "connected to NATS; a dispatcher answers; every model has come up")

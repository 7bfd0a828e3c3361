"""`/ready`: may a load balancer send this gateway requests? (`/health` only says the process is alive.)

Pure: the shell passes in what it already tracks, so a probe costs no NATS round trip however often it comes. A
dispatcher that heartbeats (every 0.5 s) is one that answers submissions: its heartbeat goes out on the same
connection and event loop that take them.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Readiness:
    is_ready: bool
    reason: str  # why not, or what it is ready with


def readiness(*, is_nats_connected: bool, dispatcher_silent_s: float | None, dispatcher_timeout_s: float) -> Readiness:
    """Ready while connected to NATS and some dispatcher was heard within `dispatcher_timeout_s` (the gateway's own
    dead-dispatcher timeout). `dispatcher_silent_s`: since the most recent dispatcher heartbeat; None: never heard."""
    if not is_nats_connected:
        return Readiness(False, "no NATS connection")
    if dispatcher_silent_s is None:
        return Readiness(False, "no dispatcher heard yet")
    if dispatcher_silent_s >= dispatcher_timeout_s:
        return Readiness(False, f"no dispatcher heard for {dispatcher_silent_s:.1f} s")
    return Readiness(True, "connected to NATS; a dispatcher answers")

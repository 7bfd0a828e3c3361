"""When the gateway asks a worker to resend a stream's events: a gap that does not close, or a long silence.

Pure: the shell passes the clock reading in. NATS core is at-most-once, so a bus failover can drop a token chunk or
the terminal event in flight; the worker that streamed them keeps a short log and resends on request.
"""
from __future__ import annotations

from dataclasses import dataclass

GAP_RESEND_S = 0.3  # events waiting behind a missing one this long: the missing one is probably lost
SILENCE_PROBE_S = 3.0  # nothing at all for this long after the first token: ask whether more was sent
MIN_PROBE_INTERVAL_S = 1.0
MAX_NUM_FAILED_PROBES = 3  # the worker unreachable this many times in a row: the stream is lost


@dataclass
class StreamRecovery:
    worker_id: str = ""
    last_event_s: float | None = None
    last_probe_s: float = float("-inf")
    is_probing: bool = False
    num_failed_probes: int = 0

    def start(self, now_s: float) -> None:
        self.is_probing = True
        self.last_probe_s = now_s

    def succeed(self, now_s: float) -> None:
        self.is_probing = False
        self.num_failed_probes = 0
        self.last_event_s = now_s  # the worker answered: it is alive, silence starts over

    def fail(self, now_s: float) -> bool:
        """Record an unanswered probe; True when the stream should be given up."""
        self.is_probing = False
        self.num_failed_probes += 1
        return self.num_failed_probes >= MAX_NUM_FAILED_PROBES


def resend_due(rec: StreamRecovery, now_s: float, *, gap_age_s: float) -> bool:
    """Only once a worker is known (the first chunk named it), one probe at a time, not too often."""
    if not rec.worker_id or rec.is_probing or now_s - rec.last_probe_s < MIN_PROBE_INTERVAL_S:
        return False
    if gap_age_s > GAP_RESEND_S:
        return True
    return rec.last_event_s is not None and now_s - rec.last_event_s > SILENCE_PROBE_S

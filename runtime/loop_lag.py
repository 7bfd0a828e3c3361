"""How late a service's event loop runs what is due: every service is one asyncio loop, and a call that blocks it
(a slow destructor in a garbage-collection pass, a synchronous wait, a CPU-bound step) delays everything it does at
once: leases go unrefreshed, heartbeats late, tokens stalled. The monitor sleeps `interval_s` over and over and
records how much later than asked it woke: `janus_event_loop_lag_seconds{service}`, and a warning line for a stall
past `warn_after_s`, so that an operator sees a blocked loop as such and not as its many consequences."""
from __future__ import annotations

import asyncio
import logging

from .metrics import LATENCY_BUCKETS_S, histogram

log = logging.getLogger("janus.loop")

LOOP_LAG_S = histogram("janus_event_loop_lag_seconds", "How much later than due the service's event loop woke a "
                       "timer (sampled every 0.1 s)", ("service",), buckets=(0.001,) + LATENCY_BUCKETS_S)


class LoopLagMonitor:
    def __init__(self, service: str, *, interval_s: float = 0.1, warn_after_s: float = 1.0) -> None:
        self.service = service
        self.interval_s = interval_s
        self.warn_after_s = warn_after_s
        self.max_lag_s = 0.0
        self.num_stalls = 0  # wakes later than warn_after_s

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        series = LOOP_LAG_S.labels(self.service)
        while True:
            asked_at = loop.time()
            await asyncio.sleep(self.interval_s)
            lag_s = max(0.0, loop.time() - asked_at - self.interval_s)
            series.observe(lag_s)
            self.max_lag_s = max(self.max_lag_s, lag_s)
            if lag_s > self.warn_after_s:
                self.num_stalls += 1
                log.warning("%s: event loop blocked for %.2f s (something ran without yielding: see "
                            "docs/operations.md, 'A blocked event loop')", self.service, lag_s)

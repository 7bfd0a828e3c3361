"""A late request's wakeup at exactly its hopeless_at_ms resolves it (relaxed again or refused): it must not find the
request still pending and ask for the same instant again. It did when `now + fastest >= due` rounded the other way
from `hopeless_at = due - fastest` (found by the shared-prefill-rows property test on a fresh example database: the
round at 277.9 ms asked for 277.9 ms forever)."""
from __future__ import annotations

from dispatcher.core import DispatcherCore, DispatchPolicy, ThroughputPrefillModel

from .helpers import TOKENS_PER_S, record, request

# (gap ms, prompt tokens, TTFT SLO ms) on one instance: request r3 turns hopeless at 277.9 ms
ARRIVALS = [(32, 199, 100), (0, 50, 432), (21, 1498, 800), (0, 2314, 234), (0, 3000, 731), (39, 3000, 800),
            (8, 2023, 671), (0, 1899, 100), (0, 2530, 800), (27, 3000, 553), (0, 50, 100), (37, 435, 449),
            (31, 3000, 175), (0, 3000, 100), (0, 50, 769), (18, 814, 100), (22, 50, 800), (0, 3000, 800),
            (16, 50, 800), (39, 2066, 800)]


def test_a_wakeup_at_hopeless_at_ms_resolves_the_late_request():
    core = DispatcherCore(DispatchPolicy(), ThroughputPrefillModel(TOKENS_PER_S))
    core.on_instances(0.0, [record("i0")])
    now_ms = 0.0
    for n, (gap_ms, tokens, slo_ms) in enumerate(ARRIVALS):
        now_ms += gap_ms
        last_wake_ms = None
        while (wake_ms := core.next_wakeup_ms()) is not None and wake_ms <= now_ms:
            assert wake_ms != last_wake_ms, f"the tick at {wake_ms} ms asked for the same instant again"
            core.on_tick(wake_ms)
            last_wake_ms = wake_ms
        core.on_request(now_ms, request(f"r{n}", now_ms, tokens=tokens, slo_ms=slo_ms))

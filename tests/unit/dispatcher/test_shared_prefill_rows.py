"""A predictor that answers for all of a model's instances at once (`predict_rows_ms`) must leave every decision as
it was: the same core, fed the same random events, with and without it."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.core import DispatcherCore, DispatchPolicy, ThroughputPrefillModel

from .helpers import TOKENS_PER_S, record, request


class RowsAtOnce(ThroughputPrefillModel):
    """The same predictions, one row for every instance (they share the configured throughput)."""

    def __init__(self) -> None:
        super().__init__(TOKENS_PER_S)
        self.num_row_calls = 0

    def predict_rows_ms(self, instances, num_prompt_tokens: np.ndarray) -> np.ndarray:
        self.num_row_calls += 1
        return self.predict_many_ms(instances[0], num_prompt_tokens)[None, :]


def _run(prefill_time, num_instances: int, arrivals: list[tuple[int, int, int]]) -> list:
    core = DispatcherCore(DispatchPolicy(), prefill_time)
    log = list(core.on_instances(0.0, [record(f"i{k}") for k in range(num_instances)]))
    now = 0.0
    for n, (gap_ms, tokens, slo_ms) in enumerate(arrivals):
        now += gap_ms
        last_wake = None
        while (wake := core.next_wakeup_ms()) is not None and wake <= now:
            # a core asking for the instant it just ticked would loop forever (test_hopeless_wakeup.py): fail instead
            assert wake != last_wake, f"the tick at {wake} ms asked for the same instant again"
            log += core.on_tick(wake)
            last_wake = wake
        log += core.on_request(now, request(f"r{n}", now, tokens=tokens, slo_ms=slo_ms))
    return log


@settings(max_examples=60, deadline=None)
@given(num_instances=st.integers(1, 6),
       arrivals=st.lists(st.tuples(st.integers(0, 40), st.integers(50, 3000), st.integers(100, 800)),
                         min_size=1, max_size=40))
def test_one_row_for_all_instances_decides_as_one_row_each(num_instances, arrivals):
    rows = RowsAtOnce()
    assert _run(rows, num_instances, arrivals) == _run(ThroughputPrefillModel(TOKENS_PER_S), num_instances, arrivals)
    assert rows.num_row_calls > 0

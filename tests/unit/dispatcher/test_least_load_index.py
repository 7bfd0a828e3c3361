"""Least-load's index must choose what a scan over the key (max(now, EPDT), outstanding, id) chooses, whatever the
ledgers went through between choices."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.core.epdt import PrefillLedger
from dispatcher.core.least_load import LeastLoadIndex

IDS = ("i0", "i1", "i2", "i3")

step = st.one_of(
    st.tuples(st.just("assign"), st.integers(0, 3), st.integers(0, 30)),
    st.tuples(st.just("complete"), st.integers(0, 3), st.integers(0, 11)),
    st.tuples(st.just("remove"), st.integers(0, 3), st.integers(0, 11)),
    st.tuples(st.just("clear"), st.integers(0, 3)),
    st.tuples(st.just("wait"), st.integers(0, 25)),
    st.tuples(st.just("choose")),
)


def scan(ledgers: list[PrefillLedger], now_ms: float) -> int:
    return min(range(len(ledgers)), key=lambda i: (max(now_ms, ledgers[i].epdt_ms), ledgers[i].num_outstanding,
                                                   ledgers[i].instance_id))


@settings(max_examples=400, deadline=None)
@given(st.lists(step, max_size=80))
def test_the_index_chooses_the_minimum_of_the_key(steps):
    ledgers = [PrefillLedger(i) for i in IDS]
    index = LeastLoadIndex(ledgers)
    now, num_sent = 0.0, 0
    for s in steps:
        if s[0] == "assign":
            ledgers[s[1]].assign(now, f"r{num_sent}", float(s[2]))
            num_sent += 1
        elif s[0] in ("complete", "remove"):
            held = ledgers[s[1]].outstanding_ids()  # one the ledger holds (an unknown id changes nothing)
            getattr(ledgers[s[1]], s[0])(now, held[s[2] % len(held)] if held else "unknown")
        elif s[0] == "clear":
            ledgers[s[1]].clear(now)
        elif s[0] == "wait":
            now += s[1]
        else:
            assert index.choose(now) == scan(ledgers, now)
    assert index.choose(now) == scan(ledgers, now)


def test_a_closed_index_hears_no_more():
    ledgers = [PrefillLedger(i) for i in IDS]
    index = LeastLoadIndex(ledgers)
    index.close()
    ledgers[0].assign(0.0, "r", 5.0)
    assert index.dirty == []
    fresh = LeastLoadIndex(ledgers)
    assert fresh.choose(0.0) == 1  # i0 is busy until 5 ms: the next id is least loaded

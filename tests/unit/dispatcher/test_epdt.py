"""EPDT bookkeeping of one prefill instance: random event sequences against a plain model of what is outstanding."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.core.epdt import PrefillLedger

operations = st.lists(
    st.tuples(
        st.sampled_from(["assign", "complete", "remove", "clear", "complete_unknown"]),
        st.floats(0.0, 50.0),  # time step
        st.floats(0.0, 200.0),  # predicted ms
        st.integers(0, 30),  # which outstanding request
    ),
    max_size=60,
)


@given(ops=operations)
@settings(max_examples=200, deadline=None)
def test_epdt_bookkeeping_stays_consistent(ops):
    ledger = PrefillLedger("i0")
    now = 0.0
    outstanding: dict[str, float] = {}  # the model: what was sent and not yet reported, in order
    next_id = 0
    for op, step, predicted, pick in ops:
        now += step
        if op == "assign":
            rid = f"r{next_id}"
            next_id += 1
            before = ledger.available_ms(now)
            done = ledger.assign(now, rid, predicted)
            assert done == pytest.approx(before + predicted)  # queued behind what the instance already holds
            outstanding[rid] = predicted
        elif op in ("complete", "remove") and outstanding:
            rid = list(outstanding)[pick % len(outstanding)]
            behind = list(outstanding)[list(outstanding).index(rid) + 1 :]
            if op == "complete":
                was_pending = ledger.pending_ms
                assert ledger.complete(now, rid)
                if ledger.pending_ms or was_pending:
                    # corrected: the instance is busy exactly with what was queued after this request (at most)
                    assert ledger.pending_ms <= sum(outstanding[r] for r in behind) + 1e-6
            else:
                assert ledger.remove(now, rid)
            del outstanding[rid]
            assert not ledger.complete(now, rid)  # a repeated report changes nothing
        elif op == "clear":
            assert ledger.clear(now) == list(outstanding)
            outstanding.clear()
        elif op == "complete_unknown":
            assert not ledger.complete(now, "never-sent")
        # invariants after every event
        assert ledger.outstanding_ids() == list(outstanding)
        assert ledger.num_outstanding == len(outstanding)
        assert -1e-6 <= ledger.pending_ms <= sum(outstanding.values()) + 1e-6
        available = ledger.available_ms(now)
        assert now <= available <= now + ledger.pending_ms + 1e-6
        if not outstanding:
            assert available == now


def test_completion_corrects_the_epdt_to_what_is_left():
    ledger = PrefillLedger("i0")
    ledger.assign(0.0, "a", 100.0)
    ledger.assign(0.0, "b", 50.0)
    assert ledger.epdt_ms == 150.0
    # a finished late, at 130: b still needs its predicted 50 from now
    ledger.complete(130.0, "a")
    assert ledger.epdt_ms == 180.0
    # b finished early
    ledger.complete(150.0, "b")
    assert ledger.available_ms(150.0) == 150.0


def test_out_of_order_reports_do_not_count_work_twice():
    ledger = PrefillLedger("i0")
    for rid, ms in (("a", 100.0), ("b", 100.0), ("c", 100.0)):
        ledger.assign(0.0, rid, ms)
    ledger.complete(190.0, "b")  # b done: a has surely started (and finished) too
    assert ledger.epdt_ms == 290.0  # only c ahead
    assert ledger.outstanding_ids() == ["a", "c"]  # a's first token is still unreported
    ledger.complete(195.0, "a")  # its late report does not move the EPDT back
    assert ledger.epdt_ms == 290.0


def test_cancel_gives_back_the_predicted_time():
    ledger = PrefillLedger("i0")
    ledger.assign(0.0, "a", 100.0)
    ledger.assign(0.0, "b", 100.0)
    ledger.remove(10.0, "b")
    assert ledger.epdt_ms == 100.0
    assert ledger.pending_ms == 100.0


def test_bad_input_is_refused():
    ledger = PrefillLedger("i0")
    ledger.assign(0.0, "a", 1.0)
    with pytest.raises(ValueError, match="already outstanding"):
        ledger.assign(0.0, "a", 1.0)
    with pytest.raises(ValueError, match=">= 0"):
        ledger.assign(0.0, "b", -1.0)


def test_removing_the_last_request_leaves_the_instance_free_now_exactly():
    # the case hypothesis found: an EPDT built by additions and taken apart by subtraction keeps a float residue
    now = 37.392377078159555
    ledger = PrefillLedger("i0")
    ledger.assign(now, "a", 152.754924)
    ledger.assign(now, "b", 51.013805)
    assert ledger.remove(now, "a") and ledger.remove(now, "b")
    assert ledger.available_ms(now) == now and ledger.pending_ms == 0.0

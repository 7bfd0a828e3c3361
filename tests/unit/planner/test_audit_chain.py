"""`janus audit --verify`'s check of the PLANS hash chain, on stored events doctored by hand."""
from __future__ import annotations

import json

from contracts import PlanStatus, subjects
from contracts.plans import audit_digest
from planner.audit_chain import StoredEvent, verify_chain


def _chain(n: int, *, first_seq: int = 1, prev: str = "", subject: str = subjects.PLAN_STATUS,
           seq_step: int = 1) -> list[StoredEvent]:
    """n events on `subject` as publish_event stores them: each names the digest of the one before."""
    events = []
    for seq in range(first_seq, first_seq + n * seq_step, seq_step):
        data = PlanStatus(plan_id=f"p{seq}", kind="steady", status="done", unix_ms=float(seq),
                          prev_event_sha256=prev).model_dump_json().encode()
        events.append(StoredEvent(seq, subject, data))
        prev = audit_digest(subject, data)
    return events


def _verify(events, first_seq=1, last_seq=None):
    last = events[-1].seq if last_seq is None else last_seq
    return verify_chain(events, first_seq=first_seq, last_seq=last)


def test_an_intact_chain_passes():
    report = _verify(_chain(5))
    assert report.is_intact and report.num_checked == 5 and "intact: 5 event(s)" in report.summary()


def test_an_empty_stream_passes():
    assert verify_chain([], first_seq=1, last_seq=0).is_intact


def test_an_altered_event_is_found():
    events = _chain(5)
    payload = json.loads(events[2].data)
    payload["status"] = "blocked"  # rewritten in place, its own chain digest kept
    events[2] = StoredEvent(3, events[2].subject, json.dumps(payload).encode())
    report = _verify(events)
    assert not report.is_intact and any("seq 4: does not follow seq 3" in p for p in report.problems)


def test_a_removed_event_is_found():
    events = _chain(5)
    del events[2]
    report = _verify(events)
    assert any("seq 3..3: missing" in p for p in report.problems)
    assert any("seq 4: does not follow seq 2" in p for p in report.problems)


def test_a_removed_event_is_found_even_with_the_sequence_renumbered():
    events = _chain(5)
    del events[2]
    renumbered = [StoredEvent(i + 1, e.subject, e.data) for i, e in enumerate(events)]
    report = _verify(renumbered)
    assert any("seq 3: does not follow seq 2" in p for p in report.problems)


def test_an_inserted_or_moved_event_is_found():
    events = _chain(4)
    moved = StoredEvent(events[1].seq, subjects.PLAN_ACTION, events[1].data)  # same bytes, another subject
    report = _verify([events[0], moved, *events[2:]])
    assert any("seq 2: names a predecessor on janus.plan.action" in p for p in report.problems)
    assert any("seq 3: does not follow seq 1" in p for p in report.problems)


def test_each_subject_is_its_own_chain():
    """The steady planner and the reconciler append at once: their events interleave, each chain intact."""
    steady = _chain(3, subject=subjects.PLAN_STEADY, first_seq=1, seq_step=2)
    status = _chain(3, subject=subjects.PLAN_STATUS, first_seq=2, seq_step=2)
    interleaved = sorted(steady + status, key=lambda e: e.seq)
    assert _verify(interleaved).is_intact, _verify(interleaved).problems
    del interleaved[2]  # the second steady plan
    assert any("seq 5: does not follow seq 1" in p for p in _verify(interleaved).problems)


def test_removed_events_at_the_end_are_found():
    report = _verify(_chain(5)[:3], last_seq=5)
    assert any("seq 4..5: missing at the end" in p for p in report.problems)


def test_an_unchained_event_is_found():
    events = _chain(3) + [StoredEvent(4, subjects.PLAN_STATUS, b'{"plan_id": "forged"}')]
    report = _verify(events)
    assert any("seq 4: not a chained event" in p for p in report.problems)


def test_a_stream_whose_head_aged_out_passes_but_seq_1_must_start_the_chain():
    aged = _chain(5)[2:]  # max_age removed seq 1 and 2: the stream now starts at 3
    assert verify_chain(aged, first_seq=3, last_seq=5).is_intact
    forged_start = _chain(3, prev="0" * 64)
    assert any("seq 1: names a predecessor" in p for p in _verify(forged_start).problems)

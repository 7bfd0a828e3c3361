"""The worker's per-request log of streamed events (worker/core/stream_log.py): what a resend answers, for how
long, and within what memory."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts import ErrorCode, ErrorInfo, RequestDone, RequestFailed, TokenChunk
from worker.core.stream_log import StreamLog


def _chunk(rid: str, seq: int) -> TokenChunk:
    return TokenChunk(request_id=rid, seq=seq, token_ids=(seq + 100,), text=f"<{seq}>", emitted_unix_ms=1.0,
                      worker_id="w0")


def _done(rid: str, seq: int) -> RequestDone:
    return RequestDone(request_id=rid, seq=seq, finish_reason="length", num_prompt_tokens=3, num_output_tokens=seq,
                       first_token_unix_ms=1.0, worker_id="w0", instance_id="w0/m")


def test_running_finished_unknown_and_expired_requests():
    log = StreamLog(retain_s=60.0)
    log.open("run")
    assert log.resend("run", 0).is_known and log.resend("run", 0).events == ()  # taken, nothing streamed yet
    log.record("run", [_chunk("run", 0), _chunk("run", 1)], now_s=1.0)
    answer = log.resend("run", 1)
    assert answer.is_known and [e.seq for e in answer.events] == [1] and answer.next_seq == 2
    assert log.resend("run", 2).is_known and log.resend("run", 2).events == ()  # running, nothing new

    log.open("fin")
    log.record("fin", [_chunk("fin", 0), _chunk("fin", 1), _done("fin", 2)], now_s=10.0)
    assert [type(e).__name__ for e in log.resend("fin", 0).events] == ["TokenChunk", "TokenChunk", "RequestDone"]
    assert not log.resend("never", 0).is_known
    with pytest.raises(ValueError):
        log.resend("fin", -1)

    assert log.expire(now_s=69.9) == 0 and log.resend("fin", 0).is_known  # kept 60 s after it ended
    assert log.expire(now_s=70.1) == 1 and not log.resend("fin", 0).is_known
    assert log.resend("run", 0).is_known  # a running request never expires
    assert log.num_events == 2


def test_pd_each_side_answers_for_what_it_streamed():
    prefill, decode = StreamLog(), StreamLog()
    prefill.open("r")
    prefill.record("r", [_chunk("r", 0)], now_s=0.0)
    prefill.finish("r", now_s=0.1, handed_to_worker_id="w-decode")
    decode.open("r", first_seq=1)
    decode.record("r", [_chunk("r", 1), _chunk("r", 2), _done("r", 3)], now_s=0.5)
    on_prefill = prefill.resend("r", 0)
    assert [e.seq for e in on_prefill.events] == [0] and on_prefill.handed_to_worker_id == "w-decode"
    assert on_prefill.next_seq == 1
    assert [e.seq for e in decode.resend("r", 0).events] == [1, 2, 3]  # it never had seq 0: the prefill side has
    assert decode.resend("r", 2).handed_to_worker_id == ""


def test_a_handed_back_request_is_forgotten_and_a_failed_one_is_kept():
    log = StreamLog()
    log.open("back")
    log.forget("back")
    log.record("back", [], now_s=1.0)  # what the shell does after a hand-back: nothing to log, nothing opened
    log.finish("back", now_s=1.0)
    assert not log.resend("back", 0).is_known
    failed = RequestFailed(request_id="bad", seq=0, error=ErrorInfo(code=ErrorCode.INVALID_REQUEST, message="x"))
    log.record("bad", [failed], now_s=1.0)  # refused at once: never opened, logged all the same
    assert log.resend("bad", 0).events == (failed,)
    log.open("bad")  # dispatched here again: a fresh log
    assert log.resend("bad", 0).events == ()


def test_has_started_tells_a_waiting_request_from_one_that_streamed_and_one_handed_back():
    log = StreamLog(retain_s=10.0)
    for rid in ("waiting", "streaming", "done", "back"):
        log.open(rid)
    log.record("streaming", [_chunk("streaming", 0)], now_s=0.0)
    log.record("done", [_chunk("done", 0), _done("done", 1)], now_s=0.0)
    log.forget("back")
    log.open("decode", first_seq=1)  # P/D decode side: nothing of its own streamed yet
    assert {rid: log.has_started(rid) for rid in ("waiting", "streaming", "done", "back", "decode", "never")} == {
        "waiting": False, "streaming": True, "done": True, "back": None, "decode": False, "never": None}
    log.expire(now_s=11.0)
    assert log.has_started("done") is None and log.has_started("streaming") is True


def test_memory_is_bounded_oldest_finished_first_then_the_oldest_running_events():
    log = StreamLog(max_num_events=10)
    for k, rid in enumerate(("old", "newer")):
        log.open(rid)
        log.record(rid, [_chunk(rid, 0), _chunk(rid, 1), _done(rid, 2)], now_s=float(k))
    log.open("live")
    log.record("live", [_chunk("live", s) for s in range(4)], now_s=5.0)
    assert log.num_events == 10
    log.record("live", [_chunk("live", 4)], now_s=6.0)
    assert not log.resend("old", 0).is_known and log.resend("newer", 0).is_known  # oldest finished log went
    log.record("live", [_chunk("live", s) for s in range(5, 12)], now_s=7.0)
    assert not log.resend("newer", 0).is_known and log.num_events == 10
    # only the running log is left and it is over the cap alone: its oldest events go, and asks from before them
    # can no longer be answered in full
    assert not log.resend("live", 0).is_known and not log.resend("live", 1).is_known
    assert [e.seq for e in log.resend("live", 2).events] == list(range(2, 12))
    assert log.num_dropped_events == 3 + 3 + 2


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 4), st.booleans()), min_size=1, max_size=40),
       st.integers(3, 30))
def test_never_over_the_cap_and_answers_are_suffixes_of_what_was_streamed(steps, cap):
    log = StreamLog(max_num_events=cap, retain_s=5.0)
    streamed: dict[str, list] = {}
    finished: set[str] = set()
    for t, (k, n, ends) in enumerate(steps):
        rid = f"r{k}"
        if rid in finished:
            continue
        if rid not in streamed:
            log.open(rid)
            streamed[rid] = []
        new = [_chunk(rid, len(streamed[rid]) + i) for i in range(n)]
        if ends:
            new.append(_done(rid, len(streamed[rid]) + n))
            finished.add(rid)
        streamed[rid] += new
        log.record(rid, new, now_s=float(t))
        log.expire(now_s=float(t))
        assert log.num_events <= cap
        for other, events in streamed.items():
            for from_seq in range(len(events) + 1):
                answer = log.resend(other, from_seq)
                if answer.is_known:
                    assert list(answer.events) == events[from_seq:]


def test_a_long_finished_log_keeps_its_end_longest():
    log = StreamLog(max_num_events=30)
    log.open("long")
    log.record("long", [_chunk("long", s) for s in range(24)] + [_done("long", 24)], now_s=0.0)
    log.open("live")
    log.record("live", [_chunk("live", s) for s in range(10)], now_s=1.0)  # 35 events: 5 too many
    assert log.num_events == 30 and log.resend("live", 0).is_known
    assert not log.resend("long", 0).is_known  # its oldest events went first...
    assert [e.seq for e in log.resend("long", 20).events] == [20, 21, 22, 23, 24]  # ...its end is still there
    log.record("live", [_chunk("live", s) for s in range(10, 24)], now_s=2.0)  # 14 more: the rest of it goes too
    assert not log.resend("long", 24).is_known and log.resend("live", 0).is_known

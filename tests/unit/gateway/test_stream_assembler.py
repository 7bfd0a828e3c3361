from __future__ import annotations

from contracts import ErrorCode, ErrorInfo, RequestDone, RequestFailed, TokenChunk
from gateway.core.stream import StreamAssembler


def chunk(seq: int, text: str = "x") -> TokenChunk:
    return TokenChunk(request_id="r", seq=seq, token_ids=(seq,), text=text, emitted_unix_ms=0.0)


def done(seq: int) -> RequestDone:
    return RequestDone(request_id="r", seq=seq, finish_reason="stop", num_prompt_tokens=1, num_output_tokens=seq)


def test_out_of_order_events_come_out_in_order_and_stop_at_done():
    a = StreamAssembler()
    assert a.push(chunk(1)) == []
    assert [e.seq for e in a.push(chunk(0))] == [0, 1]
    assert [e.seq for e in a.push(done(3))] == []
    assert [e.seq for e in a.push(chunk(2))] == [2, 3]
    assert a.is_terminal
    assert a.push(chunk(4)) == []


def test_duplicates_are_dropped():
    a = StreamAssembler()
    a.push(chunk(0))
    assert a.push(chunk(0)) == [] and a.num_duplicates == 1


def test_a_failure_ends_the_stream_at_once_whatever_its_number():
    a = StreamAssembler()
    a.push(chunk(0))
    a.push(chunk(2))  # chunk 1 never comes: its worker died
    fail = RequestFailed(request_id="r", seq=0, error=ErrorInfo(code=ErrorCode.INSTANCE_FAILED, message="dead"))
    out = a.push(fail)
    assert [type(e).__name__ for e in out] == ["TokenChunk", "RequestFailed"] and a.is_terminal


def test_a_gap_is_timed_until_it_closes():
    a = StreamAssembler()
    a.push(chunk(0))
    a.note_time(10.0)
    assert a.gap_age_s(11.0) == 0.0
    a.push(chunk(2))
    a.note_time(12.0)
    assert a.gap_age_s(15.0) == 3.0
    a.push(chunk(1))
    a.note_time(15.5)
    assert a.gap_age_s(20.0) == 0.0

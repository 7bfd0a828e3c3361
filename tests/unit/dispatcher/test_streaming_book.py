"""Which requests the dispatcher fails when an instance dies after their first token: those the dead instance
streams, following a P/D hand-over to the decode instance."""
from contracts import GenerateRequest, SamplingParams
from dispatcher.core.streaming import StreamingBook


def _request(rid: str, arrival_ms: float = 1_000.0) -> GenerateRequest:
    return GenerateRequest(request_id=rid, model="m", prompt_token_ids=(1, 2, 3),
                           sampling=SamplingParams(max_tokens=4), reply_subject=f"reply.{rid}",
                           arrival_unix_ms=arrival_ms, ttft_deadline_unix_ms=arrival_ms + 1e4, tpot_slo_ms=100.0)


def test_a_handed_over_request_dies_with_its_decode_instance_not_its_prefill_one():
    book = StreamingBook()
    book.started(_request("colocated"), "P")
    book.started(_request("split"), "P")
    assert book.handed_over("split", "D")
    assert not book.handed_over("unknown", "D")  # a notice for a request not streaming changes nothing
    # P dies: only the request P still streams fails; the split one lives on at D
    assert [(r.request_id, iid) for r, iid in book.lost({"P"})] == [("colocated", "P")]
    assert len(book) == 1
    assert [(r.request_id, iid) for r, iid in book.lost({"D"})] == [("split", "D")]
    assert len(book) == 0 and book.lost({"P", "D"}) == []


def test_cancelled_and_expired_requests_are_forgotten():
    book = StreamingBook()
    book.started(_request("old", arrival_ms=0.0), "P")
    book.started(_request("new", arrival_ms=5_000.0), "P")
    book.started(_request("cancelled"), "Q")
    book.forget("cancelled")
    assert book.expire(horizon_unix_ms=1_000.0) == 1
    assert [r.request_id for r, _ in book.lost({"P", "Q"})] == ["new"]

"""The dispatcher counts a request's outcome only while the request streams in its own book (`in`)."""
from contracts import GenerateRequest, SamplingParams
from dispatcher.core.streaming import StreamingBook


def test_a_request_is_in_the_book_from_its_first_token_until_forgotten():
    req = GenerateRequest(request_id="r", model="m", prompt_token_ids=(1,), sampling=SamplingParams(max_tokens=2),
                          reply_subject="reply.r", arrival_unix_ms=0.0, ttft_deadline_unix_ms=1e4, tpot_slo_ms=100.0)
    book = StreamingBook()
    assert "r" not in book
    book.started(req, "P")
    assert "r" in book and "other" not in book
    book.handed_over("r", "D")
    assert "r" in book
    book.forget("r")
    assert "r" not in book and len(book) == 0

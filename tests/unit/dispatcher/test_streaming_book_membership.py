"""The dispatcher counts a request's outcome only while the request streams in its own book (`in`)."""
from dispatcher.core.streaming import StreamingBook
from .test_streaming_book import _request


def test_a_request_is_in_the_book_from_its_first_token_until_forgotten():
    req = _request("r")
    book = StreamingBook()
    assert "r" not in book
    book.started(req, "P")
    assert "r" in book and "other" not in book
    book.handed_over("r", "D")
    assert "r" in book
    book.forget("r")
    assert "r" not in book and len(book) == 0


def test_an_end_heard_before_the_first_token_counts_and_never_starts_a_stream():
    """PrefillDone and RequestOutcome come on two subscriptions, each handled by its own task: under load the end
    can be handled first (a bus test once saw a finished request left streaming until the gateway's timeout)."""
    book = StreamingBook()
    req = _request("r")
    assert book.ended("r", sent=req), "this dispatcher sent it: its outcome counts"
    assert book.ended_before_first_token("r"), "it ran: not to be sent again when its worker no longer holds it"
    book.started(req, "P")  # the first token, heard late
    assert "r" not in book and len(book) == 0 and not book.ended_before_first_token("r")
    book.started(req, "P")  # a request id seen again is a new stream
    assert "r" in book


def test_an_end_of_a_request_not_sent_here_is_not_counted():
    book = StreamingBook()
    assert not book.ended("someone-elses")
    book.started(_request("someone-elses"), "P")
    assert "someone-elses" in book, "nothing remembered for a request this dispatcher did not send"
    assert book.ended("someone-elses") and "someone-elses" not in book


def test_an_end_whose_first_token_never_comes_is_forgotten_with_the_old_streams():
    book = StreamingBook()
    book.ended("lost", sent=_request("lost", arrival_ms=0.0))
    book.ended("fresh", sent=_request("fresh", arrival_ms=5_000.0))
    book.expire(horizon_unix_ms=1_000.0)
    book.started(_request("lost", arrival_ms=0.0), "P")
    book.started(_request("fresh", arrival_ms=5_000.0), "P")
    assert "lost" in book, "its early end was expired: a first token heard now starts a stream"
    assert "fresh" not in book

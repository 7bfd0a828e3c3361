"""Requests past their first token, by the instance that streams them: what the dispatcher must fail (with a clear
error to the client) when that instance dies, since such a request cannot move any more. Pure bookkeeping.

With prefill/decode disaggregation the stream moves: the prefill instance P emits the first token, then the decode
instance D takes the request over and streams the rest. P's worker says so with a hand-over notice
(`PrefillDone.handed_over_to_instance_id`); from then on D's death breaks the stream and P's does not.

A worker reports a request's first token (`PrefillDone`) before its end (`RequestOutcome`), but the dispatcher hears
the two on different subscriptions, each handled by its own task: under load the end can be handled first. Such a
request is remembered as ended (`ended`), so that its first token, heard later, does not put it in the book, where it
would sit until its clients' timeout and count as streaming.
"""
from __future__ import annotations

from contracts import GenerateRequest


class StreamingBook:
    def __init__(self) -> None:
        self._by_request: dict[str, tuple[str, GenerateRequest]] = {}  # request id -> (streaming instance, request)
        self._ended_early: dict[str, float] = {}  # request id -> arrival (unix ms): ended before its first token heard

    def __len__(self) -> int:
        return len(self._by_request)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._by_request

    def started(self, request: GenerateRequest, instance_id: str) -> None:
        """The request's first token came from `instance_id` (nothing, when its end was heard first)."""
        if self._ended_early.pop(request.request_id, None) is not None:
            return
        self._by_request[request.request_id] = (instance_id, request)

    def ended(self, request_id: str, sent: GenerateRequest | None = None) -> bool:
        """The request finished on its worker: True when it is this dispatcher's to count, that is it streams in
        the book (then forgotten), or it is `sent`, a request this dispatcher sent whose first token it has not
        heard yet (then remembered as ended, for `started`)."""
        if self._by_request.pop(request_id, None) is not None:
            return True
        if sent is None:
            return False
        self._ended_early[request_id] = sent.arrival_unix_ms
        return True

    def ended_before_first_token(self, request_id: str) -> bool:
        """Its end was heard and its first token not yet: it ran, whatever its worker holds now."""
        return request_id in self._ended_early

    def handed_over(self, request_id: str, instance_id: str) -> bool:
        """`instance_id` streams the request from now on (a P/D hand-over). False for a request not streaming."""
        entry = self._by_request.get(request_id)
        if entry is None:
            return False
        self._by_request[request_id] = (instance_id, entry[1])
        return True

    def forget(self, request_id: str) -> None:
        self._by_request.pop(request_id, None)
        self._ended_early.pop(request_id, None)

    def lost(self, instance_ids: set[str]) -> list[tuple[GenerateRequest, str]]:
        """Take out and return the requests streamed by these (dead) instances, with the instance of each."""
        out = [(req, iid) for rid, (iid, req) in self._by_request.items() if iid in instance_ids]
        for req, _ in out:
            del self._by_request[req.request_id]
        return out

    def expire(self, horizon_unix_ms: float) -> int:
        """Forget requests that arrived before the horizon (their clients have given up); returns how many."""
        old = [rid for rid, (_, req) in self._by_request.items() if req.arrival_unix_ms < horizon_unix_ms]
        for rid in old:
            del self._by_request[rid]
        # an end whose first token never came (its PrefillDone lost) is kept no longer than a stream
        for rid in [rid for rid, arrival in self._ended_early.items() if arrival < horizon_unix_ms]:
            del self._ended_early[rid]
        return len(old)

"""Requests past their first token, by the instance that streams them: what the dispatcher must fail (with a clear
error to the client) when that instance dies, since such a request cannot move any more. Pure bookkeeping.

With prefill/decode disaggregation the stream moves: the prefill instance P emits the first token, then the decode
instance D takes the request over and streams the rest. P's worker says so with a hand-over notice
(`PrefillDone.handed_over_to_instance_id`); from then on D's death breaks the stream and P's does not.
"""
from __future__ import annotations

from contracts import GenerateRequest


class StreamingBook:
    def __init__(self) -> None:
        self._by_request: dict[str, tuple[str, GenerateRequest]] = {}  # request id -> (streaming instance, request)

    def __len__(self) -> int:
        return len(self._by_request)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._by_request

    def started(self, request: GenerateRequest, instance_id: str) -> None:
        """The request's first token came from `instance_id`."""
        self._by_request[request.request_id] = (instance_id, request)

    def handed_over(self, request_id: str, instance_id: str) -> bool:
        """`instance_id` streams the request from now on (a P/D hand-over). False for a request not streaming."""
        entry = self._by_request.get(request_id)
        if entry is None:
            return False
        self._by_request[request_id] = (instance_id, entry[1])
        return True

    def forget(self, request_id: str) -> None:
        self._by_request.pop(request_id, None)

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
        return len(old)

"""runtime/jetstream.py: what waits out a JetStream stream electing its leader (a NATS node lost, or a replicated
bucket created a moment ago) and what does not. The nats-py errors are the ones seen in the three-node test
(tests/e2e/test_supervision.py): a worker's first registry write got NoStreamResponseError and the worker died."""
from __future__ import annotations

import pytest
from nats.errors import NoRespondersError
from nats.js.errors import BadRequestError, NoStreamResponseError

from runtime.jetstream import kv_put, watch_all


class ElectingBucket:
    """Answers like a bucket whose stream has no leader for the first `num_unanswered` requests."""

    def __init__(self, num_unanswered: int, error: Exception) -> None:
        self.num_unanswered, self.error, self.num_calls = num_unanswered, error, 0

    def _answer(self, value):
        self.num_calls += 1
        if self.num_calls <= self.num_unanswered:
            raise self.error
        return value

    async def put(self, key: str, value: bytes) -> int:
        return self._answer(7)

    async def watchall(self):
        return self._answer("watcher")


@pytest.mark.parametrize("error", [NoStreamResponseError(), NoRespondersError()], ids=["no-stream-response",
                                                                                     "no-responders"])
async def test_a_put_and_a_watch_wait_out_an_election(error):
    bucket = ElectingBucket(2, error)
    assert await kv_put(bucket, "k", b"v", timeout_s=5.0) == 7 and bucket.num_calls == 3
    bucket = ElectingBucket(2, error)
    assert await watch_all(bucket, timeout_s=5.0) == "watcher" and bucket.num_calls == 3


async def test_an_election_that_outlasts_the_wait_is_a_clear_error_and_a_refusal_is_not_retried():
    with pytest.raises(RuntimeError, match="JetStream did not answer for KV put k within 0.3 s"):
        await kv_put(ElectingBucket(10**6, NoStreamResponseError()), "k", b"v", timeout_s=0.3)
    refused = ElectingBucket(1, BadRequestError())
    with pytest.raises(BadRequestError):
        await kv_put(refused, "k", b"v", timeout_s=5.0)
    assert refused.num_calls == 1

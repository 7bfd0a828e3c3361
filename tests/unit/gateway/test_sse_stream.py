"""The SSE body the gateway streams: a token whose text is held back (it ends inside a multi-byte character) must
not lose its logprob: clients count streamed tokens by them."""
import json

import pytest

from contracts import RequestDone, TokenChunk
from gateway.core.responses import Completion
from gateway.metrics import InterTokenClock
from gateway.respond import Shape, _stream


def _chunk(seq: int, token: int, text: str, logprob: float) -> TokenChunk:
    return TokenChunk(request_id="r", seq=seq, token_ids=(token,), text=text, logprobs=(logprob,),
                      emitted_unix_ms=0.0)


async def _body(events, kind: str, want_logprobs: bool) -> list[dict]:
    async def rest():
        for ev in events[1:]:
            yield 0, ev

    completion = Completion(request_id="r", model="m", created_s=0, kind=kind, num_prompt_tokens=3)
    out = []
    pieces = (lambda t: (f"t{t}", f"t{t}".encode())) if want_logprobs else None
    shape = Shape(kind=kind, stream=True, include_usage=None, pieces=pieces)
    async for raw in _stream((0, events[0]), rest(), completion, shape, lambda: None, InterTokenClock([("m", "t")])):
        data = raw.decode().removeprefix("data: ").strip()
        if data != "[DONE]":
            out.append(json.loads(data))
    return out


@pytest.mark.parametrize("kind", ["completion", "chat"])
async def test_held_back_tokens_keep_their_logprobs(kind):
    events = [_chunk(0, 1, "a", -0.1), _chunk(1, 2, "", -0.2), _chunk(2, 3, "é", -0.3), _chunk(3, 4, "", -0.4),
              RequestDone(request_id="r", seq=4, finish_reason="length", num_prompt_tokens=3, num_output_tokens=4)]
    body = await _body(events, kind, want_logprobs=True)
    if kind == "completion":
        texts = [c["choices"][0]["text"] for c in body]
        lps = [c["choices"][0]["logprobs"]["token_logprobs"] if c["choices"][0]["logprobs"] else [] for c in body]
    else:
        texts = [c["choices"][0]["delta"].get("content", "") for c in body]
        lps = [[t["logprob"] for t in c["choices"][0]["logprobs"]["content"]] if c["choices"][0]["logprobs"] else []
               for c in body]
    assert texts == ["a", "é", ""]  # nothing sent for the held-back tokens on their own
    assert lps == [[-0.1], [-0.2, -0.3], [-0.4]]  # every token's logprob arrives, in order
    if kind == "completion":  # each logprob names its token (the tokenizer's piece), not ""
        tokens = [c["choices"][0]["logprobs"]["tokens"] if c["choices"][0]["logprobs"] else [] for c in body]
    else:
        tokens = [[t["token"] for t in c["choices"][0]["logprobs"]["content"]] if c["choices"][0]["logprobs"]
                  else [] for c in body]
        assert body[1]["choices"][0]["logprobs"]["content"][0]["bytes"] == list(b"t2")
    assert tokens == [["t1"], ["t2", "t3"], ["t4"]]
    assert body[-1]["choices"][0]["finish_reason"] == "length"


async def test_without_logprobs_nothing_is_attached():
    events = [_chunk(0, 1, "a", -0.1), _chunk(1, 2, "", -0.2),
              RequestDone(request_id="r", seq=2, finish_reason="stop", num_prompt_tokens=3, num_output_tokens=2)]
    body = await _body(events, "completion", want_logprobs=False)
    assert all(c["choices"][0]["logprobs"] is None for c in body)

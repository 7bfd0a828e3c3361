"""Real clients send fields the gateway does not know (guidellm always sends vLLM's
`stream_options.continuous_usage_stats`; aiperf's --per-chunk-usage too): accepted, ignored, and named in the
`x-janus-ignored-fields` header. Fields it knows but does not support stay a 400 naming them. vLLM's
`continuous_usage_stats` is served: usage in every chunk."""
from __future__ import annotations

import json

import pytest

from gateway.app import IGNORED_FIELDS_HEADER
from contracts import RequestDone, TokenChunk
from tests.unit.gateway.test_request_validation import BASE, Backend, _post, backend, served  # noqa: F401 - fixtures


class WithLogprobs(Backend):
    async def submit(self, request):
        yield TokenChunk(request_id=request.request_id, seq=0, token_ids=(5,), text="a", logprobs=(-0.5,),
                         emitted_unix_ms=0.0)
        yield RequestDone(request_id=request.request_id, seq=1, finish_reason="length", num_prompt_tokens=2,
                          num_output_tokens=1)


def _events(response) -> list:
    return [json.loads(line[6:]) for line in response.text.splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]


async def test_unknown_fields_are_served_and_named(backend):  # noqa: F811
    r = await _post(backend, {**BASE, "frobnicate": 3, "guided_whatever": {"x": 1}})
    assert r.status_code == 200, r.text
    assert r.headers[IGNORED_FIELDS_HEADER] == "frobnicate,guided_whatever"
    assert len(backend.submitted) == 1


async def test_a_body_with_only_known_fields_has_no_header(backend):  # noqa: F811
    r = await _post(backend, BASE)
    assert r.status_code == 200 and IGNORED_FIELDS_HEADER not in r.headers


async def test_unknown_stream_options_are_named_with_their_path(backend):  # noqa: F811
    r = await _post(backend, {**BASE, "stream": True, "stream_options": {"include_usage": True, "later_thing": 1}})
    assert r.status_code == 200
    assert r.headers[IGNORED_FIELDS_HEADER] == "stream_options.later_thing"


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", BASE),
    ("/v1/chat/completions", {"model": "demo-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
])
async def test_continuous_usage_stats_puts_usage_in_every_chunk(backend, path, body):  # noqa: F811
    r = await _post(backend, {**body, "stream": True,
                              "stream_options": {"include_usage": True, "continuous_usage_stats": True}}, path)
    assert r.status_code == 200 and IGNORED_FIELDS_HEADER not in r.headers
    events = _events(r)
    with_choices = [e for e in events if e["choices"]]
    assert with_choices and all("usage" in e for e in with_choices)
    counts = [e["usage"]["completion_tokens"] for e in with_choices]
    assert counts == sorted(counts) and counts[-1] >= 1  # grows as tokens come
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == counts[-1]


async def test_without_it_only_the_final_chunk_has_usage(backend):  # noqa: F811
    r = await _post(backend, {**BASE, "stream": True, "stream_options": {"include_usage": True}})
    events = _events(r)
    assert all("usage" not in e for e in events if e["choices"]) and "usage" in events[-1]


@pytest.mark.parametrize("field, value", [("n", 17), ("best_of", 3), ("presence_penalty", 2.5),
                                          ("frequency_penalty", -3), ("repetition_penalty", 0), ("min_p", 1.5),
                                          ("min_tokens", -1), ("logit_bias", {"5": 101}), ("logit_bias", {"a": 1}), ("logit_bias", {"²": 1}),
                                          ("logprobs", 21), ("top_k", -2)])
async def test_known_fields_out_of_range_are_a_400_naming_them(backend, field, value):  # noqa: F811
    r = await _post(backend, {**BASE, field: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == field
    assert not backend.submitted


async def test_a_message_with_fields_it_cannot_read_is_refused(backend):  # noqa: F811
    body = {"model": "demo-tiny", "max_tokens": 4, "messages": [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "t", "type": "function"}]}]}
    r = await _post(backend, body, "/v1/chat/completions")
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {**BASE, "logprobs": 1}),
    ("/v1/chat/completions", {"model": "demo-tiny", "messages": [{"role": "user", "content": "hi"}],
                              "max_tokens": 4, "logprobs": True}),
])
@pytest.mark.parametrize("stream", [False, True])
async def test_logprobs_name_their_token_with_text_and_bytes(served, path, body, stream):  # noqa: F811
    # the backend answers token id 5 (text "a") with its logprob: named by its piece in the demo tokenizer
    backend = WithLogprobs(models={served.name: served})
    r = await _post(backend, {**body, "stream": stream}, path)
    assert r.status_code == 200, r.text
    choice = (_events(r)[0] if stream else r.json())["choices"][0]
    expected, raw = backend.models["demo-tiny"].tokenizer.token_piece(5)
    assert expected and raw
    if path == "/v1/completions":
        assert choice["logprobs"]["tokens"] == [expected]
    else:
        entry = choice["logprobs"]["content"][0]
        assert entry["token"] == expected and entry["bytes"] == list(raw)

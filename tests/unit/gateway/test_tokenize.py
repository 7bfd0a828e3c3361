"""vLLM's /tokenize, /detokenize and /version, with the real demo tokenizer: what clients written for vLLM call to
count tokens before they send."""
from __future__ import annotations

import httpx

from gateway.app import create_app
from tests.unit.gateway.test_request_validation import backend, served  # noqa: F401 - fixtures


async def _call(backend, method: str, path: str, body: dict | None = None) -> httpx.Response:  # noqa: F811
    transport = httpx.ASGITransport(app=create_app(backend), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        return await client.request(method, path, json=body)


async def test_tokenize_and_detokenize_round_trip(backend, served):  # noqa: F811
    r = await _call(backend, "POST", "/tokenize", {"model": "demo-tiny", "prompt": "Hello wörld"})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["tokens"] == served.tokenizer.encode("Hello wörld") and out["count"] == len(out["tokens"])
    assert out["max_model_len"] == served.max_model_len
    back = await _call(backend, "POST", "/detokenize", {"model": "demo-tiny", "tokens": out["tokens"]})
    assert back.status_code == 200 and back.json() == {"prompt": "Hello wörld"}


async def test_tokenize_messages_renders_the_chat_template(backend, served):  # noqa: F811
    messages = [{"role": "user", "content": "hi"}]
    r = await _call(backend, "POST", "/tokenize", {"model": "demo-tiny", "messages": messages})
    rendered = served.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert r.status_code == 200 and r.json()["tokens"] == served.tokenizer.encode(rendered)
    assert r.json()["count"] > len(served.tokenizer.encode("hi"))  # the template's own tokens are counted


async def test_bad_tokenize_requests_are_clear_400s_and_404s(backend):  # noqa: F811
    neither = await _call(backend, "POST", "/tokenize", {"model": "demo-tiny"})
    assert neither.status_code == 400 and neither.json()["error"]["param"] == "prompt"
    unknown = await _call(backend, "POST", "/tokenize", {"model": "nope", "prompt": "x"})
    assert unknown.status_code == 404
    outside = await _call(backend, "POST", "/detokenize", {"model": "demo-tiny", "tokens": [1, 10**9]})
    assert outside.status_code == 400 and outside.json()["error"]["param"] == "tokens"
    assert not backend.submitted  # nothing reached the bus


async def test_version_names_the_installed_package(backend):  # noqa: F811
    from importlib.metadata import version

    r = await _call(backend, "GET", "/version")
    assert r.status_code == 200 and r.json() == {"version": version("janus-serving")}


async def test_an_unknown_route_is_a_404_that_says_so(backend):  # noqa: F811
    r = await _call(backend, "GET", "/v1/embeddingz")
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "not_found" and "/v1/embeddingz" in r.json()["error"]["message"]

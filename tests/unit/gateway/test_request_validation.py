"""Every engine-level parameter is checked at the gateway: a 400 with `param`, never a request that reaches (and
fails) an engine. Text that no tokenizer can hold (a lone surrogate) is a 400 too, any unexpected error is a JSON
500, and the OpenAPI document lists the error responses.

The app runs with the real demo tokenizer; the backend stands in for the bus (two tokens and done), which the
refused requests never reach: `submitted` says whether one did."""
from __future__ import annotations

from dataclasses import dataclass, field

import httpx
import pytest

from contracts.requests import MAX_STOP_STRING_CHARS, MAX_STOP_TOKEN_IDS
from gateway.app import create_app
from gateway.core.admission import ServedModel
from tests.unit.gateway.test_retry_after import FakeBackend


@dataclass
class Backend(FakeBackend):
    """FakeBackend (two tokens and done) serving the demo model, recording what reached it."""

    submitted: list = field(default_factory=list)
    fail_with: Exception | None = None

    async def submit(self, request):
        self.submitted.append(request)
        if self.fail_with is not None:
            raise self.fail_with
        async for event in super().submit(request):
            yield event


@pytest.fixture(scope="module")
def served(demo_models_dir) -> ServedModel:
    from runtime.tokenizer import TextTokenizer

    tok = TextTokenizer.from_dir(demo_models_dir / "demo-tiny")
    return ServedModel(name="demo-tiny", max_model_len=256, ttft_slo_ms=500.0, tpot_slo_ms=50.0, tokenizer=tok)


@pytest.fixture
def backend(served) -> Backend:
    return Backend(models={served.name: served})


async def _post(backend: Backend, body: dict | bytes, path: str = "/v1/completions") -> httpx.Response:
    transport = httpx.ASGITransport(app=create_app(backend), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        if isinstance(body, bytes):
            return await client.post(path, content=body, headers={"content-type": "application/json"})
        return await client.post(path, json=body)


BASE = {"model": "demo-tiny", "prompt": "x", "max_tokens": 4}


@pytest.mark.parametrize("extra, param", [
    ({"seed": 2**64}, "seed"),  # the poison seed: torch.Generator.manual_seed refuses it
    ({"seed": -1}, "seed"),
    ({"stop_token_ids": [2**63, -7]}, "stop_token_ids"),
    ({"stop_token_ids": [-7]}, "stop_token_ids"),
    ({"stop_token_ids": [1024]}, "stop_token_ids"),  # demo-tiny's vocabulary is [0, 1024)
    ({"stop_token_ids": [1] * (MAX_STOP_TOKEN_IDS + 1)}, "stop_token_ids"),
    ({"stop": "x" * (MAX_STOP_STRING_CHARS + 1)}, "stop"),
    ({"stop": "x" * 200_000}, "stop"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"top_k": 2**31}, "top_k"),
    ({"temperature": -0.5}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"max_tokens": 10**30}, "max_tokens"),
    ({"prompt": [5, 2**70]}, "prompt"),
])
async def test_engine_parameters_out_of_range_are_a_400_naming_the_field(backend, extra, param):
    r = await _post(backend, {**BASE, **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"]
    assert backend.submitted == []


@pytest.mark.parametrize("extra", [
    {"seed": 2**64 - 1}, {"seed": 0}, {"stop_token_ids": [0, 1023]}, {"stop": "x" * MAX_STOP_STRING_CHARS},
    {"stop_token_ids": list(range(MAX_STOP_TOKEN_IDS))}, {"top_k": 2**31 - 1},
])
async def test_values_at_the_limits_are_served(backend, extra):
    r = await _post(backend, {**BASE, **extra})
    assert r.status_code == 200, r.text
    (req,) = backend.submitted
    for key, value in extra.items():
        got = getattr(req.sampling, key)
        assert (tuple(value) if isinstance(value, list) else (value,) if key == "stop" else value) == got


async def test_a_nan_temperature_is_a_400(backend):
    r = await _post(backend, b'{"model": "demo-tiny", "prompt": "x", "temperature": NaN}')
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"


@pytest.mark.parametrize("raw, path, param", [
    (b'{"model": "demo-tiny", "prompt": "\\ud800", "max_tokens": 2}', "/v1/completions", "prompt"),
    (b'{"model": "demo-tiny", "prompt": ["ok", "\\udfff"], "max_tokens": 2}', "/v1/completions", "prompt"),
    (b'{"model": "demo-tiny", "prompt": "x", "stop": "\\ud800"}', "/v1/completions", "stop"),
    (b'{"model": "demo-\\ud800", "prompt": "x"}', "/v1/completions", "model"),
    (b'{"model": "demo-tiny", "messages": [{"role": "user", "content": "hi \\ud800"}]}', "/v1/chat/completions",
     "messages"),
    (b'{"model": "demo-tiny", "messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud800"}]}]}',
     "/v1/chat/completions", "messages"),
    (b'{"model": "demo-tiny", "prompt": "x", "\\ud800": 1}', "/v1/completions", None),  # in a field name
])
async def test_a_lone_surrogate_is_a_json_400(backend, raw, path, param):
    r = await _post(backend, raw, path)
    assert r.status_code == 400, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error"
    assert "invalid text" in err["message"] or "unicode" in err["message"]
    assert "function-after" not in err["message"]  # the location names fields, not pydantic's union branches
    assert backend.submitted == []


async def test_an_unexpected_error_is_a_json_500(backend):
    backend.fail_with = RuntimeError("a bug")
    r = await _post(backend, BASE)
    assert r.status_code == 500 and r.headers["content-type"].startswith("application/json")
    assert r.json()["error"]["code"] == "internal" and "a bug" not in r.text  # no internals leak


async def test_the_openapi_document_lists_the_error_responses(backend):
    transport = httpx.ASGITransport(app=create_app(backend))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        doc = (await client.get("/openapi.json")).json()
    for path in ("/v1/completions", "/v1/chat/completions"):
        responses = doc["paths"][path]["post"]["responses"]
        assert {"200", "400", "401", "404", "413", "429", "500", "503"} <= set(responses)
        assert "422" not in responses  # validation errors are 400 here, as OpenAI answers
        assert responses["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    seed = doc["components"]["schemas"]["CompletionBody"]["properties"]["seed"]
    assert "2**64" in str(seed)

"""Every 429 and 503 the gateway sends carries Retry-After (whole seconds); the body stays an OpenAI error body.

The app runs on a fake backend (no bus): its submit answers with the error a dispatcher or the gateway's own
service would have sent, so every path to a 503 (refused at submission, failed in the queue, lost dispatchers) and
to a 429 (rate, concurrency) is checked in isolation."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import httpx
import pytest

from contracts import ErrorCode, ErrorInfo, RequestDone, RequestFailed, TokenChunk
from contracts.limits import TenantLimits
from gateway.app import create_app
from gateway.core.admission import ServedModel
from gateway.core.errors import (
    DEFAULT_RETRY_AFTER_S,
    MAX_RETRY_AFTER_S,
    ApiError,
    retry_after_for_model,
    retry_after_header,
)
from gateway.core.limits import TenantLimiter


class _Tokenizer:
    vocab_size = 100

    def encode(self, text: str) -> list[int]:
        return [ord(c) % self.vocab_size for c in text] or [1]

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        return "".join(m["content"] for m in messages)


def _model(name: str, ttft_slo_ms: float) -> ServedModel:
    return ServedModel(name=name, max_model_len=64, ttft_slo_ms=ttft_slo_ms, tpot_slo_ms=50.0,
                       tokenizer=_Tokenizer())


@dataclass
class FakeBackend:
    """Answers every request with `error` (None: two tokens and done)."""

    error: ErrorInfo | None = None
    gateway_id: str = "gw"
    models: dict[str, ServedModel] = field(default_factory=lambda: {
        "fast": _model("fast", 300.0), "slow": _model("slow", 4200.0), "huge": _model("huge", 10 * 60_000.0)})
    api_keys: dict[str, str] = field(default_factory=dict)
    max_request_bytes: int = 1 << 20
    limiter: TenantLimiter = field(default_factory=TenantLimiter)

    def reply_subject(self, request_id: str) -> str:
        return f"janus.reply.gw.{request_id}"

    async def submit(self, request):
        if self.error is not None:
            yield RequestFailed(request_id=request.request_id, seq=0, error=self.error)
            return
        yield TokenChunk(request_id=request.request_id, seq=0, token_ids=(5,), text="a", emitted_unix_ms=0.0)
        yield RequestDone(request_id=request.request_id, seq=1, finish_reason="length", num_prompt_tokens=2,
                          num_output_tokens=1)

    def current_traceparent(self) -> str:
        return ""

    def start_request_span(self, name: str):
        return contextlib.nullcontext()

    def status_snapshot(self) -> dict:
        return {}


@contextlib.asynccontextmanager
async def _client(backend: FakeBackend):
    transport = httpx.ASGITransport(app=create_app(backend))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        yield client


def _assert_openai_error(r: httpx.Response, status: int, code: str, kind: str) -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == code and body["error"]["type"] == kind and body["error"]["message"]


def _retry_after(r: httpx.Response) -> int:
    value = r.headers.get("retry-after")
    assert value is not None, f"{r.status_code} without Retry-After: {dict(r.headers)}"
    assert value.isdigit(), value  # integer seconds (RFC 9110 delay-seconds), never a float or a date
    return int(value)


@pytest.mark.parametrize("code,kind", [
    (ErrorCode.OVERLOADED, "overloaded_error"),
    (ErrorCode.NO_INSTANCE, "overloaded_error"),
    (ErrorCode.UNAVAILABLE, "service_unavailable_error"),
])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_every_503_carries_retry_after_of_one_ttft_slo(code, kind, stream, path):
    backend = FakeBackend(error=ErrorInfo(code=code, message="no room", retryable=True))
    body = {"model": "slow", "max_tokens": 2, "stream": stream}
    body |= {"prompt": [3, 4]} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "hi"}]}
    async with _client(backend) as client:
        r = await client.post(path, json=body)
    _assert_openai_error(r, 503, code.value, kind)
    assert _retry_after(r) == 5  # 4.2 s TTFT SLO, rounded up to whole seconds


async def test_retry_after_has_a_floor_of_one_second_and_a_ceiling():
    async with _client(FakeBackend(error=ErrorInfo(code=ErrorCode.OVERLOADED, message="full"))) as client:
        fast = await client.post("/v1/completions", json={"model": "fast", "prompt": [3], "max_tokens": 1})
        huge = await client.post("/v1/completions", json={"model": "huge", "prompt": [3], "max_tokens": 1})
    assert _retry_after(fast) == 1  # a 300 ms SLO still says 1 s: Retry-After has whole seconds only
    assert _retry_after(huge) == MAX_RETRY_AFTER_S


async def test_429_for_a_rate_says_when_the_bucket_refills():
    limiter = TenantLimiter(default=TenantLimits(rate_rps=0.25, burst=1))
    async with _client(FakeBackend(limiter=limiter)) as client:
        ok = await client.post("/v1/completions", json={"model": "fast", "prompt": [3], "max_tokens": 1})
        refused = await client.post("/v1/completions", json={"model": "fast", "prompt": [3], "max_tokens": 1})
    assert ok.status_code == 200 and "retry-after" not in ok.headers
    _assert_openai_error(refused, 429, "rate_limited", "rate_limit_error")
    assert 3 <= _retry_after(refused) <= 4  # one request every 4 s; a moment of it has passed


async def test_429_for_concurrency_says_the_default():
    limiter = TenantLimiter(default=TenantLimits(max_concurrency=1))
    limiter.try_acquire("default", 0.0)  # one request in flight already
    async with _client(FakeBackend(limiter=limiter)) as client:
        refused = await client.post("/v1/completions", json={"model": "fast", "prompt": [3], "max_tokens": 1})
    _assert_openai_error(refused, 429, "rate_limited", "rate_limit_error")
    assert _retry_after(refused) == DEFAULT_RETRY_AFTER_S


@pytest.mark.parametrize("code,status", [
    (ErrorCode.TIMEOUT, 504), (ErrorCode.INSTANCE_FAILED, 502), (ErrorCode.INTERNAL, 500)])
async def test_other_errors_have_no_retry_after(code, status):
    async with _client(FakeBackend(error=ErrorInfo(code=code, message="x"))) as client:
        r = await client.post("/v1/completions", json={"model": "fast", "prompt": [3], "max_tokens": 1})
        bad = await client.post("/v1/completions", json={"model": "nope", "prompt": [3], "max_tokens": 1})
    assert r.status_code == status and "retry-after" not in r.headers
    assert bad.status_code == 404 and "retry-after" not in bad.headers


@pytest.mark.parametrize("seconds,header", [
    (None, "1"), (0.0, "1"), (0.2, "1"), (1.0, "1"), (1.01, "2"), (2.0, "2"), (59.5, "60"), (1e9, "60"),
    (float("inf"), "1"), (float("nan"), "1")])
def test_retry_after_header_is_whole_seconds_rounded_up_and_bounded(seconds, header):
    assert retry_after_header(seconds) == header


def test_api_error_headers_only_for_429_and_503():
    assert ApiError(ErrorCode.OVERLOADED, "x", retry_after_s=retry_after_for_model(2000.0)).headers() == {
        "Retry-After": "2"}
    assert ApiError(ErrorCode.RATE_LIMITED, "x").headers() == {"Retry-After": str(DEFAULT_RETRY_AFTER_S)}
    assert ApiError(ErrorCode.INVALID_REQUEST, "x", retry_after_s=5).headers() == {}


def test_limiter_retry_after_follows_the_bucket():
    lim = TenantLimiter(default=TenantLimits(rate_rps=2, burst=1))
    assert lim.try_acquire("t", 10.0) is None
    assert lim.try_acquire("t", 10.1) is not None
    assert lim.retry_after_s("t") == pytest.approx(0.4)  # 0.2 of a token back after 0.1 s at 2/s
    assert TenantLimiter().retry_after_s("t") is None  # unlimited: nothing to wait for

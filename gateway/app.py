"""The OpenAI-compatible HTTP API (FastAPI). It validates and admits; the backend (the service) moves requests."""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import AsyncIterator, Protocol

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from contracts import ErrorCode, GenerateRequest, RequestDone, RequestFailed, TokenChunk
from runtime.metrics import REGISTRY

from .core.admission import Envelope, ServedModel, admit_chat, admit_completion
from .core.api import ChatBody, CompletionBody, field_of
from .core.errors import ApiError, error_body, retry_after_for_model, retry_headers
from .core.limits import TenantLimiter
from .core.responses import Completion, chunk_body, final_body, usage_chunk

Event = TokenChunk | RequestDone | RequestFailed
STATUS_PAGE = Path(__file__).with_name("status_page.html")


class Backend(Protocol):
    gateway_id: str
    models: dict[str, ServedModel]
    api_keys: dict[str, str]
    max_request_bytes: int
    limiter: TenantLimiter

    def reply_subject(self, request_id: str) -> str: ...

    def submit(self, request: GenerateRequest) -> AsyncIterator[Event]: ...

    def current_traceparent(self) -> str: ...

    def start_request_span(self, name: str): ...

    def status_snapshot(self) -> dict: ...


def _tenant(backend: Backend, request: Request) -> str:
    if not backend.api_keys:
        return "default"
    auth = request.headers.get("authorization", "")
    key = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
    tenant = backend.api_keys.get(key)
    if tenant is None:
        raise ApiError(ErrorCode.UNAUTHORIZED, "a valid API key is required (Authorization: Bearer <key>)")
    return tenant


def _model(backend: Backend, name: str) -> ServedModel:
    model = backend.models.get(name)
    if model is None:
        known = ", ".join(sorted(backend.models)) or "none"
        raise ApiError(ErrorCode.UNKNOWN_MODEL, f"the model '{name}' does not exist (served: {known})", "model")
    return model


def _sse(obj: dict | str) -> bytes:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, separators=(',', ':'))}\n\n".encode()


def create_app(backend: Backend) -> FastAPI:
    app = FastAPI(title="Janus", version="0.1.0",
                  description="OpenAI-compatible multi-LLM serving (steady + elastic pools, LST-IMH dispatch)")

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers())

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errs = exc.errors()
        first = errs[0] if errs else {"loc": (), "msg": "invalid request"}
        if first.get("type") == "json_invalid":
            return JSONResponse(error_body(ErrorCode.INVALID_REQUEST, "the body is not valid JSON"), 400)
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        msg = f"{where}: {first.get('msg')}" if where else str(first.get("msg"))
        if len(errs) > 1:
            msg += f" (and {len(errs) - 1} more)"
        return JSONResponse(error_body(ErrorCode.INVALID_REQUEST, msg, field_of(tuple(first.get("loc", ())))), 400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = ErrorCode.UNKNOWN_MODEL if exc.status_code == 404 else ErrorCode.INVALID_REQUEST
        return JSONResponse(error_body(code, str(exc.detail)), exc.status_code,
                            headers=retry_headers(exc.status_code))

    @app.middleware("http")
    async def _limit_size(request: Request, call_next):
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > backend.max_request_bytes:
            return JSONResponse(error_body(ErrorCode.PAYLOAD_TOO_LARGE,
                                           f"the body has {length} bytes; at most {backend.max_request_bytes}"), 413)
        return await call_next(request)

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    @app.get("/status", include_in_schema=False)
    async def status_page() -> Response:
        return Response(STATUS_PAGE.read_bytes(), media_type="text/html; charset=utf-8")

    @app.get("/status.json", include_in_schema=False)
    async def status_json() -> dict:
        return backend.status_snapshot()

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "gateway": backend.gateway_id, "models": sorted(backend.models)}

    @app.get("/v1/models")
    async def list_models(request: Request) -> dict:
        _tenant(backend, request)
        return {"object": "list", "data": [
            {"id": m.name, "object": "model", "created": 0, "owned_by": "janus", "max_model_len": m.max_model_len}
            for m in backend.models.values()]}

    @app.post("/v1/completions")
    async def completions(body: CompletionBody, request: Request):
        tenant = _tenant(backend, request)
        model = _model(backend, body.model)
        with backend.start_request_span("gateway completions"):
            req = admit_completion(body, model, _envelope(backend, tenant))
            return await _admitted(backend, request, model, req, "completion", body.stream, _usage_wanted(body),
                                   bool(body.logprobs))

    @app.post("/v1/chat/completions")
    async def chat(body: ChatBody, request: Request):
        tenant = _tenant(backend, request)
        model = _model(backend, body.model)
        with backend.start_request_span("gateway chat.completions"):
            req = admit_chat(body, model, _envelope(backend, tenant))
            return await _admitted(backend, request, model, req, "chat", body.stream, _usage_wanted(body),
                                   body.logprobs)

    return app


def _usage_wanted(body: CompletionBody | ChatBody) -> bool:
    return bool(body.stream_options and body.stream_options.include_usage)


def _envelope(backend: Backend, tenant: str) -> Envelope:
    request_id = uuid.uuid4().hex
    return Envelope(request_id=request_id, tenant=tenant, now_unix_ms=time.time() * 1000.0,
                    reply_subject=backend.reply_subject(request_id), traceparent=backend.current_traceparent())


async def _admitted(backend: Backend, request: Request, model: ServedModel, req: GenerateRequest, kind: str,
                    stream: bool, include_usage: bool, want_logprobs: bool):
    """Hold a tenant slot (rate and concurrency) for as long as the request runs, streams included. A refusal
    (429) or a failure before the first byte that means "not now" (503) tells the client when to come back
    (Retry-After: docs/operations.md)."""
    refusal = backend.limiter.try_acquire(req.tenant, time.monotonic())
    if refusal is not None:
        raise ApiError(ErrorCode.RATE_LIMITED, refusal, retry_after_s=backend.limiter.retry_after_s(req.tenant))
    releases = [lambda: backend.limiter.release(req.tenant)]
    try:
        return await _respond(backend, request, req, kind, stream, include_usage, want_logprobs, releases)
    except ApiError as exc:
        if exc.retry_after_s is None:
            exc.retry_after_s = retry_after_for_model(model.ttft_slo_ms)
        raise
    finally:
        for release in releases:  # emptied by a stream, which releases when it ends
            release()


async def _respond(backend: Backend, request: Request, req: GenerateRequest, kind: str, stream: bool,
                   include_usage: bool, want_logprobs: bool, releases: list):
    completion = Completion(request_id=req.request_id, model=req.model, created_s=int(time.time()), kind=kind,
                            num_prompt_tokens=req.num_prompt_tokens)
    events = backend.submit(req)
    if stream:
        first = await _first_event(events)  # errors before the first token become a plain HTTP error
        on_end = releases.pop()
        return StreamingResponse(_stream(first, events, completion, include_usage, want_logprobs, on_end),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    collect = asyncio.ensure_future(_collect(events, completion))
    watch = asyncio.ensure_future(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({collect, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if collect not in done:
        collect.cancel()  # the client left: closing the event stream cancels the work
        return JSONResponse(error_body(ErrorCode.CANCELLED, "client disconnected"), 499)
    collect.result()
    return JSONResponse(final_body(completion, want_logprobs=want_logprobs))


async def _wait_disconnect(request: Request) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(0.25)


async def _first_event(events: AsyncIterator[Event]) -> Event:
    ev = await events.__anext__()
    if isinstance(ev, RequestFailed):
        raise ApiError.from_info(ev.error)
    return ev


def _apply(completion: Completion, ev: TokenChunk) -> None:
    completion.text_parts.append(ev.text)
    completion.token_ids.extend(ev.token_ids)
    if ev.logprobs:
        completion.logprobs.extend(ev.logprobs)


async def _collect(events: AsyncIterator[Event], completion: Completion) -> None:
    async for ev in events:
        if isinstance(ev, TokenChunk):
            _apply(completion, ev)
        elif isinstance(ev, RequestDone):
            completion.finish_reason = ev.finish_reason
        else:
            raise ApiError.from_info(ev.error)


async def _stream(first: Event, events: AsyncIterator[Event], completion: Completion, include_usage: bool,
                  want_logprobs: bool, on_end) -> AsyncIterator[bytes]:
    is_first = True
    # a token that ends inside a multi-byte character has no text yet: its chunk is held back, and its logprob
    # rides on the next chunk sent (clients count tokens by logprobs; none may be lost)
    held_logprobs: list[float] = []

    async def chain() -> AsyncIterator[Event]:
        yield first
        async for ev in events:
            yield ev

    def take_held(extra: tuple[float, ...] | None = None) -> list[float] | None:
        if not want_logprobs:
            return None
        out = held_logprobs + list(extra or ())
        held_logprobs.clear()
        return out or None

    try:
        async for ev in chain():
            if isinstance(ev, TokenChunk):
                _apply(completion, ev)
                if ev.text or is_first:
                    yield _sse(chunk_body(completion, ev.text, is_first=is_first, logprobs=take_held(ev.logprobs)))
                    is_first = False
                elif want_logprobs and ev.logprobs:
                    held_logprobs.extend(ev.logprobs)
            elif isinstance(ev, RequestDone):
                completion.finish_reason = ev.finish_reason
                yield _sse(chunk_body(completion, "", ev.finish_reason, is_first=is_first, logprobs=take_held()))
                if include_usage:
                    yield _sse(usage_chunk(completion))
                yield _sse("[DONE]")
            else:
                yield _sse(ApiError.from_info(ev.error).body())
                yield _sse("[DONE]")
    finally:
        on_end()
        await events.aclose()  # a disconnected client cancels its work

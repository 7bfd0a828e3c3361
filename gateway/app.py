"""The OpenAI-compatible HTTP API (FastAPI). It validates and admits; the backend (the service) moves requests."""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from pathlib import Path
from typing import AsyncIterator, Protocol

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from contracts import ErrorCode, GenerateRequest, RequestDone, RequestFailed, TokenChunk
from runtime.metrics import REGISTRY

from .core.admission import Envelope, ServedModel, admit_chat, admit_completion, tool_plan
from .core.api import ChatBody, CompletionBody, DetokenizeBody, TokenizeBody, field_of
from .core.errors import ApiError, error_body, retry_after_for_model, retry_headers
from .core.limits import TenantLimiter
from .core.readiness import Readiness
from .http_guard import BodyGuard
from .respond import Shape, TokenPieces, respond
from .trace_header import TraceHeader

Event = TokenChunk | RequestDone | RequestFailed
log = logging.getLogger("janus.gateway")


def _janus_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("janus-serving")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


JANUS_VERSION = _janus_version()
_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict"})
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

    def readiness(self) -> Readiness: ...


def _key_of(authorization: str) -> str:
    return authorization[7:].strip() if authorization.lower().startswith("bearer ") else ""


def _is_authorized(backend: Backend, scope: dict) -> bool:
    """Before the body is read (http_guard.BodyGuard): with API keys on, a request without a valid key costs the
    gateway its headers only."""
    if not backend.api_keys:
        return True
    auth = next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"authorization"), "")
    return _key_of(auth) in backend.api_keys


def _tenant(backend: Backend, request: Request) -> str:
    if not backend.api_keys:
        return "default"
    tenant = backend.api_keys.get(_key_of(request.headers.get("authorization", "")))
    if tenant is None:
        raise ApiError(ErrorCode.UNAUTHORIZED, "a valid API key is required (Authorization: Bearer <key>)")
    return tenant


def _model(backend: Backend, name: str) -> ServedModel:
    model = backend.models.get(name)
    if model is None:
        known = ", ".join(sorted(backend.models)) or "none"
        raise ApiError(ErrorCode.UNKNOWN_MODEL, f"the model '{name}' does not exist (served: {known})", "model")
    return model


# what the OpenAPI document lists for the API routes: every error comes as an OpenAI error body
_ERRORS = {400: "invalid request (a field is named in `param`), or the prompt is too long for the model",
           401: "no valid API key (when API keys are configured)", 404: "unknown model",
           408: "the body did not arrive in time", 413: "the body is larger than max_request_bytes",
           429: "the tenant is over its rate or concurrency limit (Retry-After)",
           500: "internal error, or a poison request (it failed on two instances); the message names the request id",
           502: "the instance failed after streaming began", 503: "overloaded or no instance (Retry-After)",
           504: "no answer in time"}


class _ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str


class ErrorResponse(BaseModel):
    error: _ErrorDetail


def _responses(*statuses: int) -> dict:
    return {s: {"model": ErrorResponse, "description": _ERRORS[s]} for s in statuses}


API_ERRORS = _responses(400, 401, 404, 408, 413, 429, 500, 502, 503, 504)


def _without_422(app: FastAPI) -> None:
    """FastAPI documents a 422 on every route with a body; validation errors here are 400 (OpenAI's status)."""
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            doc = build()
            for path in doc.get("paths", {}).values():
                for op in path.values():
                    op.get("responses", {}).pop("422", None)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def create_app(backend: Backend, *, body_timeout_s: float = 30.0) -> FastAPI:
    app = FastAPI(title="Janus", version="0.1.0",
                  description="OpenAI-compatible multi-LLM serving (steady + elastic pools, LST-IMH dispatch)")
    _without_422(app)
    # the key is checked and the body counted before the app reads it (http_guard.py)
    app.add_middleware(BodyGuard, max_request_bytes=backend.max_request_bytes, body_timeout_s=body_timeout_s,
                       authorize=lambda scope: _is_authorized(backend, scope))
    app.add_middleware(TraceHeader)  # outermost: refusals by the guard carry a trace id too (trace_header.py)

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers())

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errs = exc.errors()
        # a union tries every branch: a check of ours ("value_error") says what is wrong better than "not a str"
        first = next((e for e in errs if e.get("type") == "value_error"), errs[0] if errs else
                     {"loc": (), "msg": "invalid request"})
        if first.get("type") == "json_invalid":
            return JSONResponse(error_body(ErrorCode.INVALID_REQUEST, "the body is not valid JSON"), 400)
        # a union's branch tags ("str", "function-after[_utf8(), str]") are not fields: left out of the message
        where = ".".join(str(p) for p in first.get("loc", ())
                         if p != "body" and not (isinstance(p, str) and ("[" in p or p in _TYPE_TAGS)))
        msg = f"{where}: {first.get('msg')}" if where else str(first.get("msg"))
        if len(errs) > 1:
            msg += f" (and {len(errs) - 1} more)"
        return JSONResponse(error_body(ErrorCode.INVALID_REQUEST, msg, field_of(tuple(first.get("loc", ())))), 400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # raised by the router: a 404 here is a path no route serves (an unknown model is an ApiError)
        if exc.status_code == 404:
            return JSONResponse(error_body(ErrorCode.NOT_FOUND, f"no route {request.method} {request.url.path}"), 404)
        return JSONResponse(error_body(ErrorCode.INVALID_REQUEST, str(exc.detail)), exc.status_code,
                            headers=retry_headers(exc.status_code))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # a bug must still answer as the API does (a JSON error body), never as a plain-text 500
        log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
        return JSONResponse(error_body(ErrorCode.INTERNAL, f"internal error ({type(exc).__name__})"), 500)

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
        """Liveness: the process serves HTTP. Restart it when this fails; route traffic by /ready."""
        return {"status": "ok", "gateway": backend.gateway_id, "models": sorted(backend.models)}

    @app.get("/ready")
    async def ready() -> JSONResponse:
        """Readiness: 503 while requests could not be served (no NATS connection, no dispatcher answering)."""
        state = backend.readiness()
        if state.is_ready:
            return JSONResponse({"status": "ready", "gateway": backend.gateway_id, "detail": state.reason})
        return JSONResponse(error_body(ErrorCode.UNAVAILABLE, f"not ready: {state.reason}"), 503,
                            headers=retry_headers(503, 1.0))

    @app.get("/v1/models", responses=_responses(401, 500))
    async def list_models(request: Request) -> dict:
        _tenant(backend, request)
        return {"object": "list", "data": [
            {"id": m.name, "object": "model", "created": 0, "owned_by": "janus", "max_model_len": m.max_model_len}
            for m in backend.models.values()]}

    @app.post("/tokenize", responses=_responses(400, 401, 404, 500))
    async def tokenize(body: TokenizeBody, request: Request) -> dict:
        """vLLM's: the prompt's token ids (chat messages through the model's template), the count and the limit."""
        _tenant(backend, request)
        model = _model(backend, body.model)
        if (body.prompt is None) == (body.messages is None):
            raise ApiError(ErrorCode.INVALID_REQUEST, "give either prompt or messages", "prompt")
        tok = model.tokenizer
        if body.messages is not None:
            text = tok.apply_chat_template([{"role": m.role, "content": m.text()} for m in body.messages],
                                           add_generation_prompt=body.add_generation_prompt)
        else:
            text = body.prompt
        ids = await asyncio.to_thread(tok.encode, text)
        return {"count": len(ids), "max_model_len": model.max_model_len, "tokens": ids}

    @app.post("/detokenize", responses=_responses(400, 401, 404, 500))
    async def detokenize(body: DetokenizeBody, request: Request) -> dict:
        _tenant(backend, request)
        model = _model(backend, body.model)
        bad = next((t for t in body.tokens if not 0 <= t < model.tokenizer.vocab_size), None)
        if bad is not None:
            raise ApiError(ErrorCode.INVALID_REQUEST, f"token id {bad} is outside the vocabulary of {model.name} "
                           f"(size {model.tokenizer.vocab_size})", "tokens")
        return {"prompt": model.tokenizer.decode(body.tokens)}

    @app.get("/version")
    async def version() -> dict:
        return {"version": JANUS_VERSION}

    @app.post("/v1/completions", responses=API_ERRORS)
    async def completions(body: CompletionBody, request: Request):
        tenant = _tenant(backend, request)
        model = _model(backend, body.model)
        with backend.start_request_span("gateway completions"):
            # tokenising a large prompt takes a while: off the event loop, which serves every other request
            reqs = await asyncio.to_thread(admit_completion, body, model, _envelope(backend, tenant))
            prefixes = await asyncio.to_thread(_echo_prefixes, body, model, reqs) if body.echo else None
            shape = Shape(kind="completion", stream=body.stream, include_usage=_usage_wanted(body), n=body.n,
                          pieces=_token_pieces(model) if body.logprobs is not None else None,
                          with_top=bool(body.logprobs), prefixes=prefixes)
            return _naming_ignored(body, reqs[0], await _admitted(backend, request, model, reqs, shape))

    @app.post("/v1/chat/completions", responses=API_ERRORS)
    async def chat(body: ChatBody, request: Request):
        tenant = _tenant(backend, request)
        model = _model(backend, body.model)
        with backend.start_request_span("gateway chat.completions"):
            plan = tool_plan(body, model)
            req = await asyncio.to_thread(admit_chat, body, model, _envelope(backend, tenant), plan)
            shape = Shape(kind="chat", stream=body.stream, include_usage=_usage_wanted(body), n=body.n,
                          pieces=_token_pieces(model) if body.logprobs else None, tools=plan)
            return _naming_ignored(body, req, await _admitted(backend, request, model, [req], shape))

    return app


def _usage_wanted(body: CompletionBody | ChatBody) -> str | None:
    """None, "final" (a usage chunk before [DONE]) or "continuous" (usage in every chunk too, vLLM's extension)."""
    options = body.stream_options
    if options is None or not (options.include_usage or options.continuous_usage_stats):
        return None
    return "continuous" if options.continuous_usage_stats else "final"


IGNORED_FIELDS_HEADER = "x-janus-ignored-fields"


def _naming_ignored(body: CompletionBody | ChatBody, req: GenerateRequest, response):
    """Say which fields of the body were ignored (unknown to the gateway): in a header and the log."""
    ignored = body.ignored_fields()
    if ignored:
        response.headers[IGNORED_FIELDS_HEADER] = ",".join(ignored)
        log.info("request %s: ignored unknown fields %s", req.request_id, ", ".join(ignored))
    return response


def _envelope(backend: Backend, tenant: str) -> Envelope:
    request_id = uuid.uuid4().hex
    return Envelope(request_id=request_id, tenant=tenant, now_unix_ms=time.time() * 1000.0,
                    reply_subject=backend.reply_subject(request_id), traceparent=backend.current_traceparent(),
                    reply_subject_of=backend.reply_subject)


async def _admitted(backend: Backend, request: Request, model: ServedModel, requests: list[GenerateRequest],
                    shape: Shape):
    """Hold a tenant slot (rate and concurrency) for as long as the request runs, streams included. A refusal
    (429) or a failure before the first byte that means "not now" (503) tells the client when to come back
    (Retry-After: docs/operations.md)."""
    tenant = requests[0].tenant
    refusal = backend.limiter.try_acquire(tenant, time.monotonic())
    if refusal is not None:
        raise ApiError(ErrorCode.RATE_LIMITED, refusal, retry_after_s=backend.limiter.retry_after_s(tenant))
    releases = [lambda: backend.limiter.release(tenant)]
    try:
        return await respond(request, requests, backend.submit, shape, releases)
    except ApiError as exc:
        if exc.retry_after_s is None:
            exc.retry_after_s = retry_after_for_model(model.ttft_slo_ms)
        raise
    finally:
        for release in releases:  # emptied by a stream, which releases when it ends
            release()


def _token_pieces(model: ServedModel) -> TokenPieces:
    piece = getattr(model.tokenizer, "token_piece", None)
    return piece if piece is not None else (lambda token_id: ("", b""))


def _echo_prefixes(body: CompletionBody, model: ServedModel, requests: list[GenerateRequest]) -> tuple[str, ...]:
    """The prompts' own text (a token-id prompt: its decoding)."""
    p = body.prompt
    prompts = [p] if isinstance(p, str) or (p and isinstance(p[0], int)) else list(p)
    return tuple(p if isinstance(p, str) else model.tokenizer.decode(list(r.prompt_token_ids))
                 for p, r in zip(prompts, requests))

"""The gateway's trace header middleware (gateway/trace_header.py) on a real ASGI app: the trace id in
`x-janus-trace-id`, a caller's `traceparent` continued, the route's spans under the request's, probes untraced."""
from __future__ import annotations

import httpx
from starlette.applications import Starlette
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

from gateway.trace_header import TRACE_ID_HEADER, TraceHeader
from runtime import tracing

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def app() -> TraceHeader:
    async def chat(request):
        with tracing.tracer("test").start_as_current_span("route span"):
            return JSONResponse({"trace": tracing.current_trace_id()})

    async def stream(request):
        async def body():
            for i in range(3):
                yield f"chunk {i}\n"
        return StreamingResponse(body())

    async def fails(request):
        return PlainTextResponse("no", status_code=503)

    async def health(request):
        return JSONResponse({"status": "ok"})

    return TraceHeader(Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                                         Route("/v1/stream", stream), Route("/v1/fails", fails),
                                         Route("/health", health)]))


async def get(path: str, method: str = "GET", **kwargs) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app()), base_url="http://gw") as client:
        return await client.request(method, path, **kwargs)


async def test_the_response_names_the_trace_of_the_routes_spans(span_exporter):
    answer = await get("/v1/chat/completions", "POST")
    trace_id = answer.headers[TRACE_ID_HEADER]
    assert len(trace_id) == 32 and answer.json() == {"trace": trace_id}
    spans = {s.name: s for s in span_exporter.get_finished_spans()
             if format(s.context.trace_id, "032x") == trace_id}
    root, child = spans["gateway POST /v1/chat/completions"], spans["route span"]
    assert root.parent is None and child.parent.span_id == root.context.span_id
    assert root.attributes["http.status_code"] == 200


async def test_a_callers_traceparent_is_continued(span_exporter):
    answer = await get("/v1/chat/completions", "POST",
                       headers={"traceparent": f"00-{CALLER_TRACE}-00f067aa0ba902b7-01"})
    assert answer.headers[TRACE_ID_HEADER] == CALLER_TRACE == answer.json()["trace"]
    # a malformed one starts a trace of its own
    fresh = await get("/v1/chat/completions", "POST", headers={"traceparent": "00-nonsense-01"})
    assert len(fresh.headers[TRACE_ID_HEADER]) == 32 and fresh.headers[TRACE_ID_HEADER] != CALLER_TRACE


async def test_streams_and_errors_carry_it_and_probes_do_not(span_exporter):
    stream = await get("/v1/stream")
    assert stream.text == "chunk 0\nchunk 1\nchunk 2\n" and len(stream.headers[TRACE_ID_HEADER]) == 32
    failed = await get("/v1/fails")
    trace_id = failed.headers[TRACE_ID_HEADER]
    (span,) = [s for s in span_exporter.get_finished_spans() if format(s.context.trace_id, "032x") == trace_id]
    assert span.status.status_code.name == "ERROR" and span.attributes["http.status_code"] == 503
    assert TRACE_ID_HEADER not in (await get("/health")).headers


async def test_on_fastapi_the_header_names_the_frameworks_server_span(span_exporter):
    """FastAPI's native telemetry (when it has it) makes the server span and continues a traceparent: the header
    names that trace, and the route's spans are in it."""
    from fastapi import FastAPI

    api = FastAPI()
    api.add_middleware(TraceHeader)

    @api.post("/v1/completions")
    async def completions():
        with tracing.tracer("test").start_as_current_span("route span"):
            return {"trace": tracing.current_trace_id()}

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://gw") as client:
        plain = await client.post("/v1/completions")
        continued = await client.post("/v1/completions",
                                      headers={"traceparent": f"00-{CALLER_TRACE}-00f067aa0ba902b7-01"})
    assert plain.headers[TRACE_ID_HEADER] == plain.json()["trace"] != CALLER_TRACE
    assert continued.headers[TRACE_ID_HEADER] == continued.json()["trace"] == CALLER_TRACE
    names = [s.name for s in span_exporter.get_finished_spans()
             if format(s.context.trace_id, "032x") == plain.headers[TRACE_ID_HEADER]]
    assert "route span" in names and sum("POST /v1/completions" in n for n in names) == 1  # one server span

"""Each API request's trace: continued from the caller's W3C `traceparent` when it sends one, started here when not,
and named in the `x-janus-trace-id` response header, which `janus trace ID` takes (docs/operations.md, "Following a
request"). The request's server span covers it whole, a stream to its last byte; the route's spans are its children.

FastAPI >= 0.16x makes that server span itself (its native telemetry, outside every middleware, honouring
`traceparent` through the global propagator runtime/tracing.py installs): then only the header is added here. An
older FastAPI makes none, and this middleware makes it. Probes and scrapes (/health, /ready, /metrics, /status) get
no span of ours: they would fill the span files.
"""
from __future__ import annotations

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from runtime import tracing

TRACE_ID_HEADER = "x-janus-trace-id"
TRACED_PREFIXES = ("/v1/", "/tokenize", "/detokenize")


class TraceHeader:
    """Pure ASGI (no BaseHTTPMiddleware): a streamed body passes through untouched, in the request's own task."""

    def __init__(self, app, tracer_name: str = "janus.gateway"):
        self.app = app
        self._tracer = tracing.tracer(tracer_name)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or not scope.get("path", "").startswith(TRACED_PREFIXES):
            await self.app(scope, receive, send)
            return
        framework_span = trace.get_current_span()
        if framework_span.is_recording():  # the framework's server span: it is the request's
            await self.app(scope, receive, _with_trace_id(send, framework_span))
            return
        traceparent = next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"traceparent"), None)
        parent = tracing.context_from_traceparent(traceparent)  # None: a malformed one starts a new trace too
        name = f"gateway {scope.get('method', 'HTTP')} {scope['path']}"
        with self._tracer.start_as_current_span(name, context=parent, kind=SpanKind.SERVER) as span:
            await self.app(scope, receive, _with_trace_id(send, span, mark_status=True))


def _with_trace_id(send, span: trace.Span, *, mark_status: bool = False):
    ctx = span.get_span_context()
    header = (TRACE_ID_HEADER.encode(), format(ctx.trace_id, "032x").encode()) if ctx.is_valid else None

    async def send_with_trace_id(message) -> None:
        if message["type"] == "http.response.start":
            if mark_status:
                status = message.get("status", 200)
                span.set_attribute("http.status_code", status)
                if status >= 500:
                    span.set_status(Status(StatusCode.ERROR))
            if header is not None:
                message = {**message, "headers": [*message.get("headers", ()), header]}
        await send(message)

    return send_with_trace_id

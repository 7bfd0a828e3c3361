"""OpenTelemetry set-up and W3C trace-context propagation through NATS headers.

One tracer provider per process: OTLP/HTTP export when OTEL_EXPORTER_OTLP_ENDPOINT is set; JSON lines under
JANUS_TRACE_DIR when that is set (runtime/trace_file.py: `janus up` sets it unless an OTLP endpoint is, so
`janus trace ID` can show a request); nothing exported otherwise (spans still carry trace ids, so context still
flows); an in-memory exporter when a test asks for one. Log lines made inside a span carry its trace id.
"""
from __future__ import annotations

import logging
import os
from typing import Mapping

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import set_global_textmap
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .trace_file import file_exporter_from_env

_PROPAGATOR = TraceContextTextMapPropagator()
_configured = False
# the file exporter's batches: often enough that `janus trace` right after a request finds it, rarely enough that a
# busy process writes in batches, off the event loop (the processor's own thread)
FILE_EXPORT_DELAY_MS = 300


def setup_tracing(service_name: str, exporter: SpanExporter | None = None, *, instance: str | None = None
                  ) -> TracerProvider:
    """Install the process's tracer provider once; later calls may only add an exporter (tests do). `instance`
    names the process's span file (default: its pid)."""
    global _configured
    provider = trace.get_tracer_provider()
    if not _configured or not isinstance(provider, TracerProvider):
        provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        endpoint = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        if endpoint:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        to_file = file_exporter_from_env(service_name, instance or str(os.getpid()))
        if to_file is not None:
            provider.add_span_processor(BatchSpanProcessor(to_file, schedule_delay_millis=FILE_EXPORT_DELAY_MS))
        trace.set_tracer_provider(provider)
        set_global_textmap(_PROPAGATOR)
        _configured = True
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)


def inject_headers(headers: dict[str, str] | None = None) -> dict[str, str]:
    """The current span's context as NATS headers (`traceparent`, `tracestate`)."""
    carrier = headers if headers is not None else {}
    _PROPAGATOR.inject(carrier)
    return carrier


def extract_context(headers: Mapping[str, str] | None) -> otel_context.Context | None:
    if not headers or "traceparent" not in headers:
        return None
    return _PROPAGATOR.extract(dict(headers))


def context_from_traceparent(traceparent: str | None) -> otel_context.Context | None:
    return extract_context({"traceparent": traceparent} if traceparent else None)


def current_traceparent() -> str | None:
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent")


def current_trace_id() -> str | None:
    """The current span's trace id as 32 hex digits (what `janus trace` takes), None outside a span."""
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else None


def install_log_trace_ids() -> None:
    """Every log record gets `trace_id` (the current span's, or "-") and `trace` (" trace=ID", or ""): the log
    format of runtime/service.py prints it, so `grep ID .janus/logs/*` finds a request's lines in every service."""
    base = logging.getLogRecordFactory()
    if getattr(base, "adds_trace_ids", False):
        return

    def record_with_trace(*args, **kwargs) -> logging.LogRecord:
        record = base(*args, **kwargs)
        trace_id = current_trace_id()
        record.trace_id = trace_id or "-"
        record.trace = f" trace={trace_id}" if trace_id else ""  # formats print nothing outside a request
        return record

    record_with_trace.adds_trace_ids = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(record_with_trace)

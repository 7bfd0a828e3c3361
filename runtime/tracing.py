"""OpenTelemetry set-up and W3C trace-context propagation through NATS headers.

One tracer provider per process: OTLP/HTTP export when OTEL_EXPORTER_OTLP_ENDPOINT is set, nothing exported
otherwise (spans still carry trace ids, so context still flows), an in-memory exporter when a test asks for one.
"""
from __future__ import annotations

import os
from typing import Mapping

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import set_global_textmap
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_PROPAGATOR = TraceContextTextMapPropagator()
_configured = False


def setup_tracing(service_name: str, exporter: SpanExporter | None = None) -> TracerProvider:
    """Install the process's tracer provider once; later calls may only add an exporter (tests do)."""
    global _configured
    provider = trace.get_tracer_provider()
    if not _configured or not isinstance(provider, TracerProvider):
        provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        endpoint = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        if endpoint:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
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

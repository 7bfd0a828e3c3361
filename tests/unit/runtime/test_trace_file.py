"""The local span files (runtime/trace_file.py), their waterfall (runtime/trace_view.py), `janus trace`, and the
trace id in log lines (runtime/tracing.py)."""
from __future__ import annotations

import json
import logging

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from ops.cli import main
from runtime.trace_file import FileSpanExporter, file_exporter_from_env, read_trace, trace_files
from runtime.trace_view import ordered, parse_trace_id, waterfall


def provider_writing_to(path, service: str, max_bytes: int = 1 << 20) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(FileSpanExporter(path, max_bytes)))
    return provider


def a_request(gateway: TracerProvider, worker: TracerProvider) -> str:
    """A gateway span with a child, and a worker span under it (as if the context crossed NATS)."""
    g = gateway.get_tracer("t")
    with g.start_as_current_span("gateway POST /v1/chat/completions") as root:
        with g.start_as_current_span("gateway chat.completions"):
            with worker.get_tracer("t").start_as_current_span("worker generate"):
                pass
    return format(root.get_span_context().trace_id, "032x")


def test_spans_of_two_processes_read_back_as_one_trace(tmp_path):
    gateway = provider_writing_to(tmp_path / "janus-gateway-g1.jsonl", "janus-gateway")
    worker = provider_writing_to(tmp_path / "janus-worker-w1.jsonl", "janus-worker")
    first, second = a_request(gateway, worker), a_request(gateway, worker)
    assert first != second
    spans = read_trace(tmp_path, first)
    assert sorted(s["name"] for s in spans) == ["gateway POST /v1/chat/completions", "gateway chat.completions",
                                                "worker generate"]
    assert {s["service"] for s in spans} == {"janus-gateway", "janus-worker"}
    depth = {s["name"]: d for d, s in ordered(spans)}
    assert depth == {"gateway POST /v1/chat/completions": 0, "gateway chat.completions": 1, "worker generate": 2}
    assert all(s["end_unix_ns"] >= s["start_unix_ns"] for s in spans)


def test_a_file_is_bounded_by_rotation(tmp_path):
    max_bytes = 4000
    gateway = provider_writing_to(tmp_path / "janus-gateway-g1.jsonl", "janus-gateway", max_bytes)
    worker = provider_writing_to(tmp_path / "janus-worker-w1.jsonl", "janus-worker", max_bytes)
    ids = [a_request(gateway, worker) for _ in range(100)]
    files = trace_files(tmp_path)
    assert {p.name for p in files} == {"janus-gateway-g1.jsonl", "janus-gateway-g1.jsonl.1",
                                       "janus-worker-w1.jsonl", "janus-worker-w1.jsonl.1"}
    assert all(p.stat().st_size <= max_bytes for p in files)
    assert read_trace(tmp_path, ids[0]) == []  # rotated out
    assert len(read_trace(tmp_path, ids[-1])) == 3  # the newest is kept
    for p in files:  # every line whole
        for line in p.read_text().splitlines():
            json.loads(line)


def test_a_torn_line_is_skipped(tmp_path):
    gateway = provider_writing_to(tmp_path / "janus-gateway-g1.jsonl", "janus-gateway")
    worker = provider_writing_to(tmp_path / "janus-worker-w1.jsonl", "janus-worker")
    trace_id = a_request(gateway, worker)
    with open(tmp_path / "janus-worker-w1.jsonl", "a") as f:
        f.write('{"trace_id": "' + trace_id + '", "span_')  # a process killed mid-write
    assert len(read_trace(tmp_path, trace_id)) == 3


def test_the_environment_turns_the_file_on(tmp_path, monkeypatch):
    monkeypatch.delenv("JANUS_TRACE_DIR", raising=False)
    assert file_exporter_from_env("janus-worker", "w1") is None
    monkeypatch.setenv("JANUS_TRACE_DIR", str(tmp_path / "traces"))
    monkeypatch.setenv("JANUS_TRACE_MAX_BYTES", "12345")
    exporter = file_exporter_from_env("janus-worker", "host/1")
    assert exporter.path == tmp_path / "traces" / "janus-worker-host_1.jsonl" and exporter.max_bytes == 12345
    monkeypatch.setenv("JANUS_TRACE_MAX_BYTES", "lots")
    with pytest.raises(ValueError, match="JANUS_TRACE_MAX_BYTES='lots'"):
        file_exporter_from_env("janus-worker", "w1")


def test_trace_ids_are_parsed_from_the_header_or_a_traceparent():
    tid = "4bf92f3577b34da6a3ce929d0e0e4736"
    assert parse_trace_id(tid.upper()) == tid
    assert parse_trace_id(f"00-{tid}-00f067aa0ba902b7-01") == tid
    for bad in ("", "xyz", "0" * 32, tid[:-1]):
        with pytest.raises(ValueError, match="not a trace id"):
            parse_trace_id(bad)


def span(name: str, span_id: str, parent: str | None, start_ms: float, end_ms: float, service: str) -> dict:
    return {"trace_id": "a" * 32, "span_id": span_id, "parent_id": parent, "name": name, "service": service,
            "start_unix_ns": int(1e15 + start_ms * 1e6), "end_unix_ns": int(1e15 + end_ms * 1e6), "status": "unset"}


def test_the_waterfall_places_each_span_on_the_time_line():
    spans = [span("worker generate", "3", "2", 50.0, 100.0, "janus-worker"),
             span("gateway POST /v1/completions", "1", "caller", 0.0, 100.0, "janus-gateway"),  # parent not here
             span("dispatcher assign", "2", "1", 10.0, 12.0, "janus-dispatcher")]
    lines = waterfall(spans, width=80)
    assert lines[0] == f"trace {'a' * 32}: 3 spans from 3 services over 100.0 ms"
    body = lines[2:]
    assert [line.split("|")[0].split()[0] for line in body] == ["gateway", "dispatcher", "worker"]
    assert body[1].startswith("  dispatcher assign") and body[2].startswith("    worker generate")
    assert all(len(line) == 80 for line in lines[1:])
    bars = [line[line.index("|") + 1:-1] for line in body]
    assert bars[0].strip() == "#" * len(bars[0])  # the whole request
    worker_bar = bars[2]
    assert worker_bar.index("#") == len(worker_bar) // 2 and worker_bar.endswith("#")  # the second half
    assert [line.split("|")[0].split()[-2:] for line in body] == [["0.0", "100.0"], ["10.0", "2.0"], ["50.0", "50.0"]]


def test_janus_trace_prints_the_waterfall_or_says_what_is_missing(tmp_path, capsys):
    gateway = provider_writing_to(tmp_path / "traces" / "janus-gateway-g1.jsonl", "janus-gateway")
    worker = provider_writing_to(tmp_path / "traces" / "janus-worker-w1.jsonl", "janus-worker")
    trace_id = a_request(gateway, worker)
    assert main(["trace", trace_id, "--state-dir", str(tmp_path), "--width", "100"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"trace {trace_id}: 3 spans from 2 services")
    assert main(["trace", "b" * 32, "--state-dir", str(tmp_path)]) == 1
    assert f"no spans of {'b' * 32} in {tmp_path / 'traces'}" in capsys.readouterr().err
    assert main(["trace", "nope"]) == 2
    assert "not a trace id" in capsys.readouterr().err


def test_log_lines_inside_a_span_carry_its_trace_id(caplog):
    from runtime.tracing import install_log_trace_ids

    install_log_trace_ids()
    install_log_trace_ids()  # twice: still one wrapper
    provider = TracerProvider()
    log = logging.getLogger("janus.test-trace-logs")
    with caplog.at_level(logging.INFO, logger="janus.test-trace-logs"):
        log.info("outside")
        with provider.get_tracer("t").start_as_current_span("request") as s:
            log.info("inside")
    outside, inside = caplog.records
    trace_id = format(s.get_span_context().trace_id, "032x")
    assert (outside.trace_id, outside.trace) == ("-", "")
    assert (inside.trace_id, inside.trace) == (trace_id, f" trace={trace_id}")
    formatter = logging.Formatter("%(levelname)s %(name)s%(trace)s: %(message)s")
    assert formatter.format(inside) == f"INFO janus.test-trace-logs trace={trace_id}: inside"

"""Spans to a local file, for following a request without Jaeger (docs/operations.md, "Following a request").

Each process appends its finished spans as JSON lines to its own file, `<dir>/<service>-<instance>.jsonl`: one writer
per file, so lines never interleave and rotation needs no lock. A file past `max_bytes` becomes `<name>.1` (the
previous `.1` is dropped), so a process keeps at most twice `max_bytes` on disk. `janus trace ID` reads them all.
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Iterator, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

TRACE_DIR_ENV = "JANUS_TRACE_DIR"  # set: every process writes its spans under it (janus up sets <state_dir>/traces)
TRACE_MAX_BYTES_ENV = "JANUS_TRACE_MAX_BYTES"
DEFAULT_MAX_BYTES = 8 << 20  # per process, twice that with the rotated file: days of a demo cluster's requests
SUFFIX = ".jsonl"


def span_record(span: ReadableSpan) -> dict:
    """What `janus trace` needs of a span: ids as the W3C hex, times in unix nanoseconds."""
    ctx = span.get_span_context()
    parent = span.parent
    return {"trace_id": format(ctx.trace_id, "032x"), "span_id": format(ctx.span_id, "016x"),
            "parent_id": format(parent.span_id, "016x") if parent is not None else None,
            "service": str(span.resource.attributes.get("service.name", "")), "name": span.name,
            "kind": span.kind.name.lower(), "start_unix_ns": span.start_time, "end_unix_ns": span.end_time,
            "status": span.status.status_code.name.lower(),
            "attributes": {k: v if isinstance(v, (str, int, float, bool)) else str(v)
                           for k, v in (span.attributes or {}).items()}}


class FileSpanExporter(SpanExporter):
    """JSON lines, one span a line, bounded by rotation (one previous file kept)."""

    def __init__(self, path: Path, max_bytes: int = DEFAULT_MAX_BYTES):
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be > 0, got {max_bytes}")
        self.path = Path(path)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()  # the batch processor exports from its thread; force_flush from any
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        data = "".join(json.dumps(span_record(s), separators=(",", ":")) + "\n" for s in spans).encode()
        try:
            with self._lock:
                self._rotate_if_full(len(data))
                with open(self.path, "ab") as out:
                    out.write(data)
        except OSError:  # a full or read-only disk must not take the service down; the spans are lost
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def _rotate_if_full(self, num_new_bytes: int) -> None:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return
        if size and size + num_new_bytes > self.max_bytes:
            os.replace(self.path, self.path.with_name(self.path.name + ".1"))

    def shutdown(self) -> None:
        pass


def file_exporter_from_env(service_name: str, instance: str) -> FileSpanExporter | None:
    """The exporter JANUS_TRACE_DIR asks for (None when unset); JANUS_TRACE_MAX_BYTES bounds each process's file."""
    folder = os.environ.get(TRACE_DIR_ENV, "").strip()
    if not folder:
        return None
    raw = os.environ.get(TRACE_MAX_BYTES_ENV, "").strip()
    try:
        max_bytes = int(raw) if raw else DEFAULT_MAX_BYTES
    except ValueError:
        raise ValueError(f"{TRACE_MAX_BYTES_ENV}={raw!r} is not a number of bytes") from None
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{service_name}-{instance}")
    return FileSpanExporter(Path(folder) / f"{safe}{SUFFIX}", max_bytes)


def trace_files(folder: Path) -> list[Path]:
    """Every span file of a trace folder, rotated ones included."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.name.endswith(SUFFIX) or p.name.endswith(SUFFIX + ".1"))


def read_trace(folder: Path, trace_id: str) -> list[dict]:
    """The spans of one trace from every file under `folder` (a line cut short by a crash is skipped)."""
    spans = []
    for path in trace_files(folder):
        for line in _lines(path):
            if trace_id not in line:  # cheap: most lines are other requests'
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record.get("trace_id") == trace_id:
                spans.append(record)
    return spans


def _lines(path: Path) -> Iterator[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            yield from f
    except FileNotFoundError:  # rotated away while we listed
        return

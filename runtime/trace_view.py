"""`janus trace ID`: one request's spans as a waterfall (pure formatting of runtime/trace_file.py's records).

Spans are shown as a tree (a child under its parent, indented, siblings by start time); a span whose parent is not
in the files (its process exported nothing yet, or the caller's own span from a `traceparent`) is a root. Each line:
the span's name, its service, when it started after the trace's first span, how long it took, and a bar on the
trace's time line.
"""
from __future__ import annotations

import re

TRACE_ID = re.compile(r"^[0-9a-f]{32}$")
MIN_BAR_CHARS = 10


def parse_trace_id(text: str) -> str:
    """A trace id as the header `x-janus-trace-id` gives it, or taken out of a `traceparent` (00-ID-SPAN-FLAGS)."""
    text = text.strip().lower()
    parts = text.split("-")
    if len(parts) == 4 and TRACE_ID.match(parts[1]):
        text = parts[1]
    if not TRACE_ID.match(text) or text == "0" * 32:
        raise ValueError(f"{text!r} is not a trace id (32 hex digits, as in the x-janus-trace-id response header)")
    return text


def ordered(spans: list[dict]) -> list[tuple[int, dict]]:
    """(depth, span) in display order: depth first, siblings by start time."""
    ids = {s["span_id"] for s in spans}
    children: dict[str | None, list[dict]] = {}
    for s in spans:
        parent = s.get("parent_id") if s.get("parent_id") in ids else None
        children.setdefault(parent, []).append(s)
    out: list[tuple[int, dict]] = []

    def visit(parent: str | None, depth: int) -> None:
        for s in sorted(children.get(parent, []), key=lambda s: (s["start_unix_ns"], s["name"])):
            out.append((depth, s))
            if s["span_id"] != parent:  # a span naming itself as parent must not loop
                visit(s["span_id"], depth + 1)

    visit(None, 0)
    return out


def waterfall(spans: list[dict], width: int = 100) -> list[str]:
    """The lines `janus trace` prints; `width` is the terminal's (the bar takes what the columns leave)."""
    if not spans:
        return []
    rows = ordered(spans)
    t0 = min(s["start_unix_ns"] for s in spans)
    t1 = max(s["end_unix_ns"] for s in spans)
    total_ns = max(t1 - t0, 1)
    names = ["  " * depth + s["name"] for depth, s in rows]
    services = [s.get("service", "") for _, s in rows]
    name_w = max(len("span"), *(len(n) for n in names))
    service_w = max(len("service"), *(len(v) for v in services))
    fixed = name_w + service_w + 2 * 9 + 4 + 2  # the columns, the four spaces between them, the bar's two '|'
    bar_w = max(MIN_BAR_CHARS, width - fixed)
    lines = [f"trace {spans[0]['trace_id']}: {len(spans)} spans from {len(set(services))} services over "
             f"{total_ns / 1e6:.1f} ms",
             f"{'span':<{name_w}} {'service':<{service_w}} {'start ms':>9} {'dur ms':>9} |{'':<{bar_w}}|"]
    for name, service, (_, s) in zip(names, services, rows):
        start_ns, end_ns = s["start_unix_ns"] - t0, s["end_unix_ns"] - t0
        lo = min(int(start_ns / total_ns * bar_w), bar_w - 1)
        hi = max(lo + 1, round(end_ns / total_ns * bar_w))
        bar = " " * lo + ("#" if s.get("status") != "error" else "!") * (hi - lo)
        lines.append(f"{name:<{name_w}} {service:<{service_w}} {start_ns / 1e6:>9.1f} "
                     f"{(end_ns - start_ns) / 1e6:>9.1f} |{bar:<{bar_w}}|")
    return lines

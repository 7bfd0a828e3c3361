"""`janus status`: devices, resident models and their states, pools, replica counts and queue depths, and which
copy of each planner leads."""
from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
from pathlib import Path

from .cluster_view import ClusterView
from .tools import (EXIT_NO_NATS, NatsTarget, ToolConnectError, connect_tool, nats_target, quiet_connection_warnings,
                    settings_for)

ATTACH_TIMEOUT_S = 5.0  # the registry watch and the stream look-ups: a server that accepts but never answers
# Piped output (no terminal to measure) is not cut to rich's 80 columns: lines as long as the widest table needs.
PIPE_WIDTH_COLUMNS = 240


async def gather(target: NatsTarget, wait_s: float) -> dict:
    bus = await connect_tool("status", target)
    view = ClusterView()
    try:
        try:
            await asyncio.wait_for(view.attach(bus), ATTACH_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise ToolConnectError(f"NATS at {target.url} (from {target.source}) accepted the connection but the "
                                   f"registry did not answer within {ATTACH_TIMEOUT_S:g} s (JetStream down?)") from None
        await asyncio.sleep(wait_s)  # at least two heartbeats and one load window
        return {**view.snapshot(), "leaders": await leaders(bus)}
    finally:
        await view.detach()
        await bus.close()


async def leaders(bus) -> list[dict]:
    """Which copy of each planner holds its lease now (planner/leader.py): [{role, holder}], by role; none while no
    planner has campaigned (no bucket) or every lease has expired."""
    from contracts import subjects

    try:
        kv = await asyncio.wait_for(bus.js.key_value(subjects.LEASES_BUCKET), ATTACH_TIMEOUT_S)
        roles = await asyncio.wait_for(kv.keys(), ATTACH_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - no bucket yet, or no key in it (nats-py raises NoKeysError)
        return []
    out = []
    for role in sorted(roles):
        try:
            entry = await asyncio.wait_for(kv.get(role), ATTACH_TIMEOUT_S)
            holder = json.loads(entry.value or b"{}").get("holder", "?")
        except Exception:  # noqa: BLE001 - expired between the listing and the read
            continue
        out.append({"role": role, "holder": holder})
    return out


def terminal_width_columns() -> int:
    """$COLUMNS, else the terminal's width, else (piped) PIPE_WIDTH_COLUMNS."""
    return shutil.get_terminal_size((PIPE_WIDTH_COLUMNS, 24)).columns


def _table(title: str, columns: tuple[str, ...]):
    from rich.table import Table

    t = Table(title=title)
    for col in columns:  # fold, never cut: a long worker id or model name wraps inside its cell
        t.add_column(col, overflow="fold")
    return t


def render(snap: dict, out=None, width_columns: int | None = None) -> None:
    from rich.console import Console

    console = Console(file=out or sys.stdout, width=width_columns or terminal_width_columns())
    t = _table("devices", ("worker", "device", "pages free / total", "fragmentation", "models (pages)",
                           "heartbeat age s"))
    for d in snap["devices"]:
        used = ", ".join(f"{m}: {sum(k.values())}" for m, k in d["pages_by_model"].items()) or "-"
        t.add_row(d["worker_id"], f"{d['device']} {d['device_name']}", f"{d['pages_free']} / {d['pages_total']}",
                  f"{d['fragmentation']:.1%}", used, str(d["age_s"]))
    console.print(t)
    t = _table("instances", ("model", "worker", "pool", "role", "state", "ready", "waiting", "running",
                             "TTFT p50 ms"))
    for i in snap["instances"]:
        ttft = "-" if i["ttft_ms_p50"] is None else f"{i['ttft_ms_p50']:.1f}"
        t.add_row(i["model"], i["worker_id"], i["pool"], i["role"], i["state"], "yes" if i["is_ready"] else "no",
                  str(i["num_waiting"]), str(i["num_running"]), ttft)
    console.print(t)
    t = _table("models", ("model", "steady", "elastic", "ready", "rate rps", "queue", "TTFT attainment"))
    for m in snap["models"]:
        att = m.get("ttft_attainment")
        t.add_row(m["model"], str(m["replicas"]["steady"]), str(m["replicas"]["elastic"]), str(m["ready"]),
                  str(m.get("request_rate_rps", "-")), str(m.get("queue_depth", "-")),
                  "-" if att is None else f"{att:.1%}")
    console.print(t)
    if snap.get("leaders"):
        console.print("leaders: " + ", ".join(f"{x['role']} {x['holder']}" for x in snap["leaders"]))
    if snap["plans"]:
        last = snap["plans"][-1]
        console.print(f"last plan: {last['kind']} {last['plan_id']} — {last.get('reason', '')}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="janus status", description=__doc__)
    ap.add_argument("--nats", help="NATS URL (default: $JANUS_NATS_URL or the local janus up)")
    ap.add_argument("--state-dir", type=Path, help="the local janus up state directory (default .janus)")
    ap.add_argument("--json", action="store_true", help="print the snapshot as JSON")
    ap.add_argument("--wait-s", type=float, default=1.2, help="how long to listen before printing")
    args = ap.parse_args(argv)
    quiet_connection_warnings()
    target = nats_target(settings_for(args.state_dir), args.nats)
    try:
        snap = asyncio.run(gather(target, args.wait_s))
    except ToolConnectError as exc:
        print(f"janus status: {exc}", file=sys.stderr, flush=True)
        return EXIT_NO_NATS
    if args.json:
        print(json.dumps(snap, indent=2, default=str))
    else:
        render(snap)
    return 0

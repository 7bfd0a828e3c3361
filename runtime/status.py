"""`janus status`: devices, resident models and their states, pools, replica counts and queue depths."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path

from .bus import Bus
from .cluster_view import ClusterView
from .security import operator_login
from .settings import JanusSettings


def nats_url_of(settings: JanusSettings, explicit: str | None) -> str:
    """--nats, else $JANUS_NATS_URL, else the URL a local `janus up` left in its state directory."""
    if explicit:
        return explicit
    if "JANUS_NATS_URL" in os.environ:
        return settings.nats_url
    local = Path(settings.state_dir) / "nats.url"
    return local.read_text().strip() if local.exists() else settings.nats_url


async def gather(url: str, settings: JanusSettings, wait_s: float) -> dict:
    user, password = operator_login(settings)
    bus = await Bus.connect(url, "status", user=user, password=password)
    view = ClusterView()
    try:
        await view.attach(bus)
        await asyncio.sleep(wait_s)  # at least two heartbeats and one load window
        return view.snapshot()
    finally:
        await view.detach()
        await bus.close()


def render(snap: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    t = Table(title="devices")
    for col in ("worker", "device", "pages free / total", "fragmentation", "models (pages)", "heartbeat age s"):
        t.add_column(col)
    for d in snap["devices"]:
        used = ", ".join(f"{m}: {sum(k.values())}" for m, k in d["pages_by_model"].items()) or "-"
        t.add_row(d["worker_id"], f"{d['device']} {d['device_name']}", f"{d['pages_free']} / {d['pages_total']}",
                  f"{d['fragmentation']:.1%}", used, str(d["age_s"]))
    console.print(t)
    t = Table(title="instances")
    for col in ("model", "worker", "pool", "role", "state", "ready", "waiting", "running", "TTFT p50 ms"):
        t.add_column(col)
    for i in snap["instances"]:
        ttft = "-" if i["ttft_ms_p50"] is None else f"{i['ttft_ms_p50']:.1f}"
        t.add_row(i["model"], i["worker_id"], i["pool"], i["role"], i["state"], "yes" if i["is_ready"] else "no",
                  str(i["num_waiting"]), str(i["num_running"]), ttft)
    console.print(t)
    t = Table(title="models")
    for col in ("model", "steady", "elastic", "ready", "rate rps", "queue", "TTFT attainment"):
        t.add_column(col)
    for m in snap["models"]:
        att = m.get("ttft_attainment")
        t.add_row(m["model"], str(m["replicas"]["steady"]), str(m["replicas"]["elastic"]), str(m["ready"]),
                  str(m.get("request_rate_rps", "-")), str(m.get("queue_depth", "-")),
                  "-" if att is None else f"{att:.1%}")
    console.print(t)
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
    settings = JanusSettings(**({"state_dir": args.state_dir} if args.state_dir else {}))
    snap = asyncio.run(gather(nats_url_of(settings, args.nats), settings, args.wait_s))
    if args.json:
        print(json.dumps(snap, indent=2, default=str))
    else:
        render(snap)
    return 0

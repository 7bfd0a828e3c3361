"""What the serving path itself costs: gateway -> dispatcher -> worker -> gateway for a one-token request with the
model math skipped (the echo engine), beside the raw NATS request/reply round trip measured in the same run.

    .venv/bin/python bench/bus.py [--num-requests 2000]

Dispatcher and worker run as their own processes (`janus serve`), as in production; the gateway runs in this
process and the clock is read around its submit() (the bus path) and around an HTTP POST (the whole API path).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import pct, table  # noqa: E402
from contracts import GenerateRequest, SamplingParams, TokenChunk  # noqa: E402
from runtime.bus import Bus  # noqa: E402
from runtime.nats_server import EmbeddedNats  # noqa: E402

RESPONDER = textwrap.dedent("""
    import asyncio, sys, nats
    async def main():
        nc = await nats.connect(sys.argv[1])
        async def echo(msg):
            await msg.respond(msg.data)
        await nc.subscribe("bench.echo", cb=echo)
        await nc.flush()
        print("ready", flush=True)
        await asyncio.Event().wait()
    asyncio.run(main())
""")


async def raw_round_trips(url: str, n: int) -> list[float]:
    proc = subprocess.Popen([sys.executable, "-c", RESPONDER, url], stdout=subprocess.PIPE)
    proc.stdout.readline()
    bus = await Bus.connect(url, "bench")
    payload = b"x" * 128
    out = []
    try:
        for _ in range(200):
            await bus.nc.request("bench.echo", payload, timeout=2)
        for _ in range(n):
            t = time.perf_counter()
            await bus.nc.request("bench.echo", payload, timeout=2)
            out.append((time.perf_counter() - t) * 1e3)
    finally:
        await bus.close()
        proc.kill()
    return out


def spawn(service: str, url: str, config: Path, instance: str, state: Path) -> subprocess.Popen:
    env = dict(os.environ, JANUS_STATE_DIR=str(state), JANUS_LOG_LEVEL="WARNING")
    return subprocess.Popen([sys.executable, "-m", "ops.cli", "serve", service, "--nats", url, "--config",
                             str(config), "--id", instance], env=env)


async def path_latencies(url: str, config_path: Path, state: Path, n: int, num_http: int):
    from gateway.service import GatewayService
    from ops.effective import load_cluster
    from runtime.service import run_service
    from runtime.settings import JanusSettings

    procs = [spawn("worker", url, config_path, "bench-worker", state),
             spawn("dispatcher", url, config_path, "bench-dispatcher", state)]
    cluster = load_cluster(config_path)
    gw = GatewayService(JanusSettings(nats_url=url, instance="bench-gateway", state_dir=state), cluster, port=0)
    task = asyncio.create_task(run_service(gw, install_signals=False))
    try:
        while gw.bus is None or not gw.listening:
            await asyncio.sleep(0.05)

        def request() -> GenerateRequest:
            rid = uuid.uuid4().hex
            now = time.time() * 1e3
            return GenerateRequest(request_id=rid, model="demo-tiny", prompt_token_ids=(5, 6, 7),
                                   sampling=SamplingParams(max_tokens=1), arrival_unix_ms=now,
                                   ttft_deadline_unix_ms=now + 10_000, tpot_slo_ms=1000,
                                   reply_subject=gw.reply_subject(rid))

        async def one() -> float:
            t = time.perf_counter()
            events = [ev async for ev in gw.submit(request())]
            assert isinstance(events[0], TokenChunk) and len(events) == 2, events
            return (time.perf_counter() - t) * 1e3

        for _ in range(30):  # until the worker has registered and the dispatcher routes
            try:
                await one()
                break
            except AssertionError:
                await asyncio.sleep(0.5)
        for _ in range(200):
            await one()
        bus_ms = [await one() for _ in range(n)]

        import httpx

        http_ms = []
        async with httpx.AsyncClient(base_url=gw.url) as client:
            body = {"model": "demo-tiny", "prompt": [5, 6, 7], "max_tokens": 1}
            for i in range(num_http + 50):
                t = time.perf_counter()
                r = await client.post("/v1/completions", json=body)
                r.raise_for_status()
                if i >= 50:
                    http_ms.append((time.perf_counter() - t) * 1e3)
        return bus_ms, http_ms
    finally:
        gw.stopped.set()
        await task
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--num-requests", type=int, default=2000)
    ap.add_argument("--num-http", type=int, default=500)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        from worker.engine.demo import make_demo_models

        paths = make_demo_models(state / "models", ["demo-tiny"])
        config = state / "cluster.yaml"
        config.write_text(yaml.safe_dump({"models": [{"name": "demo-tiny", "path": str(paths["demo-tiny"])}],
                                          "workers": {"engine": "echo", "count": 1}}))
        with EmbeddedNats(state / "nats") as nats_server:
            raw = await raw_round_trips(nats_server.url, args.num_requests)
            bus_ms, http_ms = await path_latencies(nats_server.url, config, state, args.num_requests, args.num_http)
    rows = [["raw NATS request/reply (128 B)", len(raw), pct(raw, 50), pct(raw, 99), 1.0],
            ["gateway->dispatcher->worker->gateway", len(bus_ms), pct(bus_ms, 50), pct(bus_ms, 99),
             pct(bus_ms, 50) / pct(raw, 50)],
            ["HTTP POST /v1/completions (whole API path)", len(http_ms), pct(http_ms, 50), pct(http_ms, 99),
             pct(http_ms, 50) / pct(raw, 50)]]
    print(table(["path (one token, model math skipped)", "requests", "median ms", "p99 ms", "median / raw"], rows))
    print(f"\nthe bus path adds {pct(bus_ms, 50):.2f} ms median (goal <= 3 ms) over a round trip of "
          f"{pct(raw, 50):.2f} ms")


if __name__ == "__main__":
    asyncio.run(main())

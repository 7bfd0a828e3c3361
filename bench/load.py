"""A bounded load test: the request rate the gateway sustains with streamed responses through the whole path
(gateway -> dispatcher -> worker -> gateway, every service its own process), with p50 and p99 latency, beside a bare
FastAPI endpoint streaming the same number of SSE chunks in the same run.

    .venv/bin/python bench/load.py [--engine echo|torch] [--concurrency 32] [--duration-s 20]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import pct, table  # noqa: E402
from runtime.client import stream_completion  # noqa: E402
from runtime.ports import free_loopback_ports  # noqa: E402

BARE = textwrap.dedent("""
    import sys, json, uvicorn
    from fastapi import FastAPI, Request
    from fastapi.responses import StreamingResponse
    app = FastAPI()
    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        async def gen():
            for i in range(body["max_tokens"]):
                yield "data: " + json.dumps({"choices": [{"index": 0, "text": f"<{i}>", "finish_reason":
                      "length" if i == body["max_tokens"] - 1 else None}]}) + "\\n\\n"
            yield "data: " + json.dumps({"choices": [], "usage": {"completion_tokens": body["max_tokens"]}}) + "\\n\\n"
            yield "data: [DONE]\\n\\n"
        return StreamingResponse(gen(), media_type="text/event-stream")
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
""")


async def closed_loop(url: str, body: dict, concurrency: int, duration_s: float) -> dict:
    latencies, ttfts, statuses = [], [], []
    stop_at = time.perf_counter() + duration_s
    limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency * 2)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        async def user():
            while time.perf_counter() < stop_at:
                out = await stream_completion(client, body, timeout_s=120)
                statuses.append(out.status)
                if out.status == "completed":
                    latencies.append(out.latency_s * 1e3)
                    ttfts.append((out.ttft_s or 0) * 1e3)

        start = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    completed = statuses.count("completed")
    return {"rps": completed / elapsed, "tok_s": completed * body["max_tokens"] / elapsed, "n": len(statuses),
            "completed": completed, "lost": statuses.count("lost"), "failed": statuses.count("failed"),
            "p50": pct(latencies, 50), "p99": pct(latencies, 99), "ttft_p50": pct(ttfts, 50),
            "ttft_p99": pct(ttfts, 99)}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--engine", choices=["echo", "torch"], default="echo")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--duration-s", type=float, default=20.0)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()

    from ops.launcher import Cluster
    from runtime.settings import ClusterConfig, JanusSettings
    from worker.engine.demo import make_demo_models

    body = {"model": "demo-tiny", "prompt": "Hello there, how are you?", "max_tokens": args.max_tokens,
            "ignore_eos": True, "temperature": 0}
    with tempfile.TemporaryDirectory() as tmp:
        port = free_loopback_ports(1)[0]
        bare = subprocess.Popen([sys.executable, "-c", BARE, str(port)])
        try:
            for _ in range(100):
                try:
                    httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"max_tokens": 1})
                    break
                except httpx.HTTPError:
                    time.sleep(0.1)
            bare_res = await closed_loop(f"http://127.0.0.1:{port}", body, args.concurrency, args.duration_s)
        finally:
            bare.terminate()

        paths = make_demo_models(Path(tmp) / "models", ["demo-tiny"])
        config = ClusterConfig.model_validate({
            "models": [{"name": "demo-tiny", "path": str(paths["demo-tiny"]), "ttft_slo_ms": 60000}],
            "workers": {"count": args.workers, "engine": args.engine, "max_num_seqs": 64}})
        cluster = Cluster(JanusSettings(state_dir=Path(tmp) / "state"), config, config_path=None, gateway_port=0)
        await cluster.start()
        try:
            await closed_loop(cluster.gateway_url, body, 4, 2.0)  # warm-up
            janus_res = await closed_loop(cluster.gateway_url, body, args.concurrency, args.duration_s)
        finally:
            cluster.stop()

    rows = []
    for name, res in (("bare FastAPI SSE endpoint (same chunks)", bare_res),
                      (f"Janus gateway->dispatcher->{args.workers} workers ({args.engine})", janus_res)):
        rows.append([name, res["completed"], res["lost"] + res["failed"], res["rps"], res["tok_s"], res["p50"],
                     res["p99"], res["ttft_p50"], res["ttft_p99"]])
    print(f"closed loop: {args.concurrency} concurrent streaming clients, {args.duration_s:.0f} s, "
          f"{args.max_tokens} tokens each")
    print(table(["path", "completed", "lost+failed", "req/s", "tokens/s", "p50 ms", "p99 ms", "TTFT p50 ms",
                 "TTFT p99 ms"], rows))
    print(f"\nJanus sustains {janus_res['rps']:.0f} req/s = {janus_res['rps'] / bare_res['rps']:.2f}x the bare "
          "endpoint's rate in the same run")
    if args.json:
        args.json.write_text(json.dumps({"bare": bare_res, "janus": janus_res}, indent=2))


if __name__ == "__main__":
    asyncio.run(main())

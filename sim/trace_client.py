"""`janus replay`: send a trace open-loop to a live gateway (OpenAI completions API, streaming) and write the same
report `janus sim` writes, from what the clients saw.

Each request goes out at its own arrival time whatever happened to the others (open loop). Its prompt is a list of
token ids of the trace's input length (the completions API takes token ids, so lengths are exact), max_tokens the
trace's output length with ignore_eos, and logprobs=1 so that every streamed chunk says how many tokens it carries:
each token gets the arrival time of its chunk. Token-level attainment, TTFT/TPOT attainment and goodput follow
from those times exactly as in the simulator (sim.metrics); device counts are not visible to a client.

    janus replay --gateway http://127.0.0.1:8000 --trace arena --max-requests 200 --compression 10
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .metrics import Outcomes, app_reports, on_time_tokens, per_app_token_attainment, summarise, time_series
from .trace import Trace


@dataclass
class ClientRecord:
    """What one client saw: token arrival times (seconds from the replay's start) and how it ended."""

    token_times_s: list[float] = field(default_factory=list)
    is_failed: bool = False
    error: str = ""
    error_code: str = ""  # the OpenAI-style error body's code (e.g. overloaded, no_instance), when there was one


def error_code_of(payload) -> str:
    """The `code` of an OpenAI-style error body ({"error": {"code": ...}}), or "" when it has none."""
    err = payload.get("error") if isinstance(payload, dict) else None
    return str(err.get("code") or "") if isinstance(err, dict) else ""


def parse_sse_line(line: str) -> dict | None:
    """One server-sent-events line of the stream: its JSON payload, or None (comments, blank lines, [DONE])."""
    line = line.strip()
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if data == "[DONE]" or not data:
        return None
    return json.loads(data)


def tokens_in_chunk(payload: dict) -> int:
    """Tokens a completions chunk carries: its logprobs list when present, else one if it has text."""
    if payload.get("error"):
        return 0
    choices = payload.get("choices") or []
    if not choices:
        return 0
    lp = choices[0].get("logprobs") or {}
    if lp.get("token_logprobs") is not None:
        return len(lp["token_logprobs"])
    return 1 if choices[0].get("text") else 0


def outcomes_from_records(trace: Trace, records: list[ClientRecord], ttft_slo_s, tpot_slo_s) -> Outcomes:
    """The simulator's Outcomes from client-side token times (a request that got fewer tokens than asked, or an
    error, failed: all its tokens late, as in the simulator)."""
    n = trace.num_requests
    out = Outcomes.empty(n)
    ttft = np.broadcast_to(np.asarray(ttft_slo_s, dtype=float), (n,))
    tpot = np.broadcast_to(np.asarray(tpot_slo_s, dtype=float), (n,))
    for j, rec in enumerate(records):
        if rec.is_failed or len(rec.token_times_s) < trace.output_tokens[j]:
            continue
        times = rec.token_times_s[: trace.output_tokens[j]]
        out.first_token_s[j] = times[0]
        out.finish_s[j] = times[-1]
        out.num_on_time_tokens[j] = on_time_tokens(trace.arrival_s[j], times, ttft[j], tpot[j])
    return out


async def _one(client, url: str, headers: dict, body: dict, start: float, rec: ClientRecord) -> None:
    try:
        async with client.stream("POST", url, json=body, headers=headers) as resp:
            if resp.status_code != 200:
                error_body = await resp.aread()  # not `body`: that is the request's
                rec.is_failed, rec.error = True, f"HTTP {resp.status_code}: {error_body[:200]!r}"
                try:
                    rec.error_code = error_code_of(json.loads(error_body))
                except ValueError:
                    pass
                return
            async with contextlib.aclosing(resp.aiter_lines()) as stream_lines:  # closed here, not by the collector
                async for line in stream_lines:
                    payload = parse_sse_line(line)
                    if payload is None:
                        continue
                    if payload.get("error"):
                        rec.is_failed, rec.error = True, str(payload["error"])[:200]
                        rec.error_code = error_code_of(payload)
                        return
                    now = time.perf_counter() - start
                    rec.token_times_s.extend([now] * tokens_in_chunk(payload))
    except Exception as exc:  # a broken connection is a failed request, never a crash of the replay
        rec.is_failed, rec.error = True, f"{type(exc).__name__}: {exc}"


async def send_open_loop(gateway: str, trace: Trace, models: list[str], api_key: str = "unused",
                         vocab_size: int = 1000, timeout_s: float = 600.0, seed: int = 0) -> list[ClientRecord]:
    """Every request of `trace` at its arrival time (app i -> models[i % len(models)])."""
    import httpx

    rng = np.random.default_rng(seed)
    url = gateway.rstrip("/") + "/v1/completions"
    headers = {"Authorization": f"Bearer {api_key}"}
    records = [ClientRecord() for _ in range(trace.num_requests)]
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
        start = time.perf_counter()
        tasks = []
        for j in range(trace.num_requests):
            delay = trace.arrival_s[j] - (time.perf_counter() - start)
            if delay > 0:
                await asyncio.sleep(delay)
            body = {"model": models[trace.app_ids[j] % len(models)],
                    "prompt": rng.integers(10, vocab_size, int(trace.input_tokens[j])).tolist(),
                    "max_tokens": int(trace.output_tokens[j]), "ignore_eos": True, "temperature": 0.0,
                    "logprobs": 1, "stream": True}
            tasks.append(asyncio.create_task(_one(client, url, headers, body, start, records[j])))
        await asyncio.gather(*tasks)
    return records


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="janus replay", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gateway", required=True, help="base URL of a live gateway")
    p.add_argument("--api-key", default="unused")
    p.add_argument("--trace", default="arena", choices=["servegen", "azure", "mooncake", "arena"])
    p.add_argument("--models", default="", help="comma-separated served models (default: the gateway's list)")
    p.add_argument("--max-requests", type=int, default=200)
    p.add_argument("--compression", type=float, default=1.0)
    p.add_argument("--max-input-tokens", type=int, default=256, help="clip prompts (demo models are small)")
    p.add_argument("--max-output-tokens", type=int, default=64)
    p.add_argument("--vocab-size", type=int, default=1000, help="prompt token ids are drawn below this")
    p.add_argument("--ttft-slo-ms", type=float, default=2000.0)
    p.add_argument("--tpot-slo-ms", type=float, default=200.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="artifacts/replay")
    return p


def load_trace(args) -> Trace:
    from .public_traces import load_public
    from .servegen import servegen_trace

    trace = servegen_trace(seed=args.seed) if args.trace == "servegen" else load_public(args.trace)
    if args.compression != 1.0:
        trace = trace.compressed(args.compression)
    trace = trace.head(args.max_requests)
    return Trace(trace.arrival_s, trace.app_ids, np.minimum(trace.input_tokens, args.max_input_tokens),
                 np.minimum(trace.output_tokens, args.max_output_tokens), trace.app_names, trace.source)


def main(argv: list[str] | None = None) -> int:
    import httpx
    from rich.console import Console

    from .report import print_tables, write_outputs
    from .runner import SystemResult

    args = build_parser().parse_args(argv)
    console = Console()
    models = [m for m in args.models.split(",") if m]
    if not models:
        listed = httpx.get(args.gateway.rstrip("/") + "/v1/models",
                           headers={"Authorization": f"Bearer {args.api_key}"}, timeout=30).json()
        models = sorted(m["id"] for m in listed["data"])
    trace = load_trace(args)
    console.print(f"[bold]janus replay[/]: {trace.num_requests} requests over {trace.duration_s:.1f} s to "
                  f"{args.gateway} ({', '.join(models)})")
    start = time.perf_counter()
    records = asyncio.run(send_open_loop(args.gateway, trace, models, args.api_key, args.vocab_size, seed=args.seed))
    wall_s = time.perf_counter() - start
    ttft, tpot = args.ttft_slo_ms / 1e3, args.tpot_slo_ms / 1e3
    out = outcomes_from_records(trace, records, ttft, tpot)
    summary = summarise(trace, out, ttft, tpot)
    series = time_series(trace, out, max(1.0, trace.duration_s / 60))
    per_app = per_app_token_attainment(trace.app_ids, trace.output_tokens, out, trace.num_apps)
    failures = [(float(trace.arrival_s[j]), int(trace.app_ids[j]), r.error_code or "client_error")
                for j, r in enumerate(records) if r.is_failed]
    served = [models[a % len(models)] for a in range(trace.num_apps)]
    apps = app_reports(trace.app_names, served, trace.requests_per_app(), per_app, failures)
    result = SystemResult("live", summary, series, per_app, wall_s, 0.0, apps=apps)
    print_tables([result], console)
    errors = [r.error for r in records if r.is_failed][:5]
    if errors:
        console.print("first errors: " + "; ".join(errors))
    paths = write_outputs([result], Path(args.out), dict(vars(args), wall_s=wall_s))
    console.print("wrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

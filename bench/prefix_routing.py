"""Prefix-aware routing, live and in the dispatcher's core, with the dispatcher's prefix affinity on and off in the
same run (docs/dispatcher.md, "Prefix affinity").

    .venv/bin/python bench/prefix_routing.py [--workers 3] [--chats 12] [--turns 5] [--json out.json]

Live: `--workers` workers serve demo-small with real engines (prefix caching on, the default), started as `janus up`
starts them but without the planners, so that every worker keeps its instance for the whole run. `--chats`
conversations run at once through the gateway with the official openai SDK, streamed; each turn resends the
conversation so far (a system prompt of --system-tokens random token ids, then --turn-tokens new ones per turn),
as a chat client does. Per variant: prompt tokens, tokens the engines found cached (the usage's
prompt_tokens_details.cached_tokens, each engine's own count), TTFT p50 / p90 on the client's clock.

Core: the cost of the affinity in the dispatcher itself, the same conversations' requests fed to a DispatcherCore
with --core-instances instances on a virtual clock (each prefill done at its predicted time), in microseconds of
CPU per request, on and off.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import pct, table  # noqa: E402

MODEL = "demo-small"
PLANNERS_OFF = {"steady-planner": 0, "elastic-scaler": 0, "reconciler": 0}


def conversations(args: argparse.Namespace, num_chats: int) -> list[list[list[int]]]:
    """Per chat, the prompt of each turn (token ids; demo-small's vocabulary has 2,048)."""
    rng = random.Random(args.seed)
    chats = []
    for _ in range(num_chats):
        prompt = [rng.randrange(100, 2000) for _ in range(args.system_tokens)]
        turns = []
        for _ in range(args.turns):
            turns.append(prompt)
            prompt = prompt + [rng.randrange(100, 2000) for _ in range(args.turn_tokens)]
        chats.append(turns)
    return chats


async def live_variant(args: argparse.Namespace, chats: list[list[list[int]]], affine: bool, tmp: Path) -> dict:
    import openai

    from ops.launcher import Cluster
    from runtime.settings import ClusterConfig, JanusSettings

    config = ClusterConfig.model_validate({
        "models": [{"name": MODEL, "demo": MODEL, "ttft_slo_ms": args.ttft_slo_ms}],
        "workers": {"count": args.workers}, "replicas": PLANNERS_OFF,
        "dispatcher": {"is_prefix_affine": affine}})
    state = tmp / ("on" if affine else "off")
    cluster = Cluster(JanusSettings(state_dir=state), config, config_path=None, gateway_port=0)
    await cluster.start()
    try:
        client = openai.AsyncOpenAI(base_url=f"{cluster.gateway_url}/v1", api_key="unused", timeout=300,
                                    max_retries=0)
        await client.completions.create(model=MODEL, prompt=[1, 2, 3], max_tokens=1)  # warm-up
        ttft_ms, prompt_tokens, cached_tokens = [], 0, 0

        per_chat: list[list[int]] = [[] for _ in chats]  # cached tokens of each turn

        async def turn(prompt: list[int], seen: list[int]) -> None:
            nonlocal prompt_tokens, cached_tokens
            start = time.perf_counter()
            first = None
            stream = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=args.max_tokens,
                                                     temperature=0, stream=True,
                                                     stream_options={"include_usage": True})
            async for chunk in stream:
                if first is None and chunk.choices and chunk.choices[0].text:
                    first = time.perf_counter()
                if chunk.usage is not None:
                    prompt_tokens += chunk.usage.prompt_tokens
                    cached_tokens += chunk.usage.prompt_tokens_details.cached_tokens
                    seen.append(chunk.usage.prompt_tokens_details.cached_tokens)
            ttft_ms.append(((first or time.perf_counter()) - start) * 1e3)

        async def chat(turns: list[list[int]], seen: list[int]) -> None:
            for prompt in turns:
                await turn(prompt, seen)

        start = time.perf_counter()
        await asyncio.gather(*(chat(turns, seen) for turns, seen in zip(chats, per_chat)))
        wall_s = time.perf_counter() - start
    finally:
        cluster.stop()
    return {"affine": affine, "requests": len(ttft_ms), "prompt_tokens": prompt_tokens,
            "cached_tokens": cached_tokens, "hit_rate": cached_tokens / max(1, prompt_tokens),
            "ttft_p50_ms": pct(ttft_ms, 50), "ttft_p90_ms": pct(ttft_ms, 90), "wall_s": wall_s,
            "ideal_cached_tokens": sum(len(t) // 16 * 16 for turns in chats for t in turns[:-1]),
            "cached_per_chat": per_chat}


def core_variant(args: argparse.Namespace, chats: list[list[list[int]]], affine: bool) -> dict:
    """The dispatcher core alone on a virtual clock: every chat sends its next turn a think time (exponential, mean
    --think-ms) after the last one's prefill is done (its predicted time); CPU time of the core's calls per
    request."""
    import heapq

    from contracts import GenerateRequest, SamplingParams
    from contracts import InstanceRecord, InstanceRole, ModelState, Pool
    from dispatcher.core import Assign, DispatchPolicy, DispatcherCore, ThroughputPrefillModel

    core = DispatcherCore(DispatchPolicy(is_prefix_affine=affine), ThroughputPrefillModel(20_000.0))
    core.on_instances(0.0, [InstanceRecord(instance_id=f"i{k}", model=MODEL, worker_id=f"w{k}",
                                           role=InstanceRole.COLOCATED, pool=Pool.STEADY, state=ModelState.ACTIVE,
                                           is_ready=True, updated_unix_ms=0.0)
                            for k in range(args.core_instances)])
    rng = random.Random(args.seed)
    # chats start over --core-span-s; a turn follows the last one's first token after a think time
    events: list[tuple[float, int, tuple]] = [(rng.uniform(0.0, args.core_span_s * 1e3), 0, (c, 0))
                                              for c in range(len(chats))]
    heapq.heapify(events)  # (time ms, kind: 0 arrival, 1 prefill done, 2 wakeup, payload)
    cpu_s, num_requests, woken_at = 0.0, 0, None
    while events:
        at, kind, payload = heapq.heappop(events)
        if kind == 0:
            c, t = payload
            num_requests += 1
            request = GenerateRequest(request_id=f"{c}/{t}", model=MODEL, prompt_token_ids=tuple(chats[c][t]),
                                      sampling=SamplingParams(max_tokens=1), arrival_unix_ms=at,
                                      ttft_deadline_unix_ms=at + args.ttft_slo_ms, tpot_slo_ms=100.0,
                                      reply_subject="r")
            tick = time.perf_counter()
            effects = core.on_request(at, request)
        elif kind == 1:
            instance, rid = payload
            tick = time.perf_counter()
            effects = core.on_prefill_done(at, instance, rid)
            c, t = (int(x) for x in rid.split("/"))
            if t + 1 < len(chats[c]):
                heapq.heappush(events, (at + rng.expovariate(1.0 / args.think_ms), 0, (c, t + 1)))
        else:
            tick = time.perf_counter()
            effects = core.on_tick(at)
        cpu_s += time.perf_counter() - tick
        for e in effects:
            if isinstance(e, Assign):
                heapq.heappush(events, (e.expected_done_ms, 1, (e.instance_id, e.request_id)))
        wake = core.next_wakeup_ms() if core.queue_depth(MODEL) else None  # else only load windows are due
        if wake is not None and wake != woken_at and wake > at:
            woken_at = wake
            heapq.heappush(events, (wake, 2, ()))
    return {"affine": affine, "requests": num_requests, "cpu_us_per_request": cpu_s / max(1, num_requests) * 1e6}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--chats", type=int, default=12)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--system-tokens", type=int, default=512)
    ap.add_argument("--turn-tokens", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--ttft-slo-ms", type=float, default=60_000.0, help="lax: the figures are of routing, not SLOs")
    ap.add_argument("--core-instances", type=int, default=32)
    ap.add_argument("--core-chats", type=int, default=400, help="conversations replayed into the core alone")
    ap.add_argument("--core-span-s", type=float, default=10.0, help="the core's chats start within this")
    ap.add_argument("--think-ms", type=float, default=2000.0, help="the core's chats: mean time between turns")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-live", action="store_true", help="the core's cost only")
    ap.add_argument("--json", type=Path)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out: dict = {"args": {k: str(v) for k, v in vars(args).items()}}
    many = conversations(args, args.core_chats)
    core = [core_variant(args, many, affine) for affine in (False, True, False, True)]  # twice, interleaved
    out["core"] = core
    print(f"dispatcher core, {args.core_instances} instances, {core[0]['requests']} requests "
          f"({args.core_chats} chats x {args.turns} turns), two runs each:")
    print(table(["prefix affinity", "CPU us / request"],
                [["on" if r["affine"] else "off", f"{r['cpu_us_per_request']:.0f}"] for r in core]))
    chats = conversations(args, args.chats)
    if not args.skip_live:
        with tempfile.TemporaryDirectory() as tmp:
            live = [asyncio.run(live_variant(args, chats, affine, Path(tmp))) for affine in (False, True)]
        out["live"] = live
        print(f"\nlive: {args.workers} workers of {MODEL}, {args.chats} chats x {args.turns} turns at once, "
              f"{args.system_tokens}-token system prompts, {args.turn_tokens} new tokens a turn:")
        rows = [["on" if r["affine"] else "off", r["requests"], r["prompt_tokens"], r["cached_tokens"],
                 f"{r['hit_rate']:.2f}", f"{r['ttft_p50_ms']:.0f}", f"{r['ttft_p90_ms']:.0f}", f"{r['wall_s']:.1f}"]
                for r in live]
        print(table(["prefix affinity", "requests", "prompt tokens", "found cached", "hit rate", "TTFT p50 ms",
                     "TTFT p90 ms", "wall s"], rows))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

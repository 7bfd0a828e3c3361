"""Lifecycle data plane: Warm -> Active restore, fork, and P/D hand-over, each beside a baseline measured in the
same run.

    .venv/bin/python bench/lifecycle.py                      # CPU: all sections
    .venv/bin/python bench/lifecycle.py --sections warm,fork,paths --warm-mib 1024
    .venv/bin/python bench/lifecycle.py --device cuda --warm-mib 16384 --fork-mib 4096   # the H200 variant

warm: pages released (sleep) and mapped fresh (wake) in the device pool, then the host copy restored in chunks over
      a few lanes (CUDA streams / CPU threads), against one plain copy of the same bytes into an ordinary tensor.
      On CUDA the baseline is the pinned host -> device limit (55 GB/s measured on the H200; goal >= 90 %).
fork: a source process holds the weight pages in its own pool and transfer engine; this process pulls them by
      global offset into fresh pool pages (the fork code path), against a raw Mooncake read of the same byte ranges
      into a plain buffer. Then the source's decode step time (TPOT) alone and while being forked from.
paths: one demo model brought up through the lifecycle controller, verification included: cold load (disk ->
      device pages) as the baseline, warm -> active, a fork from a replica in a second pool, and a remote warm pull
      (a second pool's cold target pulls the first pool's offered host copy).
pd:   nats-server and two worker processes; the same greedy request colocated on one instance and split P -> D.
      The gap between the first and second token is one decode step colocated, and hand-over + one decode step
      split: the difference is the hand-over time per request.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import pct, table  # noqa: E402

MiB = 1 << 20
PAGE = 2 * MiB


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


# ---- warm -> active ---------------------------------------------------------------------------------------------
def bench_warm(device: str, num_bytes: int, repeats: int, chunk_bytes: int, num_lanes: int) -> list[list]:
    import torch

    from worker.lifecycle.host_copy import HostWeights, chunked_copy
    from worker.xtensor import XTensor, XTensorConfig

    pages = XTensor.open(device, num_bytes + 4 * PAGE, XTensorConfig(page_size_bytes=PAGE, is_background_refill=False))
    try:
        weights = pages.allocate_weights("bench", num_bytes, device)
        host = HostWeights.allocate(num_bytes, pin=device.startswith("cuda"))
        host.buffer.random_(0, 256)
        plain = torch.zeros(num_bytes, dtype=torch.uint8, device=device)  # touched: no faults in the baseline
        memcpy_ms, copy_ms, wake_ms = [], [], []
        for _ in range(repeats):
            _sync(device)
            started = time.perf_counter()
            plain.copy_(host.buffer)
            _sync(device)
            memcpy_ms.append((time.perf_counter() - started) * 1e3)
            pages.sleep("bench")  # Active -> Warm at the memory level: the pages go back to the pool
            started = time.perf_counter()
            pages.wake("bench")  # fresh pages under the same view
            mapped = time.perf_counter()
            chunked_copy(weights, host.buffer, chunk_bytes=chunk_bytes, num_lanes=num_lanes)
            done = time.perf_counter()
            copy_ms.append((done - mapped) * 1e3)
            wake_ms.append((done - started) * 1e3)
        if not torch.equal(weights.cpu() if weights.is_cuda else weights, host.buffer):
            raise AssertionError("restored weights differ from the host copy")
    finally:
        pages.close()
    base = statistics.median(memcpy_ms)
    gbps = lambda ms: num_bytes / (ms * 1e6)  # noqa: E731
    return [["plain copy, same bytes (baseline)", num_bytes // MiB, base, gbps(base), 1.0],
            ["restore copy into fresh pool pages", num_bytes // MiB, statistics.median(copy_ms),
             gbps(statistics.median(copy_ms)), base / statistics.median(copy_ms)],
            ["warm -> active: map fresh pages + copy", num_bytes // MiB, statistics.median(wake_ms),
             gbps(statistics.median(wake_ms)), base / statistics.median(wake_ms)]]


# ---- fork ---------------------------------------------------------------------------------------------------------
def serve_source(device: str, num_bytes: int, model: str | None) -> None:
    """The fork source (a separate process): weight pages in its pool, its transfer engine, optionally an engine
    decoding a batch so its TPOT can be watched. Talks over stdin/stdout lines."""
    import torch

    from worker.dataplane.transfer import MooncakeTransfer
    from worker.xtensor import XTensor, XTensorConfig

    torch.set_num_threads(1)
    room = 512 * MiB if model else 4 * PAGE  # the decoding engine's weights and KV share the pool
    pages = XTensor.open(device, num_bytes + room, XTensorConfig(page_size_bytes=PAGE))
    weights = pages.allocate_weights("source", num_bytes, device)
    weights.random_(0, 256)
    te = MooncakeTransfer.start()
    region = pages.global_region
    te.register(region.base_address, region.num_bytes)
    engine = None
    if model:
        from contracts import SamplingParams
        from worker.engine.demo import make_demo_models
        from worker.engine.engine import EngineConfig, LLMEngine

        path = make_demo_models(Path(tempfile.mkdtemp(prefix="janus-bench-")), [model])[model]
        engine = LLMEngine(path, device=device, config=EngineConfig(max_num_seqs=8), kv_source=pages,
                           weight_source=pages, owner="engine")
    from worker.engine.weights import bytes_checksum  # chunked: no device-sized temporaries

    print(json.dumps({"session": te.session, "segments": pages.weight_segments("source"),
                      "checksum": bytes_checksum(weights)}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "tpot":  # decode a batch of 8 for the given seconds; report per-step times
            seconds, steps = float(cmd[1]), []
            for i in range(8):
                engine.add_request(f"r{time.monotonic_ns()}-{i}", [1 + i, 2, 3, 4],
                                   SamplingParams(max_tokens=100_000, temperature=0, ignore_eos=True))
            for _ in range(4):  # prefill and warm-up
                engine.step()
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                started = time.perf_counter()
                engine.step()
                _sync(device)
                steps.append((time.perf_counter() - started) * 1e3)
            for rid in list(engine._seqs):  # noqa: SLF001 - bench only: stop the batch
                engine.abort(rid)
            engine.step()
            print(json.dumps({"p50": pct(steps, 50), "p99": pct(steps, 99), "n": len(steps)}), flush=True)
        elif cmd[0] == "quit":
            break


def bench_fork(device: str, num_bytes: int, repeats: int, tpot_model: str | None, tpot_s: float) -> tuple:
    import torch

    from contracts import ForkSource, WeightSegment
    from worker.lifecycle.fork import pull_weights
    from worker.dataplane.transfer import MooncakeTransfer
    from worker.xtensor import XTensor, XTensorConfig

    args = [sys.executable, __file__, "--serve-source", "--device", device, "--fork-mib", str(num_bytes // MiB)]
    if tpot_model:
        args += ["--tpot-model", tpot_model]
    child = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
    line = child.stdout.readline()
    if not line:
        raise RuntimeError(f"the fork source process ended early (exit {child.wait(30)})")
    info = json.loads(line)
    pages = XTensor.open(device, num_bytes + 4 * PAGE, XTensorConfig(page_size_bytes=PAGE, is_background_refill=False))
    te = MooncakeTransfer.start()
    te.register(pages.global_region.base_address, pages.global_region.num_bytes)
    plain = torch.zeros(num_bytes, dtype=torch.uint8, device=device)
    te.register(plain.data_ptr(), num_bytes)
    source = ForkSource(worker_id="source", instance_id="source", transfer_session=info["session"],
                        segments=tuple(WeightSegment(global_offset_bytes=o, num_bytes=n) for o, n in info["segments"]))
    rows, tpot_rows = [], []
    try:
        target = pages.allocate_weights("target", num_bytes, device)
        raw_ms, fork_ms, again_ms = [], [], []
        for _ in range(repeats):
            started = time.perf_counter()
            pos = 0
            locals_, offsets, sizes = [], [], []
            for o, n in info["segments"]:
                locals_.append(plain.data_ptr() + pos)
                offsets.append(o)
                sizes.append(n)
                pos += n
            te.read(info["session"], locals_, offsets, sizes)
            raw_ms.append((time.perf_counter() - started) * 1e3)
            pages.release_weights("target")
            target = pages.allocate_weights("target", num_bytes, device)  # fresh pages, as a fork target prepares
            fork_ms.append(pull_weights(pages, "target", source, te).pull_ms)
            again_ms.append(pull_weights(pages, "target", source, te).pull_ms)  # same pages, already touched
        from worker.engine.weights import bytes_checksum

        if bytes_checksum(target) != info["checksum"] or not torch.equal(target, plain):
            raise AssertionError("forked bytes differ from the source")
        base = statistics.median(raw_ms)
        gbps = lambda ms: num_bytes / (ms * 1e6)  # noqa: E731
        rows = [["raw Mooncake read, same ranges (baseline)", num_bytes // MiB, base, gbps(base), 1.0],
                ["fork pull into fresh pool pages", num_bytes // MiB, statistics.median(fork_ms),
                 gbps(statistics.median(fork_ms)), base / statistics.median(fork_ms)],
                ["fork pull into the same pages again", num_bytes // MiB, statistics.median(again_ms),
                 gbps(statistics.median(again_ms)), base / statistics.median(again_ms)]]
        if tpot_model:
            child.stdin.write(f"tpot {tpot_s}\n")
            child.stdin.flush()
            alone = json.loads(child.stdout.readline())
            stop = threading.Event()
            num_pulls = [0]

            def keep_pulling() -> None:
                while not stop.is_set():
                    pull_weights(pages, "target", source, te)
                    num_pulls[0] += 1

            puller = threading.Thread(target=keep_pulling)
            child.stdin.write(f"tpot {tpot_s}\n")
            child.stdin.flush()
            puller.start()
            forked = json.loads(child.stdout.readline())
            stop.set()
            puller.join()
            tpot_rows = [["source TPOT, alone (baseline)", alone["p50"], alone["p99"], alone["n"], 1.0],
                         [f"source TPOT, forked from ({num_pulls[0]} pulls)", forked["p50"], forked["p99"],
                          forked["n"], forked["p50"] / alone["p50"]]]
    finally:
        child.stdin.write("quit\n")
        child.stdin.flush()
        child.wait(30)
        te.close()
        pages.close()
    return rows, tpot_rows


# ---- the whole path on a model ----------------------------------------------------------------------------------
class _NullHost:
    """The worker shell's part, reduced to nothing: no bus, no engine loop (the bench times the controller)."""

    def now_unix_ms(self) -> float:
        return time.time() * 1e3

    async def on_transition(self, inst, event) -> None: ...

    async def refresh_record(self, inst) -> None: ...

    async def drain(self, inst, timeout_s: float) -> dict[str, float]:
        return {}

    def start_serving(self, inst) -> None: ...

    def stop_serving(self, inst) -> None: ...


async def bench_paths(device: str, model: str, repeats: int) -> list[list]:
    """Cold load, warm restore and fork of one model through the lifecycle controller (verification included)."""
    from contracts import ForkSource, LifecycleAction, LifecycleCommand
    from worker.engine.demo import make_demo_models
    from worker.engine.engine import EngineConfig, LLMEngine
    from worker.lifecycle.controller import LifecycleController
    from worker.lifecycle.instance import ModelInstance
    from worker.dataplane.transfer import MooncakeTransfer
    from worker.xtensor import XTensor, XTensorConfig

    path = make_demo_models(Path(tempfile.mkdtemp(prefix="janus-bench-")), [model])[model]
    workers = []
    for name in ("a", "b"):
        pages = XTensor.open(device, 2048 * MiB, XTensorConfig(page_size_bytes=PAGE))
        te = MooncakeTransfer.start()
        te.register(pages.global_region.base_address, pages.global_region.num_bytes)

        def make(cmd, pages=pages, name=name):
            build = lambda p, owner, load_weights=True: LLMEngine(  # noqa: E731
                p, device=device, config=EngineConfig(max_num_seqs=8), kv_source=pages, weight_source=pages,
                owner=owner, load_weights=load_weights)
            return ModelInstance(name, cmd.model, cmd.instance_id, cmd.role, cmd.pool, path, pages, build)

        workers.append((LifecycleController(name, _NullHost(), make, te), pages, te))
    seq = iter(range(1_000_000))

    async def run(w, iid, action, **kw):
        controller = w[0]
        reply = await controller.execute(LifecycleCommand(
            command_id=str(next(seq)), worker_id=controller.worker_id, model=model, instance_id=iid, action=action,
            issued_unix_ms=time.time() * 1e3, **kw))
        if not reply.ok:
            raise RuntimeError(reply.detail)
        return reply

    timings: dict[str, list[dict]] = {"cold": [], "warm": [], "fork": [], "fork_cold": [], "remote_warm": []}
    num_bytes = 0
    try:
        a, b = workers
        for _ in range(repeats):
            timings["cold"].append((await run(a, "x", LifecycleAction.ACTIVATE)).timings_ms)
            inst = a[0].instances["x"]
            num_bytes = inst.weight_num_bytes
            await run(a, "x", LifecycleAction.WARM)
            timings["warm"].append((await run(a, "x", LifecycleAction.ACTIVATE)).timings_ms)
            source = ForkSource(worker_id="a", instance_id="x", transfer_session=a[2].session,
                                segments=inst.segments)
            await run(b, "y", LifecycleAction.WARM)  # the target has its engine; the fork replaces the bytes
            timings["fork"].append((await run(b, "y", LifecycleAction.FORK_FROM, fork_source=source)).timings_ms)
            await run(b, "y", LifecycleAction.COLD)
            # a cold target builds its engine without reading the checkpoint (build_ms), then pulls
            timings["fork_cold"].append((await run(b, "z", LifecycleAction.FORK_FROM,
                                                   fork_source=source)).timings_ms)
            await run(b, "z", LifecycleAction.COLD)
            # a remote warm pull: x only warm on a, its host copy offered; a cold target on b pulls it
            await run(a, "x", LifecycleAction.WARM)
            offer = a[0].host_offers.offered()["x"]
            remote = ForkSource(worker_id="a", instance_id="x", transfer_session=a[2].session,
                                segments=offer.segments, kind="host_copy", base_offset_bytes=offer.base_offset_bytes)
            timings["remote_warm"].append((await run(b, "r", LifecycleAction.FORK_FROM,
                                                     fork_source=remote)).timings_ms)
            await run(b, "r", LifecycleAction.COLD)
            await run(a, "x", LifecycleAction.COLD)
    finally:
        for _, pages, te in workers:
            te.close()
            pages.close()

    def med(kind: str, key: str) -> float:
        return statistics.median(t.get(key, 0.0) for t in timings[kind])

    def total(kind: str, keys: tuple[str, ...]) -> float:
        return statistics.median(sum(t.get(k, 0.0) for k in keys) for t in timings[kind])

    verify = ("checksum_ms", "canary_ms", "segments_ms")
    cold = total("cold", ("load_ms", *verify))
    warm = total("warm", ("map_ms", "copy_ms", *verify))
    fork = total("fork", ("prepare_ms", "pull_ms", *verify))
    fork_cold = total("fork_cold", ("build_ms", "prepare_ms", "pull_ms", *verify))
    remote_warm = total("remote_warm", ("build_ms", "prepare_ms", "pull_ms", *verify))
    return [["cold load: disk -> device pages (baseline)", num_bytes // MiB, f"load {med('cold', 'load_ms'):.1f}",
             sum(med("cold", k) for k in verify), cold, 1.0],
            ["warm -> active: map + host copy", num_bytes // MiB,
             f"map {med('warm', 'map_ms'):.1f} + copy {med('warm', 'copy_ms'):.1f}",
             sum(med("warm", k) for k in verify), warm, cold / warm],
            ["fork from a live replica onto a warm target", num_bytes // MiB,
             f"prepare {med('fork', 'prepare_ms'):.1f} + pull {med('fork', 'pull_ms'):.1f}",
             sum(med("fork", k) for k in verify), fork, cold / fork],
            ["fork onto a cold target (engine built without the checkpoint)", num_bytes // MiB,
             f"build {med('fork_cold', 'build_ms'):.1f} + prepare {med('fork_cold', 'prepare_ms'):.1f} + pull "
             f"{med('fork_cold', 'pull_ms'):.1f}", sum(med("fork_cold", k) for k in verify), fork_cold,
             cold / fork_cold],
            ["remote warm pull: a peer's host copy onto a cold target", num_bytes // MiB,
             f"build {med('remote_warm', 'build_ms'):.1f} + pull {med('remote_warm', 'pull_ms'):.1f}",
             sum(med("remote_warm", k) for k in verify), remote_warm, cold / remote_warm]]


# ---- P/D hand-over -----------------------------------------------------------------------------------------------
async def bench_pd(device: str, num_requests: int, model: str, prompt_len: int) -> list[list]:
    import yaml

    from contracts import STREAM_EVENT, GenerateRequest, HealthReply, KVTarget, RunAssignment, SamplingParams, \
        TokenChunk, subjects
    from runtime.bus import Bus, BusError
    from runtime.nats_server import EmbeddedNats
    from worker.engine.demo import make_demo_models

    state = Path(tempfile.mkdtemp(prefix="janus-bench-pd-"))
    path = make_demo_models(state / "models", [model])[model]
    config = state / "cluster.yaml"
    config.write_text(yaml.safe_dump({"models": [{"name": model, "path": str(path)}],
                                      "workers": {"device": device, "pool_bytes": 256 * MiB,
                                                  "placement": {"p": [model], "d": [model]}}}))
    nats = EmbeddedNats(state / "nats").start()
    janus = Path(sys.executable).parent / "janus"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "JANUS_LOG_LEVEL": "WARNING"}
    procs = [subprocess.Popen([str(janus), "serve", "worker", "--nats", nats.url, "--config", str(config), "--id", w,
                               "--state-dir", str(state)], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for w in ("p", "d")]
    bus = await Bus.connect(nats.url, "bench")
    streams: dict[str, list] = {}
    done: dict[str, asyncio.Event] = {}

    async def on_event(ev, env) -> None:
        streams.setdefault(ev.request_id, []).append(ev)
        if not isinstance(ev, TokenChunk):
            done.setdefault(ev.request_id, asyncio.Event()).set()

    try:
        await bus.subscribe(subjects.reply_wildcard("bench"), STREAM_EVENT, on_event, traced=False)
        for w in ("p", "d"):
            for _ in range(600):
                try:
                    await bus.request(subjects.health("worker", w), None, HealthReply, timeout_s=1)
                    break
                except BusError:
                    await asyncio.sleep(0.2)
        gaps: dict[str, list[float]] = {"colocated": [], "pd": []}
        target = KVTarget(decode_worker_id="d", decode_instance_id=f"d/{model}", transfer_session="",
                          block_offsets_bytes=(), block_num_bytes=1)
        for i in range(num_requests * 2 + 4):
            kind = "pd" if i % 2 else "colocated"
            rid = f"bench-{i}"
            now = time.time() * 1e3
            req = GenerateRequest(request_id=rid, model=model, prompt_token_ids=tuple((7 * j + i) % 500 + 1
                                                                                  for j in range(prompt_len)),
                                  sampling=SamplingParams(max_tokens=4, temperature=0, ignore_eos=True),
                                  arrival_unix_ms=now, ttft_deadline_unix_ms=now + 60_000, tpot_slo_ms=1000,
                                  reply_subject=subjects.reply("bench", rid))
            await bus.publish(subjects.worker_run("p"), RunAssignment(
                request=req, instance_id=f"p/{model}", dispatched_unix_ms=now,
                phase="prefill" if kind == "pd" else "full", kv_target=target if kind == "pd" else None))
            await asyncio.wait_for(done.setdefault(rid, asyncio.Event()).wait(), 60)
            chunks = sorted((e for e in streams[rid] if isinstance(e, TokenChunk)), key=lambda e: e.seq)
            if i >= 4:  # the first ones warm up connections and kernels
                gaps[kind].append(chunks[1].emitted_unix_ms - chunks[0].emitted_unix_ms)
    finally:
        await bus.close()
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(60)
        nats.stop()
    col, pd = statistics.median(gaps["colocated"]), statistics.median(gaps["pd"])
    return [["colocated: first -> second token (baseline)", prompt_len, col, pct(gaps["colocated"], 90), "-"],
            ["P/D: first -> second token", prompt_len, pd, pct(gaps["pd"], 90), "-"],
            ["hand-over per request (difference of medians)", prompt_len, pd - col, "-", pd / col]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sections", default="warm,fork,paths,pd")
    parser.add_argument("--warm-mib", type=int, default=256)
    parser.add_argument("--fork-mib", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--chunk-mib", type=int, default=64)
    parser.add_argument("--num-lanes", type=int, default=2)
    parser.add_argument("--tpot-model", default="demo-small", help="'' skips the TPOT-while-forked measurement")
    parser.add_argument("--tpot-seconds", type=float, default=3.0)
    parser.add_argument("--paths-model", default="demo-medium")
    parser.add_argument("--pd-requests", type=int, default=20)
    parser.add_argument("--pd-model", default="demo-small")
    parser.add_argument("--pd-prompt-len", type=int, default=200)
    parser.add_argument("--serve-source", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_source:
        serve_source(args.device, args.fork_mib * MiB, args.tpot_model or None)
        return 0
    sections = set(args.sections.split(","))
    command = "python bench/lifecycle.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"# {command.strip()}  (device {args.device})\n")
    if "warm" in sections:
        rows = bench_warm(args.device, args.warm_mib * MiB, args.repeats, args.chunk_mib * MiB, args.num_lanes)
        print("## Warm -> Active (medians of", args.repeats, "runs)")
        print(table(["path", "MiB", "ms", "GB/s", "speed vs baseline"], rows), "\n")
    if "fork" in sections:
        rows, tpot_rows = bench_fork(args.device, args.fork_mib * MiB, args.repeats, args.tpot_model or None,
                                     args.tpot_seconds)
        print("## Fork (medians of", args.repeats, "runs)")
        print(table(["path", "MiB", "ms", "GB/s", "speed vs baseline"], rows), "\n")
        if tpot_rows:
            print(f"## Source decode step while forked from ({args.tpot_model}, batch 8)")
            print(table(["source", "TPOT p50 ms", "TPOT p99 ms", "steps", "p50 vs alone"], tpot_rows), "\n")
    if "paths" in sections:
        rows = asyncio.run(bench_paths(args.device, args.paths_model, args.repeats))
        print(f"## Bringing {args.paths_model} up, through the lifecycle controller (medians of {args.repeats})")
        print(table(["path", "weights MiB", "fill ms", "verify ms", "total ms", "speed vs cold load"], rows), "\n")
    if "pd" in sections:
        rows = asyncio.run(bench_pd(args.device, args.pd_requests, args.pd_model, args.pd_prompt_len))
        print(f"## P/D hand-over ({args.pd_model}, {args.pd_requests} requests each, sequential)")
        print(table(["path", "prompt tokens", "median ms", "p90 ms", "vs colocated"], rows), "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

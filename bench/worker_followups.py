"""Worker follow-ups: the weights' checksum on a CPU, and what building an engine without reading its checkpoint saves
(Cold -> Warm straight into host memory, a fork onto a cold target). Every figure beside a baseline of the same run.

    .venv/bin/python bench/worker_followups.py                    # all sections, CPU (~1 min)
    .venv/bin/python bench/worker_followups.py --sections compaction --rounds 10
    .venv/bin/python bench/worker_followups.py --sections checksum --checksum-mib 512

checksum: the one checksum of host and device copies ("w64", worker/engine/checksum.py) on a CPU tensor, against
          zlib's CRC-32 over the same bytes (what the lifecycle used for host memory) and against the previous
          device-independent checksum (int16 words widened to int64, what the engine used), on a smaller slice.
build:    a demo model's instance in a CPU page pool, brought Cold -> Warm: before, an engine that reads the checkpoint
          into device pages, copied device -> host; now, an engine built without weights, the checkpoint read into
          the host buffer and checksummed there. And the engine build of a fork target, with and without reading
          the checkpoint (the pull that follows is the same either way).
compaction: two models sharing a pool under bursts of requests, with the worker's compaction between steps
          (default policy) and without: wall time of the same workload, time spent in the compactor, and the pool's
          fragmentation after every step.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import table  # noqa: E402

MiB = 1 << 20
NUM_POOL_PAGES = 200
NUM_REQUESTS_PER_MODEL = 10


def _median_ms(fn, repeats: int) -> float:
    fn()  # warm caches and lazy imports
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) * 1e3)
    return statistics.median(samples)


def _previous_checksum(data) -> str:
    """The engine's checksum before the w64 one (kept here only as the baseline): int16 words widened to int64,
    plain and position-weighted sums with 16-bit weights."""
    import torch

    total_plain = total_weighted = done = 0
    for start in range(0, data.numel(), 16 * MiB):
        words = data[start:start + 16 * MiB].view(torch.int16).to(torch.int64)
        index = torch.arange(done, done + words.numel(), dtype=torch.int64)
        weights = ((index * 40503) >> 5) & 0xFFFF
        total_plain += int(words.sum())
        total_weighted += int((words * weights).sum())
        done += words.numel()
    return f"{total_plain:x}{total_weighted:x}"


def bench_checksum(num_mib: int, repeats: int) -> None:
    import torch

    from worker.engine.checksum import _device_sums, bytes_checksum

    torch.set_num_threads(1)
    data = torch.randint(0, 256, (num_mib * MiB,), dtype=torch.uint8)
    small = data[: min(num_mib, 32) * MiB]
    rows = []
    crc_ms = _median_ms(lambda: zlib.crc32(memoryview(data.numpy())), repeats)
    for name, fn, nbytes in (
            ("zlib CRC-32, host memory only (baseline)", lambda: zlib.crc32(memoryview(data.numpy())), data.numel()),
            ("w64 host path (numpy), same value on any device", lambda: bytes_checksum(data), data.numel()),
            ("w64 device path (torch int64) run on the CPU", lambda: _device_sums(data), data.numel()),
            ("previous device-independent sum (int16 -> int64)", lambda: _previous_checksum(small), small.numel())):
        ms = crc_ms if "baseline" in name else _median_ms(fn, repeats)
        gbps = nbytes / (ms * 1e6)
        crc_gbps = data.numel() / (crc_ms * 1e6)
        rows.append([name, f"{nbytes // MiB}", f"{ms:.1f}", f"{gbps:.2f}", f"{gbps / crc_gbps:.2f}"])
    print(f"\n## checksum, 1 thread, medians of {repeats}\n")
    print(table(["checksum", "MiB", "ms", "GB/s", "vs CRC-32"], rows))


def bench_build(model: str, repeats: int) -> None:
    import torch

    from contracts import InstanceRole, Pool
    from worker.engine.demo import make_demo_models
    from worker.engine.engine import EngineConfig, LLMEngine
    from worker.lifecycle.instance import ModelInstance
    from worker.xtensor import XTensor, XTensorConfig

    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="janus-bench-followups-"))
    model_dir = make_demo_models(root, [model])[model]
    num_weight_bytes = LLMEngine(model_dir, config=EngineConfig(kv_cache_bytes=MiB)).weight_layout.total_bytes
    pool = XTensor.open("cpu", num_weight_bytes * 2 + 64 * MiB, XTensorConfig(is_background_refill=False))

    def build(path, owner, load_weights=True):
        return LLMEngine(path, config=EngineConfig(kv_cache_bytes=8 * MiB), kv_source=pool, weight_source=pool,
                         owner=owner, load_weights=load_weights)

    counter = iter(range(10_000))

    def instance() -> ModelInstance:
        return ModelInstance("w", model, f"{model}-{next(counter)}", InstanceRole.COLOCATED, Pool.STEADY, model_dir,
                             pool, build)

    def cold_to_warm_before() -> None:
        inst = instance()
        inst.build(True)
        inst.record_segments()
        inst.snapshot_to_host()
        inst.release_device_pages()
        inst.release_everything()

    def cold_to_warm_now() -> None:
        inst = instance()
        inst.build(False)
        inst.load_into_host()
        inst.release_device_pages()
        inst.release_everything()

    def fork_target_build(load_weights: bool):
        def run() -> None:
            inst = instance()
            inst.build(load_weights)
            inst.release_everything()
        return run

    try:
        before = _median_ms(cold_to_warm_before, repeats)
        now = _median_ms(cold_to_warm_now, repeats)
        with_load = _median_ms(fork_target_build(True), repeats)
        without = _median_ms(fork_target_build(False), repeats)
    finally:
        pool.close()
    print(f"\n## engine build without the checkpoint ({model}, {num_weight_bytes / MiB:.1f} MiB of weights, "
          f"medians of {repeats})\n")
    print(table(["path", "ms", "vs baseline"], [
        ["Cold -> Warm: load into device pages, copy device -> host (baseline)", f"{before:.1f}", "1.00"],
        ["Cold -> Warm: engine without weights, checkpoint -> host + checksums", f"{now:.1f}", f"{now / before:.2f}"],
        ["fork target's engine build, reading the checkpoint (baseline)", f"{with_load:.1f}", "1.00"],
        ["fork target's engine build, no checkpoint read", f"{without:.1f}", f"{without / with_load:.2f}"],
    ]))


def bench_compaction(num_rounds: int) -> None:
    """Two models share a pool; bursts of requests of mixed lengths interleave their KV pages. The same workload with
    the worker's compaction between steps and without it: wall time (the cost) and the pool's fragmentation."""
    import torch

    from contracts import InstanceRole, Pool, SamplingParams
    from worker.shell.compactor import Compactor
    from worker.core.compaction import CompactionPolicy
    from worker.engine.demo import make_demo_models
    from worker.engine.engine import EngineConfig, LLMEngine
    from worker.lifecycle.instance import ModelInstance
    from worker.xtensor import XTensor, XTensorConfig

    torch.set_num_threads(1)
    page = 256 * 1024
    dirs = make_demo_models(Path(tempfile.mkdtemp(prefix="janus-bench-compaction-")), ["demo-tiny", "demo-small"])

    def run(policy: CompactionPolicy) -> tuple[float, float, float, int, float]:
        pool = XTensor.open("cpu", NUM_POOL_PAGES * page, XTensorConfig(page_size_bytes=page))
        try:
            pairs = []
            for name in ("demo-tiny", "demo-small"):
                engine = LLMEngine(dirs[name], config=EngineConfig(kv_cache_bytes=96 * page, max_num_seqs=16),
                                   kv_source=pool, weight_source=pool, owner=name)
                inst = ModelInstance("w", name, name, InstanceRole.COLOCATED, Pool.STEADY, dirs[name], pool, None)
                inst.engine = engine
                pairs.append((inst, engine))
            compactor = Compactor(pool, policy)
            fragmentation = []
            compactor_s = 0.0
            started = time.perf_counter()
            for r in range(num_rounds):
                for k, (_, engine) in enumerate(pairs):
                    for i in range(NUM_REQUESTS_PER_MODEL):
                        prompt = [(r * 131 + i * 17 + j * 7 + k) % 900 + 3 for j in range(100 + 150 * ((i + r) % 4))]
                        engine.add_request(f"r{r}-{k}-{i}", prompt, SamplingParams(
                            max_tokens=4 + 8 * ((i + k) % 4), temperature=0, ignore_eos=True))
                while any(engine.has_unfinished() for _, engine in pairs):
                    for inst, engine in pairs:
                        if engine.has_unfinished():
                            engine.step()
                        before = time.perf_counter()
                        compactor.between_steps(inst, engine)
                        compactor_s += time.perf_counter() - before
                        fragmentation.append(pool.counters().fragmentation)
            wall_ms = (time.perf_counter() - started) * 1e3
            return (wall_ms, statistics.mean(fragmentation), max(fragmentation), pool.stats().num_pages_copied,
                    compactor_s * 1e3)
        finally:
            pool.close()

    off, on = [], []
    for _ in range(2):  # alternated: the box's load drifts between runs
        off.append(run(CompactionPolicy(max_moves_per_step=0)))
        on.append(run(CompactionPolicy()))
    off_ms, on_ms = statistics.median(r[0] for r in off), statistics.median(r[0] for r in on)
    _, off_mean, off_max, _, _ = off[-1]
    _, on_mean, on_max, copied, compactor_ms = on[-1]
    print(f"\n## compaction between steps (demo-tiny + demo-small on one pool of {NUM_POOL_PAGES} x 256 KiB pages, "
          f"{num_rounds} rounds of {2 * NUM_REQUESTS_PER_MODEL} requests)\n")
    print(table(["run", "wall ms (median of 2)", "vs baseline", "in the compactor ms", "mean fragmentation",
                 "max fragmentation", "pages copied"], [
        ["no compaction (baseline)", f"{off_ms:.0f}", "1.00", "-", f"{off_mean:.4f}", f"{off_max:.4f}", "0"],
        ["compaction between steps (default policy)", f"{on_ms:.0f}", f"{on_ms / off_ms:.2f}", f"{compactor_ms:.0f}",
         f"{on_mean:.4f}", f"{on_max:.4f}", str(copied)],
    ]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sections", default="checksum,build,compaction")
    parser.add_argument("--rounds", type=int, default=6, help="compaction: rounds of bursts")
    parser.add_argument("--checksum-mib", type=int, default=256)
    parser.add_argument("--model", default="demo-medium")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    sections = set(args.sections.split(","))
    if "checksum" in sections:
        bench_checksum(args.checksum_mib, args.repeats)
    if "build" in sections:
        bench_build(args.model, args.repeats)
    if "compaction" in sections:
        bench_compaction(args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""xTensor: what mapping a page through the pool costs beside the raw backend call, what a KV page from the mapped
cache costs beside mapping it on demand, and how fragmented the pool is after 1 M random operations of mixed models.

    .venv/bin/python bench/xtensor.py                      # CPU: memfd + mmap
    .venv/bin/python bench/xtensor.py --device cuda:0      # CUDA VMM, beside raw cuMemCreate/cuMemMap/... calls
    .venv/bin/python bench/xtensor.py --only frag --num-ops 1000000

Every figure sits beside a baseline measured in the same run; timed loops interleave the measured path and its
baseline call by call, so both see the same machine load.
"""
from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import pct, table  # noqa: E402
from worker.xtensor import XTensor, XTensorConfig  # noqa: E402
from worker.xtensor.page_allocator import PageAllocator  # noqa: E402

MiB = 1 << 20
now_ns = time.perf_counter_ns


def _us(samples_ns: list[int], q: float) -> float:
    return pct(samples_ns, q) / 1000.0


# ---- 1. per-page map / unmap ---------------------------------------------------------------------------------------
def raw_calls(pool: XTensor, is_populate: bool):
    """(map(page_id, address, num_pages), unmap(address, num_pages), label): the backend's raw calls, no pool."""
    backend = pool.backend
    page = pool.page_size_bytes
    if backend.device.kind == "cpu":
        from worker.xtensor.backends.cpu import MAP_POPULATE, raw_map, raw_unmap_keep_reserved

        flags = MAP_POPULATE if is_populate else 0
        return (lambda page_id, address, n: raw_map(address, n * page, backend.fd, page_id * page, flags),
                lambda address, n: raw_unmap_keep_reserved(address, n * page),
                "mmap(MAP_FIXED, memfd) / mmap(PROT_NONE)")
    from cuda.bindings import driver as cu

    from worker.xtensor.backends.cuda import checked

    handles: dict[int, object] = {}

    def cuda_map(page_id: int, address: int, n: int) -> None:  # what a pool without prepared handles pays
        for i in range(n):
            handle = checked(cu.cuMemCreate(page, backend.allocation_prop, 0), "cuMemCreate")
            checked(cu.cuMemMap(address + i * page, page, 0, handle, 0), "cuMemMap")
            handles[address + i * page] = handle
        checked(cu.cuMemSetAccess(address, n * page, [backend.access_desc], 1), "cuMemSetAccess")

    def cuda_unmap(address: int, n: int) -> None:
        for i in range(n):
            checked(cu.cuMemUnmap(address + i * page, page), "cuMemUnmap")
            checked(cu.cuMemRelease(handles.pop(address + i * page)), "cuMemRelease")

    return cuda_map, cuda_unmap, "cuMemCreate+cuMemMap+cuMemSetAccess / cuMemUnmap+cuMemRelease"


def _plan_trim(pool: XTensor, owner: str):
    """(view, slots): what a maintenance pass plans for an owner above its high watermark (its own code, under the
    pool lock), for timing the rest of that trim apart."""
    with pool._lock:
        kv = pool._owners[owner].kv
        return kv, pool._start_trim(kv, len(kv.cached_slots) - pool._high)


def bench_map_unmap(device: str, num_iters: int, batch_pages: int, is_populate: bool) -> list[list[object]]:
    """`is_populate` False: lazy maps (the cheapest raw call, so the pool's bookkeeping shows most); True: pages
    populated at map time (MAP_POPULATE), as the pool maps KV and weights in production. No hole punching on either
    side: both do the same kernel work. "unmap 1 page" times a whole maintenance pass, which also scans every owner
    and plans before it unmaps; "commit alone" times the same trim (the pass's own functions) with the scan and plan
    left out, to show how much of the gap each part is."""
    page = 2 * MiB
    config = XTensorConfig(kv_low_watermark_pages=0, kv_high_watermark_pages=0, is_background_refill=False,
                           is_populate=is_populate, is_discard_on_free=False)
    pool = XTensor.open(device, (2 * batch_pages + 8) * page, config)
    batch_every = 1 if is_populate else 8  # populated maps are slow and noisy: sample the batch every time
    try:
        raw_map, raw_unmap, raw_label = raw_calls(pool, is_populate)
        raw_base = pool.backend.reserve(batch_pages)
        pool.reserve_kv("m", batch_pages, device)
        samples = {key: [] for key in ("raw_map", "raw_unmap", "xt_map", "xt_unmap", "xt_unmap_commit",
                                       "raw_map_b", "raw_unmap_b", "xt_map_b", "xt_unmap_b")}
        gc.disable()
        for i in range(num_iters):
            # single page: raw call, then the pool's on-demand path (a cache miss) and its trim pass
            t0 = now_ns(); raw_map(batch_pages + 4, raw_base, 1); t1 = now_ns()  # noqa: E702
            raw_unmap(raw_base, 1); t2 = now_ns()  # noqa: E702
            slots = pool.acquire_kv_pages("m", 1); t3 = now_ns()  # noqa: E702
            pool.release_kv_pages("m", slots)
            t4 = now_ns(); pool._kv_maintenance_pass(); t5 = now_ns()  # noqa: E702
            samples["raw_map"].append(t1 - t0); samples["raw_unmap"].append(t2 - t1)  # noqa: E702
            samples["xt_map"].append(t3 - t2); samples["xt_unmap"].append(t5 - t4)  # noqa: E702
            # the same trim split: the pass's scan and plan untimed, its unmap + return to the pool timed
            pool.release_kv_pages("m", pool.acquire_kv_pages("m", 1))
            kv, slots = _plan_trim(pool, "m")
            t6 = now_ns(); pool._finish_trim("m", kv, slots); t7 = now_ns()  # noqa: E702
            samples["xt_unmap_commit"].append(t7 - t6)
            if i % batch_every:
                continue
            # a batch of pages: raw, one call over a contiguous run; pool, one refill pass / one trim pass
            t0 = now_ns(); raw_map(batch_pages + 4, raw_base, batch_pages); t1 = now_ns()  # noqa: E702
            raw_unmap(raw_base, batch_pages); t2 = now_ns()  # noqa: E702
            pool._low, pool._high = batch_pages, batch_pages  # knobs set directly: a bench-only shortcut
            t3 = now_ns(); pool._kv_maintenance_pass(); t4 = now_ns()  # noqa: E702
            pool._low, pool._high = 0, 0
            t5 = now_ns(); pool._kv_maintenance_pass(); t6 = now_ns()  # noqa: E702
            for key, value in (("raw_map_b", t1 - t0), ("raw_unmap_b", t2 - t1), ("xt_map_b", t4 - t3),
                               ("xt_unmap_b", t6 - t5)):
                samples[key].append(value / batch_pages)
        gc.enable()
        assert pool.stats().num_kv_pages_refilled >= batch_pages and pool.counters().num_pages_free == pool.num_pages
    finally:
        gc.enable()
        pool.close()
    rows = []
    for label, raw_key, xt_key, path in (
            ("map 1 page", "raw_map", "xt_map", "acquire_kv_pages miss (on-demand map)"),
            ("unmap 1 page", "raw_unmap", "xt_unmap", "trim pass: unmap + return to pool"),
            ("unmap 1 page, commit alone", "raw_unmap", "xt_unmap_commit", "trim pass less its scan and plan"),
            (f"map, per page of {batch_pages}", "raw_map_b", "xt_map_b", "refill pass (background thread's work)"),
            (f"unmap, per page of {batch_pages}", "raw_unmap_b", "xt_unmap_b", "trim pass")):
        raw_med, xt_med = _us(samples[raw_key], 50), _us(samples[xt_key], 50)
        rows.append([label, path, raw_med, xt_med, xt_med / raw_med, _us(samples[raw_key], 99),
                     _us(samples[xt_key], 99)])
    mode = "populated (MAP_POPULATE)" if is_populate else "lazy"
    print(f"\nper-page map/unmap on {device}, 2 MiB pages, {mode}, {num_iters} iterations (raw: {raw_label})")
    print(table(["op", "xTensor path", "raw med us", "xTensor med us", "ratio", "raw p99 us", "xTensor p99 us"],
                rows))
    return rows


# ---- 2. KV page allocation from the mapped cache -------------------------------------------------------------------
def _take_and_release(sources: dict, on_demand: XTensor, num_cycles: int, pages_per_cycle: int,
                      gap_s: float) -> dict[str, list[int]]:
    samples: dict[str, list[int]] = {name: [] for name in sources}
    names = list(sources)
    gc.disable()
    try:
        for cycle in range(num_cycles):
            held: dict[str, list[int]] = {name: [] for name in sources}
            for take in range(pages_per_cycle):
                shift = (cycle + take) % len(names)  # rotate who goes first: it pays for the wake-up after a gap
                for name in names[shift:] + names[:shift]:
                    source = sources[name]
                    t0 = now_ns()
                    slots = source.acquire_kv_pages("m", 1)
                    elapsed = now_ns() - t0
                    if slots is None:
                        raise RuntimeError(f"{name}: no page for take {len(held[name]) + 1}")
                    samples[name].append(elapsed)
                    held[name] += slots
                if gap_s:
                    time.sleep(gap_s)  # the engine's work between two page takes (torch releases the GIL)
            for name, source in sources.items():
                source.release_kv_pages("m", held[name])
            on_demand.run_kv_maintenance()  # cache off: its released pages really go back (no thread does it)
            time.sleep(0.002)
    finally:
        gc.enable()
    return samples


def bench_kv_allocation(device: str, num_cycles: int, gap_us: float) -> list[list[object]]:
    """One KV page per take, the engine's way when a sequence's blocks spill onto a new page. Two regimes:
    back-to-back takes within the high watermark (the hot path alone: every take is a cache hit), and a serving
    pattern (32 takes per cycle with `gap_us` of engine work between them: the refill thread keeps the cache up).
    Baselines in the same loop: the same pool with its cache off (each page mapped and populated on the request
    path, as the engine writes it at once) and the engine's plain pool (a free list, no virtual memory)."""
    page = 2 * MiB
    low, high = 2, 8
    cached_cfg = XTensorConfig(kv_low_watermark_pages=low, kv_high_watermark_pages=high, refill_poll_s=0.01)
    on_demand_cfg = XTensorConfig(kv_low_watermark_pages=0, kv_high_watermark_pages=0, is_background_refill=False)
    num_pages = 96
    on_demand = XTensor.open(device, num_pages * page, on_demand_cfg)
    cached = XTensor.open(device, num_pages * page, cached_cfg)
    sources: dict[str, object] = {"xTensor, mapped cache": cached, "xTensor, cache off (map on demand)": on_demand}
    try:
        from worker.engine.kv_pool import PlainKVPageSource

        sources["engine plain pool (no VM)"] = PlainKVPageSource(num_pages, page)
    except ImportError:
        pass
    try:
        for source in sources.values():
            source.reserve_kv("m", 32, device)
        cached.run_kv_maintenance()
        back_to_back = _take_and_release(sources, on_demand, num_cycles * 4, high - low, 0.0)
        regimes = {"back-to-back": back_to_back}
        before = cached.stats()
        regimes[f"serving, {gap_us:.0f} us gaps"] = _take_and_release(sources, on_demand, num_cycles, 32, gap_us / 1e6)
        after = cached.stats()
    finally:
        cached.close()
        on_demand.close()
    hits = after.num_kv_cache_hits - before.num_kv_cache_hits
    misses = after.num_kv_cache_misses - before.num_kv_cache_misses
    rows = []
    for regime, samples in regimes.items():
        cached_med = _us(samples["xTensor, mapped cache"], 50)
        for name, values in samples.items():
            rows.append([regime, name, len(values), _us(values, 50), _us(values, 99), _us(values, 50) / cached_med])
    print(f"\nKV page allocation on {device}, 2 MiB pages, watermarks {low}/{high}; serving-regime cache hit rate "
          f"{hits / max(1, hits + misses):.3f} ({misses} misses)")
    print(table(["regime", "source", "takes", "acquire med us", "acquire p99 us", "median / mapped cache"], rows))
    return rows


# ---- 3. fragmentation after random operations of mixed models ------------------------------------------------------
class NaivePool:
    """Baseline: one free list, first fit from the low end for every kind, no per-model cache (a page freed goes
    straight back)."""

    def __init__(self, num_pages: int) -> None:
        self.allocator = PageAllocator(num_pages)
        self.kv: dict[str, list[int]] = {}
        self.weights: dict[str, list[int]] = {}

    def acquire(self, owner: str, n: int) -> list[int] | None:
        pages = self.allocator.take_low(n)
        if pages is not None:
            self.kv.setdefault(owner, []).extend(pages)
        return pages

    def release(self, owner: str, pages: list[int]) -> None:
        for p in pages:
            self.kv[owner].remove(p)
        self.allocator.free_pages(pages)

    def load(self, owner: str, n: int) -> bool:
        pages = self.allocator.take_low(n)
        if pages is None:
            return False
        self.weights[owner] = pages
        return True

    def unload(self, owner: str) -> None:
        self.allocator.free_pages(self.weights.pop(owner))


def run_mixed_workload(num_ops: int, seed: int, num_pages: int, system, *, is_xtensor: bool,
                       compact_moves: int = 0) -> list[float]:
    """8 models with bursty KV demand: each walks towards its own target number of KV pages (taking or freeing 1-4
    pages per op), and targets jump now and then (~2000 jumps per 1 M ops), so models trade pages; rarely (~20 times
    per 1 M ops each) a model reloads its weights at another size, or (xTensor) sleeps or wakes. Returns the
    fragmentation sampled every 10 k ops."""
    rng = random.Random(seed)
    owners = [f"model-{i}" for i in range(8)]
    held: dict[str, list[int]] = {o: [] for o in owners}
    asleep: set[str] = set()
    samples: list[float] = []

    def weight_pages() -> int:
        return rng.randint(num_pages // 64, num_pages // 24)

    for owner in owners:
        if is_xtensor:
            system.allocate_weights(owner, weight_pages() * system.page_size_bytes, system.device)
            system.reserve_kv(owner, num_pages // 4, system.device)
        else:
            system.load(owner, weight_pages())
    # Targets sum to ~70 % of what the weights leave on average, more during coinciding bursts.
    mean_target = 0.7 * (num_pages - len(owners) * (num_pages // 64 + num_pages // 24) // 2) / len(owners)
    target = {o: rng.uniform(0, 2 * mean_target) for o in owners}
    for op in range(num_ops):
        owner = rng.choice(owners)
        roll = rng.random()
        if roll < 0.002:
            target[owner] = rng.uniform(0, 2 * mean_target)
        if roll < 0.00002 and owner not in asleep:  # a model swap (rare: ~20 per 1 M ops): reload at another size
            size = weight_pages()
            if is_xtensor:
                system.release_weights(owner)
                try:
                    system.allocate_weights(owner, size * system.page_size_bytes, system.device)
                except MemoryError:
                    pass
            else:
                if owner in system.weights:
                    system.unload(owner)
                system.load(owner, size)
        elif roll < 0.00004 and is_xtensor:  # lifecycle: sleep, later wake (pages come and go in bulk)
            if owner in asleep:
                try:
                    system.wake(owner)
                    asleep.discard(owner)
                except MemoryError:
                    pass
            else:
                system.sleep(owner)
                asleep.add(owner)
        elif owner in asleep:
            pass
        elif len(held[owner]) < target[owner]:
            n = rng.randint(1, 4)
            pages = system.acquire_kv_pages(owner, n) if is_xtensor else system.acquire(owner, n)
            if pages is not None:
                held[owner] += pages
        elif held[owner]:
            n = min(len(held[owner]), rng.randint(1, 4))
            chosen = rng.sample(held[owner], n)
            for p in chosen:
                held[owner].remove(p)
            if is_xtensor:
                system.release_kv_pages(owner, chosen)
                if compact_moves:
                    system.compact(owner, compact_moves)  # the owner's engine thread, right after the step freed
            else:
                system.release(owner, chosen)
        if is_xtensor and op % 16 == 0:
            system.run_kv_maintenance()  # the refill thread's work, at a fixed cadence so the run replays
        if op % 10_000 == 9_999:
            samples.append(system.counters().fragmentation if is_xtensor else system.allocator.fragmentation())
    return samples


def bench_fragmentation(device: str, num_ops: int, seed: int, compact_moves: int,
                        is_ablation: bool) -> list[list[object]]:
    """Fragmentation is a page-count figure: 64 KiB pages keep the copies of compaction (and memory) small."""
    num_pages, page = 2048, 64 * 1024
    config = XTensorConfig(page_size_bytes=page, is_background_refill=False, is_populate=False,
                           is_discard_on_free=False)
    rows = []
    variants = [(f"xTensor (KV low, weights high best-fit, mapped cache, compaction <= {compact_moves} moves/release)",
                 compact_moves)] + ([("xTensor without compaction", 0)] if is_ablation else [])
    for name, moves in variants:
        started = time.monotonic()
        with XTensor.open(device, num_pages * page, config) as pool:
            frag = run_mixed_workload(num_ops, seed, num_pages, pool, is_xtensor=True, compact_moves=moves)
            stats, free = pool.stats(), pool.counters().num_pages_free
        rows.append([name, 100 * frag[-1], 100 * sum(frag) / len(frag), 100 * max(frag), free,
                     f"{stats.num_pages_compacted} ({stats.num_pages_copied})", time.monotonic() - started])
    started = time.monotonic()
    naive = NaivePool(num_pages)
    frag = run_mixed_workload(num_ops, seed, num_pages, naive, is_xtensor=False)
    rows.append(["baseline: first fit from the low end, no cache", 100 * frag[-1], 100 * sum(frag) / len(frag),
                 100 * max(frag), naive.allocator.num_free, "0", time.monotonic() - started])
    print(f"\nfragmentation (free pages outside the largest free run / free pages) after {num_ops} random ops of 8 "
          f"models on a {num_pages}-page pool ({device}), sampled every 10 k ops")
    print(table(["allocator", "final %", "mean %", "max %", "free pages at end", "pages moved (copied)", "run s"],
                rows))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--only", choices=["map", "alloc", "frag"], default=None)
    parser.add_argument("--num-iters", type=int, default=5000, help="per-page map/unmap iterations")
    parser.add_argument("--num-cycles", type=int, default=60, help="KV allocation cycles")
    parser.add_argument("--gap-us", type=float, default=1000, help="engine work between two KV page takes")
    parser.add_argument("--num-ops", type=int, default=1_000_000, help="fragmentation workload operations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ablation", action="store_true", help="also run the pool without compaction")
    parser.add_argument("--compact-moves", type=int, default=8,
                        help="compaction budget of an owner after each of its KV releases (between engine steps)")
    args = parser.parse_args()
    print("command: .venv/bin/python bench/xtensor.py " + " ".join(sys.argv[1:]))
    if args.only in (None, "map"):
        bench_map_unmap(args.device, args.num_iters, batch_pages=8, is_populate=False)
        if args.device == "cpu":
            bench_map_unmap(args.device, max(1, args.num_iters // 4), batch_pages=8, is_populate=True)
    if args.only in (None, "alloc"):
        bench_kv_allocation(args.device, args.num_cycles, gap_us=args.gap_us)
    if args.only in (None, "frag"):
        bench_fragmentation(args.device, args.num_ops, args.seed, args.compact_moves, args.ablation)


if __name__ == "__main__":
    main()

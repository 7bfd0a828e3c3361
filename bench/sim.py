"""Simulator benchmarks (issue 9): what the design choices buy, each beside its baseline in the same run.

1. Step-time evaluation: sim.costmodel.StepCost against oracle.roofline.RooflineModel, per call.
2. Runs of identical rounds against one event per decode round (MAX_ROUNDS_PER_RUN = 1): events, CPU time, and the
   token attainment each gives (the aggregation must not change the answer).
3. Simulation speed per system on the same window of the headline trace: requests per CPU second, and against the
   static partition's speed.

    .venv/bin/python bench/sim.py [--window-s 60]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import table  # noqa: E402
from oracle.roofline import RooflineModel  # noqa: E402
from oracle.specs import device, model_shape  # noqa: E402
from sim import executor  # noqa: E402
from sim.costmodel import StepCost  # noqa: E402
from sim.runner import ScenarioSpec, run_one  # noqa: E402


def bench_step_cost(num_calls: int = 20_000) -> list[list[object]]:
    rm = RooflineModel(device("ascend-910c-die"), model_shape("qwen2.5-32b"), 2)
    cost = StepCost(rm)
    rows = []
    for name, fast, slow in (
        ("decode step", lambda i: cost.decode_s(1 + i % 200, 1000 * (1 + i % 200)),
         lambda i: rm.decode_step_ms(1 + i % 200, 1000 * (1 + i % 200))),
        ("prefill", lambda i: cost.prefill_s(64 + i % 4000), lambda i: rm.prefill_ms(64 + i % 4000)),
    ):
        t0 = time.process_time()
        for i in range(num_calls):
            fast(i)
        fast_us = (time.process_time() - t0) / num_calls * 1e6
        t0 = time.process_time()
        for i in range(num_calls // 10):
            slow(i)
        slow_us = (time.process_time() - t0) / (num_calls // 10) * 1e6
        rows.append([name, f"{fast_us:.2f}", f"{slow_us:.2f}", f"{slow_us / fast_us:.1f}x"])
    return rows


def bench_aggregation(window_s: float) -> list[list[object]]:
    spec = ScenarioSpec(window_s=window_s, oracle="clairvoyant")  # as docs/benchmarks.md's figures were taken
    rows = []
    saved = executor.MAX_ROUNDS_PER_RUN
    results = {}
    try:
        for label, rounds in (("runs of up to 128 rounds", saved), ("one event per round (baseline)", 1)):
            executor.MAX_ROUNDS_PER_RUN = rounds
            r = run_one(spec, "static")
            results[label] = r
    finally:
        executor.MAX_ROUNDS_PER_RUN = saved
    base = results["one event per round (baseline)"]
    for label, r in results.items():
        rows.append([label, r.counters["events"], f"{r.cpu_s:.1f}", f"{base.cpu_s / r.cpu_s:.2f}x",
                     f"{r.summary.token_attainment:.4f}",
                     f"{r.summary.token_attainment - base.summary.token_attainment:+.4f}"])
    return rows


def bench_systems(window_s: float, systems: list[str]) -> list[list[object]]:
    spec = ScenarioSpec(window_s=window_s, oracle="clairvoyant")  # as docs/benchmarks.md's figures were taken
    results = [run_one(spec, s) for s in systems]
    base = next(r for r in results if r.system == "static")
    rows = []
    for r in results:
        rate = r.summary.num_requests / r.cpu_s
        rows.append([r.system, r.summary.num_requests, f"{r.cpu_s:.1f}", f"{rate:,.0f}",
                     f"{rate / (base.summary.num_requests / base.cpu_s):.2f}", f"{window_s / r.cpu_s:.2f}"])
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--window-s", type=float, default=60.0, help="first seconds of the headline trace")
    p.add_argument("--systems", default="static,janus,prism-like,blitzscale-like,steady-only,elastic-only")
    args = p.parse_args()
    print("## step-time evaluation (us per call, CPU time)\n")
    print(table(["step", "StepCost", "RooflineModel (baseline)", "speed-up"], bench_step_cost()))
    print(f"\n## iteration runs vs one event per round (static partition, first {args.window_s:.0f} s)\n")
    print(table(["engine", "events", "CPU s", "speed-up vs baseline", "token attainment", "difference"],
                bench_aggregation(args.window_s)))
    print(f"\n## simulation speed per system (first {args.window_s:.0f} s of the headline trace)\n")
    print(table(["system", "requests", "CPU s", "requests / CPU s", "vs static", "simulated s / CPU s"],
                bench_systems(args.window_s, args.systems.split(","))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""python -m oracle.profile: profile a demo (or any local Qwen2/Llama) checkpoint on this CPU.

    python -m oracle.profile --model demo-tiny --out artifacts/oracle/demo-tiny.json
    python -m oracle.profile --model-dir path/to/checkpoint --points-per-cell 4 --replicas 1 2 --seed 1
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from .grid import LengthMix
from .harness import CLOCKS, DEFAULT_MIXES, HarnessSettings, Profiler, capacity_rps, profile_model, random_grid


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="demo-tiny", help="demo model name (written if missing)")
    parser.add_argument("--model-dir", help="a checkpoint folder instead of a demo model")
    parser.add_argument("--models-root", default=os.environ.get("JANUS_DEMO_MODELS", ".janus/models"))
    parser.add_argument("--out", required=True, help="training set JSON to write")
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--points-per-cell", type=int, default=5, help="loads per (length mix, m)")
    parser.add_argument("--duration-s", type=float, default=HarnessSettings.duration_s)
    parser.add_argument("--drain-s", type=float, default=HarnessSettings.drain_s)
    parser.add_argument("--ttft-slo-ms", type=float, default=HarnessSettings.ttft_slo_ms)
    parser.add_argument("--tpot-slo-ms", type=float, default=HarnessSettings.tpot_slo_ms)
    parser.add_argument("--clock", choices=CLOCKS, default=HarnessSettings.clock,
                        help="what advances a replica's clock: the engine thread's CPU time, wall time (a dedicated "
                             "machine), or a step-cost model fitted at start to the quickest timings of each step "
                             "shape (a shared machine's drift left out; oracle/profile/step_cost.py)")
    parser.add_argument("--speed-probe", action="store_true",
                        help="scale each grid point's clock by the machine's speed now against its quietest "
                             "(a shared machine's drift; oracle/profile/speed.py)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mixes", nargs="*", help="name:input_mean:input_cv:output_mean (default: short, chat, long)")
    args = parser.parse_args(argv)

    if args.model_dir:
        model_dir = Path(args.model_dir)
    else:
        from worker.engine.demo import make_demo_models

        model_dir = make_demo_models(args.models_root, [args.model])[args.model]
    mixes = DEFAULT_MIXES
    if args.mixes:
        mixes = tuple(LengthMix(n, float(i), float(cv), float(o))
                      for n, i, cv, o in (m.split(":") for m in args.mixes))
    settings = HarnessSettings(duration_s=args.duration_s, drain_s=args.drain_s, ttft_slo_ms=args.ttft_slo_ms,
                               tpot_slo_ms=args.tpot_slo_ms, clock=args.clock, seed=args.seed,
                               is_speed_corrected=args.speed_probe)
    started = time.perf_counter()
    profiler = Profiler(model_dir, settings, max_replicas=max(args.replicas))
    if profiler.step_cost is not None:
        c = profiler.step_cost
        print(f"step-cost clock: {', '.join(f'{x:.3g}' for x in c.coef)} s; fit error median "
              f"{100 * c.fit_median_error:.1f} %, p90 {100 * c.fit_p90_error:.1f} %")
    e = profiler.roofline.efficiency
    print(f"calibrated roofline on {profiler.roofline.device.name}: mfu={e.mfu:.3g} mbu={e.mbu:.3g} "
          f"overhead={e.step_overhead_ms:.2f} ms")
    # The knee of each mix, measured: the roofline's estimate (calibrated on isolated steps) only seeds the search,
    # it missed the real knee by 2-4x on demo-tiny, which left a grid of 1.0 attainments.
    capacities, pilots = {}, []
    for mix in mixes:
        estimate = capacity_rps(profiler.roofline, mix, settings.ttft_slo_ms, settings.tpot_slo_ms)
        capacities[mix.name], runs = profiler.measured_capacity_rps(mix, estimate)
        pilots.extend(runs)
        print(f"{mix.name}: roofline knee {estimate:.1f} rps, measured {capacities[mix.name]:.1f} rps per replica")
    grid = random_grid(capacities, mixes, args.replicas, args.points_per_cell, settings)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    training_set = profile_model(profiler, grid, model=model_dir.name, out_path=args.out,
                                 extra_meta={"pilots": pilots, "capacities_rps": capacities})
    print(f"{len(training_set.elasticity)} elasticity and {len(training_set.capacity)} capacity samples -> "
          f"{args.out} in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

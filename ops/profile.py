"""Profiling the worker's engine on this CPU: the oracle's training set of a checkpoint (docs/oracle.md).

`EngineProfiler` is the harness's Profiler (oracle/profile/harness.py) over the worker's engine (worker/engine): it
lives here, above both, because the oracle and the worker are independent services (docs/architecture.md,
"Layers"); `janus profile --model NAME` and `janus up`'s first start profile through it. Run by hand:

    python -m ops.profile --model demo-tiny --out artifacts/oracle/demo-tiny.json
    python -m ops.profile --model demo-tiny --quick --out /tmp/demo-tiny.json     # the quick plan (run.py)
    python -m ops.profile --model-dir path/to/checkpoint --points-per-cell 4 --replicas 1 2 --seed 1

`janus profile --model NAME` does the same for a model of the cluster config, into <state_dir>/oracle/NAME.json.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import replace
from pathlib import Path

from oracle.profile.harness import CLOCKS, HarnessSettings, Profiler
from oracle.profile.run import FULL, QUICK, ProfileResult, parse_mixes, profile_checkpoint


class EngineProfiler(Profiler):
    """The harness's Profiler over `max_replicas` of the worker's engines for the checkpoint at `model_dir`, on
    this CPU (one torch thread each by default: steadier timings on a shared machine)."""

    def __init__(self, model_dir: str | Path, settings: HarnessSettings = HarnessSettings(), max_replicas: int = 4):
        import torch

        torch.set_num_threads(settings.torch_threads)
        super().__init__(model_dir, settings, max_replicas=max_replicas)

    def new_engine(self, kv_cache_bytes: int):
        from worker.engine.config import EngineConfig
        from worker.engine.engine import LLMEngine

        config = EngineConfig(kv_cache_bytes=kv_cache_bytes, max_num_seqs=self.settings.max_num_seqs,
                              seed=self.settings.seed)
        return LLMEngine(self.model_dir, device="cpu", config=config)


def profile_engine(model_dir: str | Path, out_path: str | Path, **kwargs) -> ProfileResult:
    """`profile_checkpoint` (oracle/profile/run.py: knee search, grid, training set) on the worker's engine on this
    CPU; `kwargs` are profile_checkpoint's (model, plan, settings, extra_meta, ...)."""
    return profile_checkpoint(model_dir, out_path, **kwargs,
                              make_profiler=lambda settings, n: EngineProfiler(model_dir, settings, max_replicas=n))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="demo-tiny", help="demo model name (written if missing)")
    parser.add_argument("--model-dir", help="a checkpoint folder instead of a demo model")
    parser.add_argument("--models-root", default=os.environ.get("JANUS_DEMO_MODELS", ".janus/models"))
    parser.add_argument("--out", required=True, help="training set JSON to write")
    parser.add_argument("--quick", action="store_true",
                        help="the quick plan: 27 points (every m below, at and past its knee), shorter runs")
    parser.add_argument("--replicas", type=int, nargs="+", help="replica counts (default 1 2 3)")
    parser.add_argument("--points-per-cell", type=int,
                        help="loads per (length mix, m), drawn in 0.3..2.0 x the knee (default 5; with --quick: "
                             "replaces its three bands)")
    parser.add_argument("--duration-s", type=float, help="virtual seconds of arrivals per point (2, quick 1.5)")
    parser.add_argument("--drain-s", type=float, default=HarnessSettings.drain_s)
    parser.add_argument("--ttft-slo-ms", type=float, default=HarnessSettings.ttft_slo_ms)
    parser.add_argument("--tpot-slo-ms", type=float, default=HarnessSettings.tpot_slo_ms)
    parser.add_argument("--max-num-seqs", type=int, default=HarnessSettings.max_num_seqs,
                        help="the engine's running requests at most")
    parser.add_argument("--hbm-mib", type=int,
                        help="memory the engine is given, weights + KV (HBM needs are fractions of it; default: "
                             "the weights + 64 MiB of KV)")
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
    plan = QUICK if args.quick else FULL
    if args.replicas:
        plan = replace(plan, replicas=tuple(args.replicas))
    if args.points_per_cell:
        plan = replace(plan, points_per_cell=args.points_per_cell, load_bands=())
    if args.duration_s:
        plan = replace(plan, duration_s=args.duration_s)
    if args.mixes:
        plan = replace(plan, mixes=parse_mixes(args.mixes))
    settings = plan.harness_settings(drain_s=args.drain_s, ttft_slo_ms=args.ttft_slo_ms,
                                     tpot_slo_ms=args.tpot_slo_ms, clock=args.clock, seed=args.seed,
                                     is_speed_corrected=args.speed_probe, max_num_seqs=args.max_num_seqs,
                                     hbm_bytes=args.hbm_mib << 20 if args.hbm_mib else None)
    result = profile_engine(model_dir, args.out, model=model_dir.name, plan=plan, settings=settings)
    print(result.summary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

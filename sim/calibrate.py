"""Calibration: the simulator's step times (roofline cost model) against the real engine's measured step times on
this machine.

The engine (worker/engine LLMEngine) runs a demo checkpoint on this CPU, torch on one thread; we time isolated
prefill steps over a range of prompt lengths and decode steps over a range of batch sizes by the CPU time of the
thread that runs them (wall time on a CPU shared with other work measures the others too). The device is this CPU
as `ops.engine_probe.EngineLikeProbe` measures it between the steps; the roofline's mfu and per-step overhead are
fitted by `oracle.profile.calibrate.fit_efficiency` on half of the points and the error is reported on the other
half, so the figure is a prediction error, not a fit residual. mbu is held at 1: the probe reads the weights' bytes
as a step does, so the read speed it measures is the steps' own.

    python -m sim.calibrate --model demo-medium
"""
from __future__ import annotations

import argparse
import os
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

# The stated bounds on the median held-out relative error. Decode is looser: the roofline has a per-step overhead but
# no per-sequence one, and on this CPU the engine's decode step grows with the batch faster than its FLOPs do.
ERROR_BOUND = {"prefill": 0.25, "decode": 0.5}


@dataclass(frozen=True)
class Point:
    kind: str  # "prefill" or "decode"
    size: int  # prompt tokens, or decode batch size
    context_tokens: int
    measured_ms: float
    predicted_ms: float = float("nan")

    @property
    def rel_error(self) -> float:
        return abs(self.predicted_ms - self.measured_ms) / self.measured_ms


@dataclass(frozen=True)
class Measurement:
    points: list[Point]
    device: object  # this CPU (DeviceSpec) as an EngineLikeProbe sampled it between the steps measured


@dataclass(frozen=True)
class Calibration:
    points: list[Point]  # held-out points, with predictions
    fit_points: list[Point]
    efficiency: object
    device: object

    def median_error(self, kind: str) -> float:
        errs = [p.rel_error for p in self.points if p.kind == kind]
        return statistics.median(errs) if errs else float("nan")

    def max_error(self, kind: str) -> float:
        errs = [p.rel_error for p in self.points if p.kind == kind]
        return max(errs) if errs else float("nan")


def _engine(model_dir: Path):
    import torch

    from worker.engine.config import EngineConfig

    torch.set_num_threads(1)
    from worker.engine.engine import LLMEngine

    torch.manual_seed(0)
    return LLMEngine(model_dir, device="cpu", dtype=torch.float32,
                     config=EngineConfig(max_num_seqs=64, max_num_batched_tokens=4096, kv_cache_bytes=512 * 2**20))


def _run_until_idle(engine) -> list[tuple[object, float]]:
    """(step record, ms of this thread's CPU time) per step: with torch on one thread the forward pass runs on
    this thread, so its CPU time is the step's cost even when other processes share the cores."""
    import time

    steps = []
    while engine.has_unfinished():
        start = time.thread_time()
        engine.step()
        steps.append((engine.last_step, 1e3 * (time.thread_time() - start)))
    return steps


def measure(model_dir: Path, prefill_lengths=(32, 64, 128, 256, 512, 1024, 2048),
            decode_batches=(1, 2, 4, 8, 16, 32, 64), decode_prompt=128, repeats=5, seed=0) -> Measurement:
    """The fastest of `repeats` runs of each size, as the device's speeds are taken: on a shared machine other jobs
    only ever add time (caches, memory bandwidth), so the minimum is the step's own cost. The device is sampled
    after every step measured, so the steps and the device see the same stretches of contention."""
    from contracts import SamplingParams
    from oracle.cpu_device import calibrate_cpu
    from ops.engine_probe import EngineLikeProbe

    engine = _engine(model_dir)
    probe = EngineLikeProbe(read_bytes=_weights_bytes(model_dir))
    vocab = engine.model_config.vocab_size
    rng = np.random.default_rng(seed)
    greedy = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    points: list[Point] = []
    counter = 0
    for _ in range(2):  # warm up allocator and kernels
        engine.add_request(f"warm{_}", rng.integers(10, vocab, 64).tolist(), greedy)
        _run_until_idle(engine)
    # rounds, each visiting every size of both phases once: a stretch of contention from other jobs then slows one
    # round of all sizes, not every repeat of one size or one phase, and the fastest round of each size is still a
    # quiet one. Decode steps are memory-bound and slow more under contention than prefill's matmuls do: when
    # decode had its own 4 rounds after prefill's, a stretch over them inflated every decode figure and the fit
    # traded prefill's accuracy for it (docs/bench/sim.md, "Calibration")
    prefill_ms: dict[int, list[float]] = {n: [] for n in prefill_lengths}
    decode_ms: dict[int, list[float]] = {b: [] for b in decode_batches}
    num_decode_steps = 8
    sampling = SamplingParams(max_tokens=num_decode_steps + 1, temperature=0.0, ignore_eos=True)
    for _ in range(repeats):
        for n in prefill_lengths:
            counter += 1
            engine.add_request(f"p{counter}", rng.integers(10, vocab, n).tolist(), greedy)
            steps = _run_until_idle(engine)
            prefill_ms[n].append(sum(ms for s, ms in steps if s.num_prefill_tokens))
            probe.sample()
        for b in decode_batches:
            for _ in range(b):
                counter += 1
                engine.add_request(f"d{counter}", rng.integers(10, vocab, decode_prompt).tolist(), sampling)
            steps = _run_until_idle(engine)
            decode = [ms for s, ms in steps if s.num_decode_tokens == b and not s.num_prefill_tokens]
            if decode:
                decode_ms[b].append(float(np.median(decode)))
            probe.sample()
    points += [Point("prefill", n, 0, float(np.min(times))) for n, times in prefill_ms.items()]
    points += [Point("decode", b, b * (decode_prompt + num_decode_steps // 2), float(np.min(times)))
               for b, times in decode_ms.items() if times]
    return Measurement(points, probe.device(calibrate_cpu(num_bytes=16 * 2**20, repeats=1)))


def _weights_bytes(model_dir: Path) -> int:
    """What one step reads of its weights: the checkpoint's tensors (on this CPU a small checkpoint stays in the
    last-level cache between steps, and a read of another size would measure another memory)."""
    return max(2**20, sum(f.stat().st_size for f in Path(model_dir).glob("*.safetensors")))


def engine_shape(model_dir: Path):
    """The checkpoint's ModelShape as the engine runs it here: float32 weights and KV cache."""
    import json

    from oracle.specs import ModelShape

    config = json.loads((Path(model_dir) / "config.json").read_text())
    return replace(ModelShape.from_hf_config(config, name=Path(model_dir).name, bytes_per_param=4.0),
                   kv_bytes_per_element=4)


def step_samples(points: list[Point]) -> list:
    """The points as the efficiency fit takes them (`oracle.profile.calibrate.StepSample`)."""
    from oracle.profile.calibrate import StepSample

    return [StepSample(wall_ms=p.measured_ms, num_prefill_tokens=p.size if p.kind == "prefill" else 0,
                       batch_size=p.size if p.kind == "decode" else 0, context_tokens=p.context_tokens)
            for p in points]


def calibrate(model_dir: Path, points: list[Point] | None = None, device=None) -> Calibration:
    """Fit the efficiencies on every other point of each kind, predict the rest with the simulator's StepCost.
    Without points, `measure` takes them and the device; without a device, it is measured now, apart from the
    steps (pass `Measurement.device` to measure both in the same rounds)."""
    from oracle.cpu_device import calibrate_cpu
    from ops.engine_probe import engine_like_cpu
    from oracle.profile.calibrate import fit_efficiency
    from oracle.roofline import Efficiency, RooflineModel

    from .costmodel import StepCost

    if points is None:
        measured = measure(model_dir)
        points, device = measured.points, device or measured.device
    shape = engine_shape(model_dir)
    device = device or engine_like_cpu(calibrate_cpu(num_bytes=16 * 2**20, repeats=1))
    fit, held = [], []
    for kind in ("prefill", "decode"):
        of_kind = [p for p in points if p.kind == kind]
        fit += of_kind[0::2]
        held += of_kind[1::2]
    roofline = RooflineModel(device, shape, 1, Efficiency())
    # mbu stays 1: the probe rated the device's reads by reading the weights' bytes, as each step does; a fitted
    # mbu trades against the overhead by noise here (fit_efficiency's docstring)
    efficiency = fit_efficiency(roofline, step_samples(fit), mbu=1.0)
    cost = StepCost(RooflineModel(device, shape, 1, efficiency))

    def predict(p: Point) -> Point:
        s = cost.prefill_s(p.size) if p.kind == "prefill" else cost.decode_s(p.size, p.context_tokens)
        return replace(p, predicted_ms=1e3 * s)

    return Calibration([predict(p) for p in held], [predict(p) for p in fit], efficiency, device)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="demo-medium", help="demo model (written if missing)")
    parser.add_argument("--models-root", default=os.environ.get("JANUS_DEMO_MODELS", ".janus/models"))
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    from worker.engine.demo import make_demo_models

    model_dir = make_demo_models(args.models_root, [args.model])[args.model]
    measured = measure(model_dir, repeats=args.repeats)
    result = calibrate(model_dir, measured.points, device=measured.device)
    e = result.efficiency
    print(f"device {result.device.name}: {result.device.peak_bf16_flops_per_s / 1e9:.1f} GFLOP/s, "
          f"{result.device.hbm_bytes_per_s / 1e9:.1f} GB/s; fitted mfu={e.mfu:.3g} mbu={e.mbu:.3g} "
          f"overhead={e.step_overhead_ms:.2f} ms")
    print(f"{'kind':8} {'size':>6} {'measured ms':>12} {'simulated ms':>13} {'error':>7}  (held-out points)")
    for p in result.points:
        print(f"{p.kind:8} {p.size:>6} {p.measured_ms:>12.2f} {p.predicted_ms:>13.2f} {100 * p.rel_error:>6.1f}%")
    for kind in ("prefill", "decode"):
        print(f"{kind}: median error {100 * result.median_error(kind):.1f} %, max {100 * result.max_error(kind):.1f} %"
              f" (bound: median <= {100 * ERROR_BOUND[kind]:.0f} %)")
    ok = all(result.median_error(k) <= ERROR_BOUND[k] for k in ("prefill", "decode"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

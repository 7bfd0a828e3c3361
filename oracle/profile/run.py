"""One profile of one checkpoint, start to end: the engines and their calibration, the measured knee of each length
mix, the grid, the TrainingSet written atomically; one progress bar over all of it. `python -m ops.profile`,
`janus profile` and `janus up`'s first start all run `profile_checkpoint`.

Two plans (`PLANS`):
- `full` (the default of `python -m ops.profile`): three mixes x m in {1, 2, 3} x five loads drawn log-uniformly
  in 0.3..2.0 x m x the mix's knee (45 points), 2 virtual seconds each, the knee bisected over 7 pilot runs.
- `quick` (`--quick`; what `janus up` runs): the same mixes and replica counts, one load in each of three bands
  (0.05-0.3, 0.65-1.15, 1.3-1.8 x the knee: below, at and past it; 27 points), 1.5 virtual seconds each, the knee
  from 5 pilot runs of 1 virtual second, two passes of the step-cost timings instead of three. Fewer and shorter
  points: noisier labels, larger errors and a wider GP uncertainty between them (docs/oracle.md has the figures).
  The low band reaches light loads the full grid never sees (a demo's few requests a second are ~0.02 x the knee,
  where a GP fitted on 0.3-2.0 only answers its prior mean); the middle band sits a little below 1 because the
  short pilots put the knee high (points at 0.75-1.3 x the measured knee had a median attainment of 0.3, not 0.5).

Imports torch through the engine (a tool, never a service core)."""
from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from ..core.dataset import ElasticitySample, TrainingSet
from ..training_files import save_training_set
from .grid import GridPoint, LengthMix
from .harness import (
    DEFAULT_MIXES,
    HarnessSettings,
    Profiler,
    capacity_rps,
    lifetime_output_len,
    point_duration_s,
    profile_model,
    random_grid,
    stratified_grid,
)


MAX_PROFILED_REPLICAS = 32  # the default of ProfilePlan.max_replicas (widened_replicas, below)


@dataclass(frozen=True)
class ProfilePlan:
    """What one profile measures: the grid (mixes x replica counts x loads around each mix's measured knee), how
    long each point runs, and how hard the knee search and the step-cost calibration work."""

    name: str
    replicas: tuple[int, ...] = (1, 2, 3)
    mixes: tuple[LengthMix, ...] = DEFAULT_MIXES
    points_per_cell: int = 5  # random grid: loads per (mix, m), log-uniform in load_range x m x knee
    load_range: tuple[float, float] = (0.3, 2.0)
    load_bands: tuple[tuple[float, float], ...] = ()  # non-empty: one load per band instead (stratified_grid)
    duration_s: float = 2.0  # virtual seconds of arrivals per grid point
    drain_s: float = 0.5
    pilot_duration_s: float = 1.5  # the knee search's runs (m = 1)
    pilot_max_runs: int = 7
    step_cost_rounds: int = 3
    # a point's arrivals span at least this many request lifetimes (HarnessSettings.min_request_lifetimes)
    min_request_lifetimes: float = 2.0
    lifetime_answer: str = "mean"  # HarnessSettings.lifetime_answer: "mean" or "in-flight"
    # the most replicas a grid widened for a kind its telemetry sizes wide may reach (widened_replicas)
    max_replicas: int = MAX_PROFILED_REPLICAS

    def __post_init__(self) -> None:
        if not self.replicas or min(self.replicas) < 1 or not self.mixes:
            raise ValueError("ProfilePlan: at least one mix and replica counts >= 1")
        if self.pilot_max_runs < 2 or self.points_per_cell < 1:
            raise ValueError("ProfilePlan: pilot_max_runs >= 2 and points_per_cell >= 1")

    @property
    def per_cell(self) -> int:
        """Loads per (mix, m)."""
        return len(self.load_bands) if self.load_bands else self.points_per_cell

    @property
    def num_points(self) -> int:
        return len(self.mixes) * len(self.replicas) * self.per_cell

    def harness_settings(self, **overrides) -> HarnessSettings:
        """HarnessSettings with this plan's durations and step-cost passes (`overrides` win)."""
        base = {"duration_s": self.duration_s, "drain_s": self.drain_s, "step_cost_rounds": self.step_cost_rounds,
                "min_request_lifetimes": self.min_request_lifetimes, "lifetime_answer": self.lifetime_answer}
        return HarnessSettings(**{**base, **overrides})

    def grid(self, capacities_rps: dict[str, float], settings: HarnessSettings) -> list[GridPoint]:
        if self.load_bands:
            return stratified_grid(capacities_rps, self.mixes, self.replicas, self.load_bands, settings)
        return random_grid(capacities_rps, self.mixes, self.replicas, self.points_per_cell, settings,
                           load_range=self.load_range)


FULL = ProfilePlan("full")
QUICK = ProfilePlan("quick", load_bands=((0.05, 0.3), (0.65, 1.15), (1.3, 1.8)), duration_s=1.5,
                    pilot_duration_s=1.0, pilot_max_runs=5, step_cost_rounds=2)
# For a fast target (an accelerator, or the simulator's devices: sim/oracle_training.py): m up to 8, seven loads from
# well below to well past each mix's knee, points long enough for requests of a few hundred tokens at a TPOT SLO of
# tens of ms to finish. Its mixes come from the caller (telemetry). Three of the bands lie between 0.55 and 1.15 x
# the knee (the pilots' 0.5-attainment rate), where attainment falls from 0.99 to 0.5 and where the scaler's counts
# are decided: with one band there (0.65-1.15), the 0.99 crossing fell in a gap of 1.6-2x the load between two
# points, and the GP's knee, interpolated across it, asked 15-25 % more replicas than the device's own step
# (docs/bench/sim.md, runs 38 and 39).
DEVICE = ProfilePlan("device", replicas=(1, 2, 4, 8), load_bands=((0.05, 0.3), (0.3, 0.55), (0.55, 0.75), (0.75, 0.95),
                                                               (0.95, 1.15), (1.3, 1.8), (2.0, 3.0)),
                     duration_s=8.0, drain_s=16.0, pilot_duration_s=4.0, pilot_max_runs=6)
PLANS = {p.name: p for p in (FULL, QUICK, DEVICE)}

# A plan's replica counts widened for a kind its telemetry says runs wide (the busiest window of its first minute,
# sized by the datasheet): powers of two on to twice that count. A point at m costs m engines' steps, so the grid goes
# no further than asked, and never past the plan's `max_replicas` (the oracle's `profile_max_replicas`). At 32 the
# headline's busiest 32B app (70 instances in the calm, ~90 asked for its first minute at the scaler's headroom) is
# sized past the grid, where the GP's sigma widens; profiled to 64, seed 1's learned Janus came within 2 % of the
# clairvoyant's device-hours, but seed 2 lost attainment (docs/bench/sim.md, run 51): 32 stays the default.
TELEMETRY_WINDOW_S = 10.0


def widened_replicas(base: tuple[int, ...], most_needed: int,
                     max_replicas: int = MAX_PROFILED_REPLICAS) -> tuple[int, ...]:
    """`base`, then doublings while `most_needed` is more than half the largest count (at most `max_replicas`)."""
    replicas = list(base)
    while most_needed > replicas[-1] // 2 and replicas[-1] < max_replicas:
        replicas.append(min(2 * replicas[-1], max_replicas))
    return tuple(replicas)


@dataclass
class ProfileResult:
    training_set: TrainingSet
    path: Path
    elapsed_s: float
    capacities_rps: dict[str, float] = field(default_factory=dict)

    @property
    def num_points(self) -> int:
        """Grid points (the knee search's pilot runs are in the training set too, not counted here)."""
        return len(self.training_set.meta.get("points", ()))

    def summary(self) -> str:
        ts = self.training_set
        pilots = len(ts.meta.get("pilots", ()))
        return (f"{ts.model}: {self.num_points} points and {pilots} knee-search runs ({len(ts.elasticity)} "
                f"elasticity, {len(ts.capacity)} capacity samples) in {format_duration(self.elapsed_s)} -> {self.path}")


def format_duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds} s"
    return f"{seconds // 60} min {seconds % 60:02d} s"


def partial_path(out_path: str | Path) -> Path:
    """Where a profile in progress keeps what it measured (rewritten after every point); renamed to `out_path`
    only once complete, so a file at `out_path` is always a whole profile (what `janus up` takes as cached)."""
    out = Path(out_path)
    return out.with_name(out.name + ".partial")


def profile_checkpoint(model_dir: str | Path, out_path: str | Path, *, model: str | None = None,
                       plan: ProfilePlan = FULL, settings: HarnessSettings | None = None,
                       show_progress: bool = True, say: Callable[[str], None] | None = None,
                       extra_meta: dict | None = None,
                       make_profiler: Callable[[HarnessSettings, int], Profiler] | None = None) -> ProfileResult:
    """Profile the checkpoint at `model_dir` and write its TrainingSet to `out_path` (its `model` is `model`,
    default the folder's name). `settings` default to the plan's. `say` gets the progress notes (calibration, each
    knee); default: printed above the progress bar. `make_profiler(settings, max_replicas)` builds the target: the
    worker's engine on this CPU (ops/profile.py) or the simulator's devices (sim/oracle_training.py); the knee
    search, the grid and the training set are this same code."""
    model_dir = Path(model_dir)
    out = Path(out_path)
    settings = settings or plan.harness_settings()
    name = model or model_dir.name
    started = time.perf_counter()
    progress = _progress(show_progress)
    note = say or (lambda line: progress.console.print(line, highlight=False))
    pilot_s = {mix.name: point_duration_s(lifetime_output_len(mix, settings), settings, plan.pilot_duration_s)
               for mix in plan.mixes}
    pilot_units = {name: s + min(settings.drain_s, s) for name, s in pilot_s.items()}
    point_units = {mix.name: point_duration_s(lifetime_output_len(mix, settings), settings) + settings.drain_s
                   for mix in plan.mixes}
    calibration_units = 2.0 * settings.step_cost_rounds + 1.0
    # units ~ virtual replica-seconds, which is what the time goes on (the bar's time left is honest enough)
    total = calibration_units + plan.pilot_max_runs * sum(pilot_units.values()) \
        + sum(point_units.values()) * sum(plan.replicas) * plan.per_cell
    with progress:
        task = progress.add_task(f"{name}: calibrating the engine", total=total)
        profiler = (make_profiler or (lambda st, n: Profiler(model_dir, st, max_replicas=n)))(
            settings, max(plan.replicas))
        progress.advance(task, calibration_units)
        if profiler.step_cost is not None:
            c = profiler.step_cost
            note(f"{name}: step-cost clock fitted, error median {100 * c.fit_median_error:.1f} %, "
                 f"p90 {100 * c.fit_p90_error:.1f} %")
        e = profiler.roofline.efficiency
        note(f"{name}: calibrated roofline on {profiler.roofline.device.name}: mfu={e.mfu:.3g} mbu={e.mbu:.3g} "
             f"overhead={e.step_overhead_ms:.2f} ms")
        # The knee of each mix, measured: the roofline's estimate (calibrated on isolated steps) only seeds the
        # search, it missed the real knee by 2-4x on demo-tiny, which left a grid of 1.0 attainments.
        capacities: dict[str, float] = {}
        pilots: list[dict] = []
        pilot_samples: list[ElasticitySample] = []  # measured at m = 1 around each knee: training data too
        for mix in plan.mixes:
            estimate = capacity_rps(profiler.roofline, mix, settings.ttft_slo_ms, settings.tpot_slo_ms)

            def on_run(run: dict, mix: LengthMix = mix) -> None:
                progress.update(task, advance=pilot_units[mix.name], description=(
                    f"{name}: knee of {mix.name}: {run['rate_rps']:.0f} rps -> {run['attainment']:.2f}"))

            capacities[mix.name], runs, samples = profiler.measured_capacity_rps(
                mix, estimate, duration_s=plan.pilot_duration_s, max_runs=plan.pilot_max_runs, on_run=on_run)
            pilots.extend(runs)
            pilot_samples.extend(samples)
            note(f"{name}: {mix.name} knee: roofline {estimate:.1f} rps, measured {capacities[mix.name]:.1f} rps "
                 "per replica")
        grid = plan.grid(capacities, settings)
        partial = partial_path(out)
        partial.parent.mkdir(parents=True, exist_ok=True)

        def on_point(index: int, info: dict) -> None:
            progress.update(task, advance=info["num_replicas"] * point_units[info["mix"]], description=(
                f"{name}: {info['mix']} m={info['num_replicas']} {info['rate_rps']:.0f} rps -> "
                f"{info['attainment']:.2f} ({index + 1}/{len(grid)})"))

        training_set = profile_model(
            profiler, grid, model=name, out_path=partial, show_progress=False, on_point=on_point,
            extra_meta={"pilots": pilots, "capacities_rps": capacities, "plan": asdict(plan),
                        "model_dir": str(model_dir), **(extra_meta or {})})
        training_set.elasticity.extend(pilot_samples)
        elapsed = time.perf_counter() - started
        training_set.meta["elapsed_s"] = round(elapsed, 1)
        save_training_set(training_set, partial)
        os.replace(partial, out)
        progress.update(task, completed=total, description=f"{name}: done")
    return ProfileResult(training_set, out, elapsed, capacities)


def _progress(enabled: bool):
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn, \
        TimeRemainingColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn(),
                    TextColumn("left"), TimeRemainingColumn(), disable=not enabled, transient=False)


def parse_mixes(specs: Sequence[str]) -> tuple[LengthMix, ...]:
    """`name:input_mean:input_cv:output_mean` each."""
    mixes = []
    for spec in specs:
        parts = spec.split(":")
        if len(parts) != 4:
            raise ValueError(f"a mix is name:input_mean:input_cv:output_mean, got {spec!r}")
        n, i, cv, o = parts
        mixes.append(LengthMix(n, float(i), float(cv), float(o)))
    return tuple(mixes)


def estimate_s(plan: ProfilePlan) -> float:
    """A rough wall-clock estimate on this 2-core machine (measured: see docs/oracle.md), for messages."""
    return {"quick": 270.0, "full": 540.0}.get(plan.name, 60.0 * math.ceil(plan.num_points / 6))


__all__ = ["DEVICE", "FULL", "MAX_PROFILED_REPLICAS", "PLANS", "QUICK", "TELEMETRY_WINDOW_S", "ProfilePlan",
           "ProfileResult", "estimate_s", "format_duration", "parse_mixes", "partial_path", "profile_checkpoint",
           "widened_replicas"]

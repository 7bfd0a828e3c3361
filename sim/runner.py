"""Runs several systems on one scenario, in parallel processes, and gathers what the report needs."""
from __future__ import annotations

import multiprocessing as mp
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from .metrics import Summary, TimeSeries, time_series
from .public_traces import load_public
from .scenario import build_scenario
from .servegen import servegen_trace
from .systems.base import ControlPlane, SystemRun
from .trace import Trace


def janus_policies(policy: dict | None = None) -> tuple:
    """(PlannerPolicy, DispatchPolicy) of the simulated Janus: `policy` as `janus config` prints it
    ({"planner": {...}, "dispatcher": {...}}, either optional), else the live defaults."""
    from dispatcher.core import DispatchPolicy
    from planner.core import PlannerPolicy

    policy = policy or {}
    return PlannerPolicy(**policy.get("planner", {})), DispatchPolicy(**policy.get("dispatcher", {}))


def oracle_policy(policy: dict | None = None):
    """The OraclePolicy of the simulated Janus's oracle: `policy`'s "oracle" section (as `janus config` prints it),
    else the live default, the knobs the oracle service reads from the same YAML."""
    from oracle.core.policy import OraclePolicy

    return OraclePolicy.from_knobs((policy or {}).get("oracle", {}))


# What the Janus systems (janus, its ablations) ask unless a run says otherwise: the learned oracle, as a deployment
# has it. The clairvoyant one was the default until run 62 (docs/bench/sim.md): the learned Janus now meets what the
# clairvoyant meets on the three seeds, within 5 % of its device-hours.
DEFAULT_ORACLE = "learned"


def _systems(policy: dict | None = None, oracle_cache_dir: str = "artifacts/sim-oracle",
             oracle: str = DEFAULT_ORACLE, refit_wall_s: float | None = None) \
        -> dict[str, Callable[[], ControlPlane]]:
    """The systems by name. `oracle`: what the Janus systems (janus, its ablations) ask; `janus-clairvoyant` and
    `janus-learned` and `janus-roofline` keep theirs whatever it is."""
    from .systems.baselines import BlitzScaleLike, PrismJanusAllocator, PrismLike
    from .systems.janus import JanusControl
    from .systems.static import StaticPartition

    planner, dispatch = janus_policies(policy)
    knobs = oracle_policy(policy)
    no_resume = planner.model_copy(update={"reconciler": planner.reconciler.model_copy(
        update={"resumes_draining": False})})
    def janus(mode: str, name: str | None = None, oracle: str = oracle, planner_policy=planner):
        return lambda: JanusControl(mode, planner_policy, dispatch, name=name, oracle=oracle,
                                    oracle_cache_dir=oracle_cache_dir, refit_wall_s=refit_wall_s,
                                    oracle_policy=knobs)

    return {
        "janus": janus("both"),
        "static": lambda: StaticPartition(),
        "prism-like": lambda: PrismLike(),
        "prism-janus-allocator": lambda: PrismJanusAllocator(planner),
        "blitzscale-like": lambda: BlitzScaleLike(),
        "steady-only": janus("steady_only"),
        "elastic-only": janus("elastic_only"),
        "janus-no-resume": janus("both", "janus-no-resume", planner_policy=no_resume),
        "janus-learned": janus("both", "janus-learned", oracle="learned"),
        "janus-clairvoyant": janus("both", "janus-clairvoyant", oracle="clairvoyant"),
        "janus-roofline": janus("both", "janus-roofline", oracle="roofline"),
    }


def uses_learned_oracle(system: str, oracle: str = DEFAULT_ORACLE) -> bool:
    """Whether `system` needs the profiles of the simulated device (ensure_profiles, before the workers start) when
    the Janus systems ask `oracle`."""
    factory = _systems(oracle=oracle).get(system)
    return factory is not None and getattr(factory(), "oracle_kind", None) == "learned"


SYSTEM_NAMES = ("janus", "static", "prism-like", "blitzscale-like", "steady-only", "elastic-only")
# Not in the default run: experiments one can name with --systems (docs/sim.md).
EXTRA_SYSTEM_NAMES = ("janus-no-resume", "janus-learned", "janus-clairvoyant", "janus-roofline",
                      "prism-janus-allocator")

# Relative CPU time of each system on the headline run (run 15, docs/bench/sim.md): run_many starts the longest
# first (longest-processing-time order), so two processes end together instead of one finishing the last long
# system alone.
RELATIVE_CPU = {"elastic-only": 1.0, "janus": 0.90, "steady-only": 0.72, "prism-like": 0.33, "static": 0.27,
                "blitzscale-like": 0.27}


def longest_first(systems: list[str]) -> list[str]:
    """The systems in the order to start them: the most expensive first (ties: as given)."""
    return sorted(systems, key=lambda s: -RELATIVE_CPU.get(s, 1.0))


@dataclass(frozen=True)
class ScenarioSpec:
    """Everything a worker process needs to rebuild the same scenario (cheap: ~1 s for the headline trace)."""

    trace: str = "servegen"
    num_apps: int = 62
    num_requests: int = 600_000
    duration_s: float = 1800.0
    compression: float = 1.0  # public traces: time compression
    window_s: float | None = None  # replay only the first window_s of the trace
    device: str = "ascend-910c-die"
    num_devices: int = 768
    mix: str = "default"  # scenario.TIER_PRESETS
    seed: int = 0
    policy: dict | None = None  # Janus's policies as `janus config` prints them (None: the live defaults)
    device_effects: str = "off"  # "on": the devices do what a roofline leaves out (sim/device_effects.py)
    oracle_cache_dir: str = "artifacts/sim-oracle"  # profiles of the simulated device (sim/oracle_training.py)
    # What the Janus systems ask (`DEFAULT_ORACLE`): "learned" (GPs fitted on profiles of the simulated device, as a
    # deployment learns), "clairvoyant" (the roofline of the cost model that times the devices) or "roofline" (the
    # datasheet's, untrained)
    oracle: str = DEFAULT_ORACLE
    # How long a learned oracle's online refit takes before its GP serves: None = the fit's own measured wall time
    # (as live; runs of the same code then differ by how busy this machine was), a number = that many seconds for
    # every fit, so two runs are the same run (sim/refitter.py)
    refit_wall_s: float | None = None

    def build_trace(self) -> Trace:
        if self.trace == "servegen":
            trace = servegen_trace(num_apps=self.num_apps, duration_s=self.duration_s,
                                   num_requests=self.num_requests, seed=self.seed)
        else:
            trace = load_public(self.trace)
            if self.compression != 1.0:
                trace = trace.compressed(self.compression)
        if self.window_s is not None:
            trace = trace.window(0.0, self.window_s)
        return trace

    def build(self):
        from .scenario import TIER_PRESETS

        if self.mix not in TIER_PRESETS:
            raise ValueError(f"unknown model mix {self.mix!r}; known: {sorted(TIER_PRESETS)}")
        from .device_effects import DeviceEffects

        if self.device_effects not in ("on", "off"):
            raise ValueError(f"device_effects is on or off, not {self.device_effects!r}")
        effects = DeviceEffects(seed=self.seed) if self.device_effects == "on" else DeviceEffects.off()
        return build_scenario(self.build_trace(), device_name=self.device, num_devices=self.num_devices,
                              seed=self.seed, tiers=TIER_PRESETS[self.mix], effects=effects)


@dataclass
class SystemResult:
    """What comes back from a worker: picklable, compact."""

    system: str
    summary: Summary
    series: TimeSeries
    per_app_attainment: np.ndarray
    wall_s: float
    cpu_s: float
    counters: dict = field(default_factory=dict)
    device_time_s: list = field(default_factory=list)
    device_counts: list = field(default_factory=list)
    apps: list = field(default_factory=list)  # per app: AppReport (the worst-apps table)
    extra: dict = field(default_factory=dict)  # what an experiment's `extra` hook took from the run (run_one)
    kinds: list = field(default_factory=list)  # KindHours, the largest first: where the device-hours went


def run_one(spec: ScenarioSpec, system: str, bin_s: float = 10.0,
            progress: Callable[[str, int, int], None] | None = None,
            extra: Callable | None = None) -> SystemResult:
    """One system on `spec`'s scenario. `extra(scenario, run_result) -> dict`, a module-level function (it crosses
    to the worker process): what an experiment needs beyond the summary (say, one app's attainment per second),
    computed where the outcomes are and returned in `SystemResult.extra`."""
    from .metrics import app_reports, device_hours_by_kind, per_app_token_attainment

    scenario = spec.build()
    control = _systems(spec.policy, spec.oracle_cache_dir, spec.oracle, spec.refit_wall_s)[system]()
    run = SystemRun(scenario, control)
    n = scenario.trace.num_requests
    cpu0 = time.process_time()
    result = run.run(progress=(lambda i: progress(system, i, n)) if progress else None)
    cpu_s = time.process_time() - cpu0
    trace = scenario.trace
    series = time_series(trace, result.outcomes, bin_s, result.devices.time_s, result.devices.count)
    per_app = per_app_token_attainment(trace.app_ids, trace.output_tokens, result.outcomes, trace.num_apps)
    models = [f"{a.shape_name} tp{a.tp}" for a in scenario.apps]
    apps = app_reports(trace.app_names, models, trace.requests_per_app(), per_app, result.rejections)
    return SystemResult(system, result.summary, series, per_app, result.wall_s, cpu_s, result.counters,
                        list(result.devices.time_s), list(result.devices.count), apps,
                        extra(scenario, result) if extra is not None else {},
                        device_hours_by_kind(result.device_seconds_by_kind, trace.app_names, models))


def _worker(args):
    """One system in a worker process; an exception becomes the result (the other systems still report)."""
    import traceback

    spec, system, bin_s, queue, extra = args
    try:
        return run_one(spec, system, bin_s, (lambda s, i, n: queue.put((s, i, n))) if queue is not None else None,
                       extra)
    except Exception:
        return RunFailure(system, traceback.format_exc())


@dataclass
class RunFailure:
    system: str
    error: str


def run_many(spec: ScenarioSpec, systems: list[str], processes: int = 2, bin_s: float = 10.0,
             on_progress: Callable[[str, int, int], None] | None = None,
             extra: Callable | None = None) -> list["SystemResult | RunFailure"]:
    """Every system on the same scenario; `processes` at a time, the longest first (fork: children share the
    parent's imports, and a fresh child per system keeps one system's memory from the next). Results come back in
    the order of `systems`; a system that raised comes back as a RunFailure with its traceback."""
    unknown = [s for s in systems if s not in _systems()]
    if unknown:
        raise ValueError(f"unknown systems {unknown}; known: {sorted(_systems())}")
    if len(set(systems)) != len(systems):
        raise ValueError(f"a system is listed twice: {systems}")
    if any(uses_learned_oracle(s, spec.oracle) for s in systems):  # profiled once here, not in each worker
        from .oracle_training import ensure_profiles

        ensure_profiles(spec.build(), Path(spec.oracle_cache_dir), processes=processes,
                        elastic=janus_policies(spec.policy)[0].elastic, policy=oracle_policy(spec.policy))
    if processes <= 1:
        return [_worker((spec, s, bin_s, None, extra)) if on_progress is None
                else run_one(spec, s, bin_s, on_progress, extra) for s in systems]
    ctx = mp.get_context("fork")
    manager = ctx.Manager()
    queue = manager.Queue()
    start_order = longest_first(systems)
    with ctx.Pool(processes=min(processes, len(systems)), maxtasksperchild=1) as pool:
        pending = pool.map_async(_worker, [(spec, s, bin_s, queue, extra) for s in start_order], chunksize=1)
        while not pending.ready():
            pending.wait(0.2)
            while not queue.empty():
                s, i, n = queue.get()
                if on_progress:
                    on_progress(s, i, n)
        by_system = dict(zip(start_order, pending.get()))
    manager.shutdown()
    return [by_system[s] for s in systems]  # in the caller's order (the tables' rows)

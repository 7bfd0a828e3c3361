"""The simulated Janus's oracle, learned the way a deployment learns it (issue "The oracle learns"; docs/sim.md):

- For each kind of instance in the scenario (model shape, tensor-parallel degree, SLOs) the oracle's own profiling
  code (`oracle.profile.run.profile_checkpoint`: knee search, grid, training set) runs against simulated devices
  (sim/profile_device.py) with the scenario's device effects. The oracle sees step times, never the cost model's
  or the effects' parameters: its roofline is the device's datasheet with efficiencies fitted to measured steps.
- The length mixes profiled are what telemetry shows before the run: the requests the group's apps sent in the
  trace's first minute, in up to three mixes (the apps in thirds by mean request length), each mix drawing its
  (prompt, output) pairs from those requests, as an operator profiles the traffic it serves; and a margin around
  them (the shortest third twice as short, the longest twice as long: `LENGTH_MARGIN`). The knee searches' pilot
  runs are training samples too (oracle/profile/run.py).
- The layout profiled is the one the elastic scaler runs: it asks the oracle about m instances in all and splits
  them with `planner.core.split_prefill_decode` (colocated below `min_num_disaggregated`, else prefill and decode
  instances), so each grid point at m runs that split, with the KV hand-off over the device link
  (oracle/profile/virtual_clock.py). Profiled colocated, a busy model's learned attainment plateaued below the target
  where Janus serves it disaggregated (docs/bench/sim.md, run 24).
- The replica counts: the device plan's (1, 2, 4, 8), and for a kind whose busiest first-minute window the
  datasheet's roofline sizes past 4 instances, powers of two up to twice that, at most the oracle's
  `profile_max_replicas` (32; the oracle's profiling plan, `oracle.profile.run.widened_replicas`; past the grid the
  oracle answers from the largest count at the same load per replica, `OraclePolicy.past_trained_replicas`).
- The GPs (`oracle.gp.train`) are fitted on the training sets and installed for every app of the group.

Profiles are cached under `cache_dir` by what they depend on (device, shape, tp, SLOs, mixes, plan, effects), so a
second run of the same scenario fits only. What is not learned: interference between co-located models (profiles
run one model per device): docs/oracle.md. Online, the oracle learns from the windows as the live service does
(sim/systems/janus.py, `JanusControl._learn`).
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np

from oracle.core.dataset import TrainingSet
from oracle.training_files import load_training_set
from oracle.core.oracle import Oracle, calibrated_profile
from oracle.core.policy import OraclePolicy
from oracle.profile.grid import GridPoint, LengthMix
from oracle.profile.harness import HarnessSettings
from oracle.profile.run import (
    DEVICE,
    MAX_PROFILED_REPLICAS,
    TELEMETRY_WINDOW_S,
    ProfilePlan,
    profile_checkpoint,
    widened_replicas,
)
from oracle.roofline import Efficiency, RooflineModel

from planner.core import ElasticPolicy
from planner.core.elastic import priced_for_split, split_prefill_decode

from .profile_device import SimDeviceProfiler
from .scenario import Scenario, replicas_for, window_features

SIM_PLAN = DEVICE  # the oracle's plan for a fast target; its mixes are telemetry's (plan_for)
TELEMETRY_S = 60.0  # the mixes come from the first minute of traffic
# Beyond what telemetry shows, the operator profiles a margin: the shortest third's requests this many times shorter
# and the longest's this many times longer. Without it an app shorter than the shortest third's average was sized
# by extrapolation: seed 0's app-46 (317 -> 28 tokens; the short mix 599 -> 41) got one instance where it needed two
# (docs/bench/sim.md, run 29).
LENGTH_MARGIN = 2.0
MAX_REQUESTS_PER_POINT = 20_000  # a small model's point at 3x its knee on 8 devices would send ~300k
# How a point's labels are scored (oracle/profile/measure.py): "censored" = a request unfinished at the point's end
# counts its tokens due by then only. Part of the cache key: profiles scored otherwise are not reused.
SCORING = "censored"


@dataclass(frozen=True)
class Group:
    """Apps served by the same kind of instance: one profile, one pair of GPs."""

    shape_name: str
    tp: int
    ttft_slo_s: float
    tpot_slo_s: float
    apps: tuple[int, ...]

    @property
    def name(self) -> str:
        return f"{self.shape_name}-tp{self.tp}"


def groups_of(scenario: Scenario) -> list[Group]:
    by_key: dict[tuple, list[int]] = {}
    for app, spec in enumerate(scenario.apps):
        by_key.setdefault((spec.shape_name, spec.tp, spec.ttft_slo_s, spec.tpot_slo_s), []).append(app)
    return [Group(*key, apps=tuple(apps)) for key, apps in sorted(by_key.items())]


def telemetry_mixes(scenario: Scenario, apps: tuple[int, ...], max_samples: int = 2_000,
                    margin: float = LENGTH_MARGIN) -> tuple[LengthMix, ...]:
    """The length mixes to profile, from the requests the apps sent in the first minute: the apps in thirds by their
    mean request length, each third's requests as one mix's (prompt, output) samples (at most `max_samples`); then,
    with `margin` > 1, the shortest third's requests `margin` times shorter and the longest's `margin` times longer
    (`scaled_mix`), so the GPs interpolate for an app shorter or longer than the thirds' averages."""
    trace = scenario.trace
    end = int(np.searchsorted(trace.arrival_s, TELEMETRY_S))
    if not np.isin(trace.app_ids[:end], np.array(apps)).any():
        end = trace.num_requests  # nothing in the first minute: the whole trace stands in
    ids, inputs, outputs = trace.app_ids[:end], trace.input_tokens[:end], trace.output_tokens[:end]
    seen = [a for a in apps if (ids == a).any()]
    seen.sort(key=lambda a: float((inputs[ids == a] + outputs[ids == a]).mean()))
    rng = np.random.default_rng(0)
    mixes = []
    for name, part in zip(("short", "mid", "long"), np.array_split(np.array(seen), min(3, len(seen)))):
        sel = np.isin(ids, part)
        pairs = np.stack([inputs[sel], outputs[sel]], axis=1).astype(int)
        if len(pairs) > max_samples:
            pairs = pairs[rng.choice(len(pairs), max_samples, replace=False)]
        mixes.append(LengthMix.of_samples(name, tuple((int(p), int(o)) for p, o in pairs)))
    if margin > 1.0:
        mixes = [scaled_mix(mixes[0], 1.0 / margin, "shorter"), *mixes, scaled_mix(mixes[-1], margin, "longer")]
    return tuple(mixes)


def scaled_mix(mix: LengthMix, factor: float, name: str) -> LengthMix:
    """`mix` with every prompt and output `factor` times as long (at least one token each): the same spread, the
    means moved."""
    return LengthMix.of_samples(name, tuple((max(1, round(p * factor)), max(1, round(o * factor)))
                                            for p, o in mix.samples))


def telemetry_replicas(scenario: Scenario, group: Group, elastic: ElasticPolicy,
                       base: tuple[int, ...] = SIM_PLAN.replicas,
                       max_replicas: int = MAX_PROFILED_REPLICAS) -> tuple[int, ...]:
    """The replica counts to profile: `base`, and for a kind whose busiest first-minute window (at the scaler's
    `load_headroom`) the datasheet's roofline sizes at more instances than half `base`'s largest, powers of two
    on to twice that count (at most `max_replicas`: the plan's, the oracle's `profile_max_replicas`). The
    datasheet is what the oracle knows before a profile; it only picks the grid, the labels are measured."""

    datasheet = scenario.cost(group.apps[0]).roofline
    roofline = RooflineModel(datasheet.device, datasheet.shape, tp=group.tp,
                             efficiency=Efficiency(max_num_seqs=datasheet.efficiency.max_num_seqs))
    most = 1
    for app in group.apps:
        for start in np.arange(0.0, TELEMETRY_S, TELEMETRY_WINDOW_S):
            f = window_features(scenario.trace, app, float(start), float(start) + TELEMETRY_WINDOW_S)
            if f.token_rate_tps > 0:
                f = f.model_copy(update={"token_rate_tps": f.token_rate_tps * elastic.load_headroom})
                most = max(most, replicas_for(roofline, f, group.ttft_slo_s, group.tpot_slo_s,
                                              elastic.target_attainment, max_replicas))
    return widened_replicas(base, most, max_replicas)


def planner_layout(elastic: ElasticPolicy, measured: RooflineModel | None = None, tpot_slo_ms: float = 0.0) \
        -> Callable[[GridPoint], tuple[int, int]]:
    """How the elastic scaler lays out m instances of a load (planner.core.split_prefill_decode): (m, 0) colocated,
    else (prefill, decode), split by the decode-over-prefill token cost the oracle will tell it: that of
    `measured` (the roofline fitted to the profile's calibration steps), else the policy's."""
    def layout(point: GridPoint) -> tuple[int, int]:
        features = priced_for_split(point.features, elastic)
        ratio = measured.decode_token_cost_ratio(features, tpot_slo_ms) if measured is not None else None
        num_prefill, num_decode = split_prefill_decode(point.num_replicas, features, elastic, ratio)
        return (num_prefill, num_decode)

    return layout


def _layout_key(elastic: ElasticPolicy) -> dict:
    """What the layout depends on (part of the cache key and the profile's meta)."""
    key = {"split": "planner.core.split_prefill_decode", "min_num_disaggregated": elastic.min_num_disaggregated,
           "decode_token_cost_ratio": "measured: the calibrated roofline's (oracle.roofline)"}
    if elastic.is_decode_priced_by_answer_spread:
        key["decode_context"] = "length-biased by the output-length variance (oracle.roofline.decode_context_per_seq)"
    if elastic.decode_ratio_floor_from is not None:
        key["decode_ratio_floor"] = [elastic.decode_ratio_floor_from, elastic.decode_token_cost_ratio]
    return key


def _settings(group: Group, plan: ProfilePlan, seed: int) -> HarnessSettings:
    # the device clock is the profiler's own (SimDeviceProfiler._timer); "wall" only passes the settings' checks
    return plan.harness_settings(ttft_slo_ms=group.ttft_slo_s * 1e3, tpot_slo_ms=group.tpot_slo_s * 1e3,
                                 clock="wall", seed=seed, max_requests_per_point=MAX_REQUESTS_PER_POINT)


def cache_path(scenario: Scenario, group: Group, plan: ProfilePlan, cache_dir: Path,
               elastic: ElasticPolicy | None = None) -> Path:
    """Where this group's profile is kept: named by everything the profile depends on."""
    plan_key = asdict(plan)
    if plan.lifetime_answer == "mean":
        del plan_key["lifetime_answer"]  # the profiles made before the option keep their name
    del plan_key["max_replicas"]  # the widened counts it led to are in the key (`replicas`)
    key = json.dumps({"device": asdict(scenario.device), "efficiency": asdict(scenario.efficiency),
                      "effects": asdict(scenario.effects), "shape": group.shape_name, "tp": group.tp,
                      "slo": [group.ttft_slo_s, group.tpot_slo_s], "plan": plan_key,
                      "max_requests_per_point": MAX_REQUESTS_PER_POINT,
                      "layout": _layout_key(elastic or ElasticPolicy()), "scoring": SCORING,
                      "pilot_samples": "in the training set when long enough (harness.is_pilot_long_enough)",
                      "pilot_length": "as a grid point's, at least min_request_lifetimes (harness.point_duration_s)"},
                     sort_keys=True, default=str)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_dir / f"{group.name}-{digest}.json"


def plan_for(scenario: Scenario, group: Group, plan: ProfilePlan = SIM_PLAN,
             elastic: ElasticPolicy | None = None) -> ProfilePlan:
    return replace(plan, mixes=telemetry_mixes(scenario, group.apps),
                   replicas=telemetry_replicas(scenario, group, elastic or ElasticPolicy(), plan.replicas,
                                               plan.max_replicas))


def sim_plan(policy: OraclePolicy | None = None, base: ProfilePlan = SIM_PLAN) -> ProfilePlan:
    """The simulator's profiling plan (`base`) with the oracle's profile knobs (`profile_lifetime_answer`,
    `profile_max_replicas`), as `janus profile` takes them from the cluster YAML."""
    policy = policy or OraclePolicy()
    return replace(base, lifetime_answer=policy.profile_lifetime_answer, max_replicas=policy.profile_max_replicas)


def profile_group(scenario: Scenario, group: Group, cache_dir: Path, plan: ProfilePlan = SIM_PLAN,
                  say: Callable[[str], None] = lambda line: None,
                  elastic: ElasticPolicy | None = None) -> TrainingSet:
    """The group's training set: from the cache, or profiled now on simulated devices (and cached)."""
    elastic = elastic or ElasticPolicy()
    plan = plan_for(scenario, group, plan, elastic)
    path = cache_path(scenario, group, plan, Path(cache_dir), elastic)
    if path.exists():
        return load_training_set(path)
    cost = scenario.cost(group.apps[0])
    effects = replace(scenario.effects, seed=scenario.effects.seed + 7919)  # its own draws, not the run's

    def make_profiler(settings: HarnessSettings, max_replicas: int) -> SimDeviceProfiler:
        profiler = SimDeviceProfiler(group.name, cost, effects, settings, max_replicas=max_replicas)
        profiler.layout = planner_layout(elastic, profiler.roofline, group.tpot_slo_s * 1e3)
        return profiler

    result = profile_checkpoint(
        Path(group.name), path, model=group.name, plan=plan, settings=_settings(group, plan, scenario.effects.seed),
        show_progress=False, say=say, extra_meta={"target": "simulated device", "apps": list(group.apps),
                                                  "layout": _layout_key(elastic)},
        make_profiler=make_profiler)
    return result.training_set


def ensure_profiles(scenario: Scenario, cache_dir: Path, processes: int = 2,
                    say: Callable[[str], None] = print, elastic: ElasticPolicy | None = None,
                    policy: OraclePolicy | None = None) -> dict[str, dict]:
    """Profile every group not cached yet (`processes` at a time), by the plan the oracle's `policy` makes
    (`sim_plan`); returns per group what the report shows: points, the profile's own time (when it ran), whether it
    came from the cache."""
    elastic = elastic or ElasticPolicy()
    plan = sim_plan(policy)
    groups = groups_of(scenario)
    todo = [g for g in groups
            if not cache_path(scenario, g, plan_for(scenario, g, plan, elastic), Path(cache_dir), elastic).exists()]
    if todo:
        say(f"profiling {len(todo)} kinds of instance on the simulated device ({', '.join(g.name for g in todo)})")
        jobs = [(scenario, g, str(cache_dir), plan, elastic) for g in todo]
        if processes > 1 and len(todo) > 1:
            import multiprocessing as mp

            with mp.get_context("fork").Pool(min(processes, len(todo)), maxtasksperchild=1) as pool:
                for name, elapsed_s in pool.imap_unordered(_profile_one, jobs):
                    say(f"{name}: profiled in {elapsed_s:.0f} s")
        else:
            for job in jobs:
                name, elapsed_s = _profile_one(job)
                say(f"{name}: profiled in {elapsed_s:.0f} s")
    return {g.name: profile_report(profile_group(scenario, g, Path(cache_dir), plan, elastic=elastic),
                                   was_cached=g not in todo)
            for g in groups}


def _profile_one(args: tuple) -> tuple[str, float]:
    scenario, group, cache_dir, plan, elastic = args
    started = time.perf_counter()
    profile_group(scenario, group, Path(cache_dir), plan, elastic=elastic)
    return group.name, time.perf_counter() - started


def profile_report(training_set: TrainingSet, was_cached: bool) -> dict:
    points = training_set.meta.get("points", [])
    pilots = training_set.meta.get("pilots", [])
    plan = training_set.meta.get("plan", {})
    # device time (a run records how long its arrivals ran: longer for long answers, shorter past the knee; a pilot
    # drains for at most its own length)
    drain_s = plan.get("drain_s", 0.0)
    device_s = sum(p["num_replicas"] * (p.get("duration_s", plan.get("duration_s", 0.0)) + drain_s) for p in points)
    for p in pilots:
        pilot_s = p.get("duration_s", plan.get("pilot_duration_s", 0.0))
        device_s += pilot_s + min(drain_s, pilot_s)
    return {"points": len(points), "elapsed_s": training_set.meta.get("elapsed_s"),
            "device_s": round(device_s, 1), "cached": was_cached,
            "capacities_rps": training_set.meta.get("capacities_rps", {})}


def learned_oracle(scenario: Scenario, cache_dir: Path, plan: ProfilePlan | None = None,
                   elastic: ElasticPolicy | None = None, policy: OraclePolicy | None = None) -> Oracle:
    """The Oracle of a deployment that profiled its devices: per app, the group's fitted roofline (datasheet and
    fitted efficiencies) as the fallback and the group's two GPs, the apps of a group learning together (one pool of
    samples, `Oracle.share`: online, each refit learns from all their windows). `elastic`: the scaler policy whose
    layout was profiled (default: the live default); `policy`: the oracle's knobs (default: the live default; its
    `profile_lifetime_answer` and `profile_max_replicas` set the plan's, `sim_plan`). `plan`: another base plan,
    those two knobs set on it all the same."""
    from oracle.gp import gp_oracle

    plan = sim_plan(policy, plan or SIM_PLAN)
    oracle = gp_oracle(policy=policy)
    for group in groups_of(scenario):
        training_set = profile_group(scenario, group, cache_dir, plan, elastic=elastic)
        profile = calibrated_profile(training_set, group.ttft_slo_s * 1e3, group.tpot_slo_s * 1e3)
        if profile is None:
            raise ValueError(f"{group.name}: the cached profile records no fitted roofline; delete it to profile again")
        for app in group.apps:
            name = scenario.apps[app].name
            oracle.register(name, profile)
            oracle.share(name, group.name)
        oracle.add_training_set(replace(training_set, model=group.name))
    # the first fits as the live service makes them at start: what the oracle's own refit rule says is due
    for pool, kind in oracle.due_for_refit(0.0):
        oracle.refit(pool, kind, 0.0)
    return oracle

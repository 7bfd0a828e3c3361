"""What every simulated system shares: the engine, the dispatch layer, the lifecycle's load paths, the initial
load snapshot, and the result of a run."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from contracts import ModelLoadWindow
from dispatcher.core import Algorithm, DispatchPolicy, OverloadPolicy

from ..dispatch import CoreDispatch
from ..device_ledger import RESERVED
from ..event_loop import DeviceLog, Sim
from ..executor import SimInstance
from ..metrics import Outcomes, Summary, summarise, trace_span_s
from ..requests import RequestTable
from ..scenario import Scenario

VERIFY_S = 0.05  # per-segment checksums and one canary step after a restore or fork, before the instance is ready


def mark_fork_source(source: SimInstance, until_s: float) -> None:
    """`source` is being forked from until `until_s` (its steps run slower meanwhile: device_effects.py)."""
    source.forked_from_until_s = max(source.forked_from_until_s, until_s)


@dataclass
class RunResult:
    system: str
    outcomes: Outcomes
    devices: DeviceLog
    summary: Summary
    wall_s: float
    num_events: int
    counters: dict = field(default_factory=dict)
    rejections: list = field(default_factory=list)  # (time s, app, error code), in order
    # device-seconds per (app, role, pool) over the trace's span (sim.device_ledger); a system charged for devices
    # it reserved without an instance on them (Prism-like's fixed pool) has its reserve under RESERVED
    device_seconds_by_kind: dict = field(default_factory=dict)
    # for an `extra` hook that tells one app's story (sim/watch.py): the simulator's lifecycle events, which app each
    # instance served, and the control plane's plans (a Janus system's; empty for the others)
    lifecycle_log: list = field(default_factory=list)
    app_of_instance: dict = field(default_factory=dict)
    plans: list = field(default_factory=list)
    # the reconciler's reports of wanted instances it could not bring up, (time s, detail) (a Janus system's)
    blocked: list = field(default_factory=list)


class ControlPlane:
    """A system's policy side. Subclasses place instances at start and react to load windows and timers."""

    name = "base"
    algorithm = Algorithm.LST_IMH
    uses_load_windows = True  # False: the dispatcher cores need not publish (nobody listens)

    def install(self, run: "SystemRun") -> None:
        raise NotImplementedError

    def dispatch_policy(self) -> DispatchPolicy:
        """The dispatcher core's knobs for a baseline: its algorithm, and the dispatcher settings the baselines of
        the headline runs were measured with (a request for a model without a ready instance fails at once, 2 s
        load windows, an infeasible request rejected). Janus runs the live defaults (systems/janus.py)."""
        return DispatchPolicy(algorithm=self.algorithm, max_wait_for_instance_ms=0.0, window_s=2.0,
                              overload=OverloadPolicy.REJECT)

    def on_load(self, now_s: float, window: ModelLoadWindow) -> None:
        """Every load window the dispatcher cores publish (every 0.5 s per model)."""


class SystemRun:
    """One system on one scenario: build, run, summarise."""

    def __init__(self, scenario: Scenario, control: ControlPlane, dispatch_policy: DispatchPolicy | None = None,
                 record: bool = False):
        self.scenario = scenario
        self.control = control
        trace = scenario.trace
        self.table = RequestTable(trace, scenario.ttft_slo_s, scenario.tpot_slo_s)
        dev = scenario.device
        usable_hbm = dev.hbm_bytes * scenario.efficiency.memory_utilization
        self.sim = Sim(self.table, scenario.num_devices, usable_hbm, dev.d2d_bytes_per_s, scenario.effects,
                       horizon_s=trace_span_s(trace))
        self.costs = [scenario.cost(a) for a in range(trace.num_apps)]
        policy = dispatch_policy or control.dispatch_policy()
        if not control.uses_load_windows:
            policy = policy.model_copy(update={"publish_period_ms": 1e12})
        self.recorder = None
        if record:
            from ..recording import Recorder

            self.recorder = Recorder({
                "dispatch_policy": policy.model_dump(mode="json"),
                "prefill_time": {"kind": "roofline", "device": dev.name,
                                 "models": {a.name: {"shape": a.shape_name, "tp": a.tp} for a in scenario.apps}},
                "system": control.name,
            })
        self.dispatch = CoreDispatch(self.sim, trace.app_names, self.costs, policy, self.recorder)
        self.dispatch.load_listeners.append(control.on_load)
        self.warm: set[tuple[int, int]] = set()  # (device, app): weights kept in that host's pinned memory
        # apps warm in some host's memory
        self.warm_apps: set[int] = set(range(trace.num_apps)) if scenario.is_warm_at_start else set()
        self.counters: dict[str, int] = {"fork": 0, "warm_copy": 0, "remote_warm": 0, "cold_load": 0,
                                         "preloaded": 0, "drained": 0, "resumed": 0}

    # ------------------------------------------------------------------------------------------- lifecycle
    def load_path(self, app: int, device_ids: tuple[int, ...], now_s: float) -> tuple[str, float]:
        """The fastest way to bring `app` onto `device_ids` (docs/lifecycle.md), then verify:
        - fork from a live replica over the device link;
        - a warm copy from this host's pinned memory;
        - otherwise the quickest of: a cold load from disk; a pull from another host's pinned memory over the
          network (RDMA reads, as a fork's), one at a time per model (one source host's link); a fork from a
          replica that is still loading, once it is ready (a scale-out from zero loads one replica and forks
          the rest from it)."""
        times = self.costs[app].load_times()
        insts = self.sim.instances_by_app.get(app, ())
        source = next((i for i in insts if i.is_ready), None)
        if source is not None:
            mark_fork_source(source, now_s + times.d2d_s)
            return "fork", times.d2d_s + VERIFY_S
        if all((d, app) in self.warm for d in device_ids):
            return "warm_copy", times.h2d_s + VERIFY_S
        paths = [("cold_load", times.disk_s)]
        loading = [i.ready_at_s for i in insts if not i.is_draining]
        if loading:
            paths.append(("fork", min(loading) - now_s + times.d2d_s))
        elif app in self.warm_apps:
            paths.append(("remote_warm", times.net_s))
        via, load_s = min(paths, key=lambda p: p[1])
        return via, load_s + VERIFY_S

    def launch(self, app: int, role: str, pool: str, device_ids: tuple[int, ...], now_s: float,
               preloaded: bool = False) -> SimInstance:
        """Launch by the fastest load path (`load_path`), or ready at once when `preloaded`."""
        via, load_s = ("preloaded", 0.0) if preloaded else self.load_path(app, device_ids, now_s)
        return self.launch_via(app, role, pool, device_ids, now_s, via, load_s)

    def launch_via(self, app: int, role: str, pool: str, device_ids: tuple[int, ...], now_s: float, via: str,
                   load_s: float, instance_id: str | None = None) -> SimInstance:
        """Launch by the load path `via`, ready after `load_s`."""
        self.counters[via] += 1
        if via in ("preloaded", "cold_load", "remote_warm"):
            self.keep_warm(app, device_ids)  # the weights came through this host's memory and stay there
        return self.sim.launch(app, role, pool, tuple(device_ids), self.costs[app], load_s, via, now_s,
                               instance_id=instance_id)

    def keep_warm(self, app: int, device_ids: tuple[int, ...]) -> None:
        for d in device_ids:
            self.warm.add((d, app))
        self.warm_apps.add(app)

    def retire(self, inst: SimInstance, now_s: float, keep_warm: bool = True) -> None:
        """Drain, then release; the weights stay warm in host memory (elastic removal) unless told otherwise."""
        if keep_warm and inst.executor is not None:
            self.keep_warm(inst.app, inst.executor.device_ids)
        self.counters["drained"] += 1
        self.sim.drain(inst, now_s)

    def take_devices(self, num: int, exclude: set[int] | None = None) -> list[int] | None:
        """`num` free devices (lowest ids first, so groups stay contiguous), or None."""
        free = [d for d in self.sim.free_device_ids() if not exclude or d not in exclude]
        return free[:num] if len(free) >= num else None

    # ------------------------------------------------------------------------------------------- run
    def run(self, progress: Callable[[int], None] | None = None) -> RunResult:
        start = time.perf_counter()
        self.control.install(self)
        self.sim.run(progress=progress)
        wall_s = time.perf_counter() - start
        out = self.table.outcomes()
        log = self.sim.devices_log
        summary = summarise(self.scenario.trace, out, self.scenario.ttft_slo_s[self.scenario.trace.app_ids],
                            self.scenario.tpot_slo_s[self.scenario.trace.app_ids], log.time_s, log.count)
        counters = dict(self.counters, rejected=self.dispatch.num_rejected, events=self.sim.num_events,
                        decodes_moved=self.sim.num_decodes_moved)
        by_kind = self.sim.ledger.seconds_by_kind(trace_span_s(self.scenario.trace))
        reserved_s = summary.device_hours * 3600.0 - sum(by_kind.values())
        if reserved_s > 1e-6 * max(1.0, summary.device_hours * 3600.0):
            by_kind[RESERVED] = reserved_s
        return RunResult(self.control.name, out, log, summary, wall_s, self.sim.num_events, counters,
                         self.dispatch.rejections, by_kind, self.sim.lifecycle_log, self.sim.app_of_instance,
                         getattr(self.control, "plans", []),
                         getattr(getattr(self.control, "fleet", None), "blocked_log", []))


def initial_features(scenario: Scenario, window_s: float = 30.0):
    """Per app, the load over the first `window_s` of the trace: what a system that had been running would know at
    t = 0 (every system starts from the same knowledge)."""
    from ..scenario import window_features

    return [window_features(scenario.trace, a, 0.0, window_s) for a in range(scenario.trace.num_apps)]


def largest_remainder_alloc(weights: np.ndarray, total: int, minimum: np.ndarray) -> np.ndarray:
    """Integer shares of `total` proportional to `weights`, each at least `minimum` (largest-remainder rounding)."""
    minimum = np.asarray(minimum, dtype=np.int64)
    if minimum.sum() > total:
        raise ValueError(f"minimum shares ({minimum.sum()}) exceed the total ({total})")
    spare = total - minimum.sum()
    w = np.asarray(weights, dtype=float)
    w = w / w.sum() if w.sum() > 0 else np.full(len(w), 1.0 / len(w))
    exact = w * spare
    base = np.floor(exact).astype(np.int64)
    left = spare - base.sum()
    order = np.argsort(-(exact - base), kind="stable")
    base[order[:left]] += 1
    return minimum + base

"""The baselines of the paper's comparison, as simple policies over the same engine and dispatcher core.

- Prism-like: periodic placement in a fixed pool, no runtime budget moves. Every 30 s each model gets the replicas
  its busiest window of the last period needs; models needing under half a device share devices (first-fit
  decreasing by memory, as Prism shares GPUs by memory), the rest get dedicated groups. The pool is the whole
  fleet and stays reserved (its device-hours are the fleet's).
- Prism with Janus's global allocator (`prism-janus-allocator`, the paper's comparison): Prism-like's runtime (a
  placement every 30 s sized on the busiest window of the last period, the pool manager, least-load dispatch, the
  whole fleet reserved, no fast path), with the allocation decided by Janus's cores: the steady planner's pool
  assignment and packing (planner.core.SteadyPlanner), and the elastic scaler's oracle-sized counts within the
  devices the packing leaves (planner.core.ElasticScaler; no debounce: at one plan per period, two agreeing plans
  would hold a change for a minute). The same oracle as the simulated Janus (systems/janus.py `make_oracle`).
- BlitzScale-like: per-app autoscaling, no shared steady pool. Every 0.5 s each model gets the colocated replicas its
  current load needs at a target utilisation, at least one; scale-out forks from a live replica over the device
  link (BlitzScale's fast live scaling), scale-in waits `scale_in_hold_s`.
"""
from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING

from contracts import ModelLoadWindow
from dispatcher.core import Algorithm

from .base import ControlPlane, SystemRun, initial_features
from .pools import PoolManager

if TYPE_CHECKING:
    from planner.core import PlannerPolicy


def replicas_for_load(cost, features, utilisation: float, decode_batch: int = 64) -> int:
    """Replicas to keep one model's load under `utilisation` of each replica's time: per request one prefill and
    its output tokens at a decode batch of `decode_batch` (the roofline's step times)."""
    tokens = features.input_len_mean + features.output_len_mean
    if features.token_rate_tps <= 0 or tokens <= 0:
        return 0
    rate_rps = features.token_rate_tps / tokens
    ctx = decode_batch * (features.input_len_mean + features.output_len_mean / 2)
    busy_s = cost.prefill_s(max(1, int(features.input_len_mean))) + \
        features.output_len_mean * cost.decode_s(decode_batch, ctx) / decode_batch
    return max(1, math.ceil(rate_rps * busy_s / utilisation))


class BlitzScaleLike(ControlPlane):
    name = "blitzscale-like"
    algorithm = Algorithm.LEAST_LOAD

    def __init__(self, period_s: float = 0.5, utilisation: float = 0.6, scale_in_hold_s: float = 10.0):
        self.period_s = period_s
        self.utilisation = utilisation
        self.scale_in_hold_s = scale_in_hold_s

    def install(self, run: SystemRun) -> None:
        self.run = run
        self.pools = PoolManager(run)
        self.latest: dict[int, object] = {}
        self.index = {n: a for a, n in enumerate(run.scenario.trace.app_names)}
        self.high_since: dict[int, tuple[int, float]] = {}
        for app, f in enumerate(initial_features(run.scenario)):
            self.latest[app] = f
        self._tick(0.0, preloaded=True)
        run.sim.every(self.period_s, self._tick, start_s=self.period_s, end_s=run.scenario.trace.duration_s)

    def on_load(self, now_s: float, window: ModelLoadWindow) -> None:
        self.latest[self.index[window.model]] = window.features

    def _tick(self, now_s: float, preloaded: bool = False) -> None:
        costs = self.run.costs
        targets: dict[int, tuple[int, int]] = {}
        current = self.pools.elastic_counts()
        for app, f in self.latest.items():
            want = max(1, replicas_for_load(costs[app], f, self.utilisation))
            have = current.get(app, 0)
            if want < have:
                # scale in only after the lower count held for a while (BlitzScale keeps warm capacity briefly)
                since = self.high_since.get(app)
                if since is None or since[0] != want:
                    self.high_since[app] = (want, now_s)
                    want = have
                elif now_s - since[1] < self.scale_in_hold_s:
                    want = have
            else:
                self.high_since.pop(app, None)
            targets[app] = (want, 0)
        rate = {a: f.token_rate_tps for a, f in self.latest.items()}
        self.pools.apply_elastic(targets, now_s, rate, preloaded)


class PrismLike(ControlPlane):
    name = "prism-like"
    algorithm = Algorithm.LEAST_LOAD

    def __init__(self, period_s: float = 30.0, utilisation: float = 0.7, share_below: float = 0.5):
        self.period_s = period_s
        self.utilisation = utilisation
        self.share_below = share_below

    def install(self, run: SystemRun) -> None:
        self.run = run
        self.pools = PoolManager(run)
        self.index = {n: a for a, n in enumerate(run.scenario.trace.app_names)}
        self.history: dict[int, deque] = {a: deque() for a in range(run.scenario.trace.num_apps)}
        for app, f in enumerate(initial_features(run.scenario)):
            self.history[app].append((0.0, f))
        # the fixed pool is reserved whole for the run
        run.sim.devices_log.pinned_count = run.scenario.num_devices
        run.sim.devices_log.record(0.0, run.scenario.num_devices)
        self._place(0.0, preloaded=True)
        run.sim.every(self.period_s, self._place, start_s=self.period_s, end_s=run.scenario.trace.duration_s)

    def on_load(self, now_s: float, window: ModelLoadWindow) -> None:
        h = self.history[self.index[window.model]]
        h.append((now_s, window.features))
        while h and h[0][0] < now_s - self.period_s:
            h.popleft()

    def _place(self, now_s: float, preloaded: bool = False) -> None:
        run = self.run
        scenario = run.scenario
        shared: dict[int, tuple[float, float]] = {}  # app -> (hbm share, busy share) of one device
        dedicated: dict[int, int] = {}
        for app, h in self.history.items():
            peak = max((f for _, f in h), key=lambda f: f.token_rate_tps, default=None)
            cost = run.costs[app]
            if cost.tp == 1 and peak is not None:
                rm = cost.roofline
                spec = scenario.apps[app]
                need = rm.needs(peak, spec.tpot_slo_s * 1e3) if peak.token_rate_tps > 0 else None
                hbm = rm.weight_bytes / (scenario.device.hbm_bytes * scenario.efficiency.memory_utilization)
                busy = 0.0 if need is None else max(need.compute, need.bandwidth)
                if busy < self.share_below and hbm < 0.5:
                    shared[app] = (max(hbm, 0.0 if need is None else need.hbm), busy)
                    continue
            dedicated[app] = max(1, replicas_for_load(cost, peak, self.utilisation)) if peak is not None else 1
        # first-fit decreasing by memory over shared devices
        bins: list[list] = []
        for app in sorted(shared, key=lambda a: -shared[a][0]):
            hbm, busy = shared[app]
            for b in bins:
                if b[0] + hbm <= 1.0 and b[1] + busy <= self.utilisation:
                    b[0] += hbm
                    b[1] += busy
                    b[2].append(app)
                    break
            else:
                bins.append([hbm, busy, [app]])
        devices = self._shared_devices(len(bins))
        self.pools.apply_steady({d: b[2] for d, b in zip(devices, bins)}, now_s, preloaded)
        targets = {app: (n, 0) for app, n in dedicated.items()}
        rate = {app: self.history[app][-1][1].token_rate_tps if self.history[app] else 0.0 for app in dedicated}
        self.pools.apply_elastic(targets, now_s, rate, preloaded)

    def _shared_devices(self, num: int) -> list[int]:
        keep = sorted(self.pools.steady_devices)[:num]
        free = [d for d in self.run.sim.free_device_ids() if d not in keep]
        return keep + free[: num - len(keep)]


class PrismJanusAllocator(PrismLike):
    """Prism-like with Janus's global allocator: every period, the busiest window of the last period goes to the
    steady planner (which models share devices, packed where) and to the elastic scaler (replicas of the others,
    within the devices the steady pool leaves); the pool manager carries the result out."""

    name = "prism-janus-allocator"

    def __init__(self, planner_policy: "PlannerPolicy | None" = None, period_s: float = 30.0):
        super().__init__(period_s=period_s)
        from planner.core import PlannerPolicy

        policy = planner_policy or PlannerPolicy()
        self.planner_policy = policy.model_copy(update={"elastic": policy.elastic.model_copy(
            update={"is_debounced": False})})

    def install(self, run: SystemRun) -> None:
        from planner.core import ElasticScaler, SteadyPlanner

        from ..oracle_cache import CachedOracle
        from .fleet import worker_id_of
        from .janus import make_oracle

        p = self.planner_policy
        oracle = CachedOracle(make_oracle(run))
        self.steady = SteadyPlanner(oracle, p.steady, p.pool, id_prefix="prism-steady")
        self.scaler = ElasticScaler(oracle, p.elastic)
        self.names = list(run.scenario.trace.app_names)
        self.workers = [worker_id_of(d) for d in range(run.scenario.num_devices)]
        self.tp = {n: run.costs[a].tp for a, n in enumerate(self.names)}
        super().install(run)

    def _place(self, now_s: float, preloaded: bool = False) -> None:
        from planner.core import elastic_models_of

        from .fleet import device_of
        from .janus import window_of

        now_ms = now_s * 1e3
        for app, h in self.history.items():  # the period's busiest window is the load both planners see
            peak = max((f for _, f in h), key=lambda f: f.token_rate_tps, default=None)
            if peak is not None:
                window = window_of(self.names[app], peak, self.period_s, now_ms)
                self.steady.observe(window)
                self.scaler.observe(window)
        plan = self.steady.plan(now_ms, self.names, self.workers, trigger="startup" if preloaded else "periodic").plan
        bins = {device_of(b.worker_id): [self.index[m] for m in b.models] for b in plan.bins}
        self.pools.apply_steady(bins, now_s, preloaded)
        in_flight = {self.names[app]: sum(i.num_in_flight for i in insts)
                     for (app, _), insts in self.pools.elastic.items()}
        elastic = self.scaler.tick(now_ms, elastic_models_of(plan, self.names), len(self.workers) - len(bins),
                                   devices_per_instance=self.tp, in_flight=in_flight).plan
        targets = {self.index[t.model]: (t.num_prefill, t.num_decode) for t in elastic.targets}
        rate = {app: self.history[app][-1][1].token_rate_tps if self.history[app] else 0.0 for app in targets}
        self.pools.apply_elastic(targets, now_s, rate, preloaded)

"""Janus on the simulator: the steady planner every 30 s, the elastic scaler every 0.5 s, the dispatcher's LST-IMH,
lifecycle load paths; and its two ablations (steady pool only, elastic pool only). The planner and oracle cores are
the project's own (planner.core, oracle.core); plans are carried out by systems.pools."""
from __future__ import annotations

from contracts import LoadFeatures, ModelLoadWindow
from dispatcher.core import Algorithm, DispatchPolicy, OverloadPolicy
from oracle.core.oracle import ModelProfile, Oracle
from planner.core import ElasticPolicy, ElasticScaler, OverflowWatch, PoolPolicy, SteadyPlanner, SteadyPolicy
from planner.core import scale_to_budget, split_prefill_decode, unpadded_counts

from ..costmodel import fast_roofline
from ..oracle_cache import CachedOracle
from .base import ControlPlane, SystemRun, initial_features
from .pools import PoolManager

UNBOUNDED_BUDGET = 1_000_000
# A request for a model with no ready instance waits this long for one (the scaler sees it in the next load window
# and launches one) instead of failing at once: served late beats not served.
MAX_WAIT_FOR_INSTANCE_MS = 30_000.0


def make_oracle(run: SystemRun, need_rel_std: float = 0.25, attainment_std: float = 0.005) -> Oracle:
    """The project's Oracle with a roofline profile per app (no fitted GP: the simulated devices run the same
    roofline, so its spread is small; `attainment_std` covers the queueing model's error)."""
    profiles = {}
    for app, spec in enumerate(run.scenario.apps):
        profiles[spec.name] = ModelProfile(fast_roofline(run.costs[app]), spec.ttft_slo_s * 1e3, spec.tpot_slo_s * 1e3,
                                           roofline_need_rel_std=need_rel_std,
                                           roofline_attainment_std=attainment_std)
    return Oracle(profiles)


def window_of(name: str, features: LoadFeatures, window_s: float, now_ms: float) -> ModelLoadWindow:
    tokens = features.input_len_mean + features.output_len_mean
    rate = features.token_rate_tps / tokens if tokens > 0 else 0.0
    return ModelLoadWindow(model=name, window_s=window_s, end_unix_ms=now_ms, num_requests=int(round(rate * window_s)),
                           request_rate_rps=rate, features=features)


class JanusControl(ControlPlane):
    """Steady pool + elastic pool. `mode`: "both" (Janus), "steady_only" (no elastic fast path: models the pool
    assigner would isolate get their replicas sized only at the steady period), "elastic_only" (every model in the
    elastic pool)."""

    algorithm = Algorithm.LST_IMH

    def __init__(self, mode: str = "both", steady_period_s: float = 30.0, elastic_period_s: float = 0.5,
                 elastic_policy: ElasticPolicy | None = None, steady_policy: SteadyPolicy | None = None,
                 pool_policy: PoolPolicy | None = None, name: str | None = None, keepalive_s: float = 60.0,
                 resumes_draining: bool = True):
        if mode not in ("both", "steady_only", "elastic_only"):
            raise ValueError(f"unknown mode {mode!r}")
        self.mode = mode
        self.name = name or {"both": "janus", "steady_only": "steady-only", "elastic_only": "elastic-only"}[mode]
        self.steady_period_s = steady_period_s
        self.elastic_period_s = steady_period_s if mode == "steady_only" else elastic_period_s
        # Five knobs differ from the scaler's defaults, all measured on the headline scenario (docs/bench/sim.md):
        # - the replica cap (64) is below what the busiest model of a 768-device fleet needs at a burst;
        # - load_headroom 1.5 (static partition sizes its replicas at 0.7 utilisation, 1/0.7 = 1.43) and a
        #   scale-in band up to 3x the rate. First 300 s, decode_token_cost_ratio 1.0: no headroom 0.927 on 26.2
        #   device-hours, 1.5 -> 0.989 on 35.1, 1.5 with the band -> 0.996 on 36.5 with a third fewer forks.
        # With the headroom, the default prefill/decode split (decode_token_cost_ratio 2.0) serves decode best:
        # first 900 s, 1.0 -> 0.918, 1.5 -> 0.959, 2.0 -> 0.968; the whole headline, 1.0 -> 0.880, 2.0 -> 0.954.
        # - backlog_drain_s 1: also size for the dispatchers' queued requests, cleared within 1 s. A 5 s window lags
        #   a burst; the queue shows it at once. First 300 s: default mix 0.9912 -> 0.9964 on 9 % more
        #   device-hours, light mix 0.9374 -> 0.9957 on 10 % more (2 s: 0.9931 / 0.9855; 0.5 s: 0.9982 / 0.9972).
        # - min_num_disaggregated 3: two instances run colocated, not one prefill and one decode. The oracle sizes m
        #   as m colocated replicas; a lone decode instance then takes all of a long-output model's decoding, and a
        #   count flapping between 1 and 2 switched the model between colocated and P/D. Whole headline, Janus only:
        #   worst app (app-05, qwen2.5-32b tp2) 0.896 -> 0.929 (no app below 0.929), token attainment 0.9826 ->
        #   0.9800, device-hours 280.0 -> 284.1; 4: worst 0.929, attainment 0.9719. Holding P/D up for 30 s
        #   instead took app-05 to 0.622.
        self.elastic_policy = elastic_policy or ElasticPolicy(max_num_replicas=256, load_headroom=1.5,
                                                              scale_in_headroom=3.0, backlog_drain_s=1.0,
                                                              min_num_disaggregated=3)
        self.steady_policy = steady_policy or SteadyPolicy(period_s=steady_period_s)
        if pool_policy is None and mode == "elastic_only":
            pool_policy = PoolPolicy(large_need_enter=1e-9, large_need_exit=1e-9)  # everything is "large"
        self.pool_policy = pool_policy or PoolPolicy()
        self.plans: list = []  # every plan, for the audit trail and the replay recording
        # DESIGN.md: "keep at least one instance for each model with traffic". The scaler judges traffic on the
        # last load window (2 s); a sparse model then flaps to zero between requests and each arrival meets
        # NO_INSTANCE. Here a model that had a request within keepalive_s keeps one instance.
        self.keepalive_s = keepalive_s
        # Resume a model's draining instances when its count rises again (PoolManager.resumes_draining): a drained
        # decode instance holds its devices until its longest sequence ends, and held 38 % of Janus's busy devices
        # on the headline. Runs 17-18 (docs/bench/sim.md): device-hours 284.1 -> ~249 at 0.99 token attainment.
        self.resumes_draining = resumes_draining
        self.last_request_s: dict[str, float] = {}

    def dispatch_policy(self) -> DispatchPolicy:
        """LST-IMH; requests no instance can finish in time are requeued late rather than rejected (token-level
        attainment still counts their later tokens that meet their deadlines); a request for a model without a
        ready instance waits up to MAX_WAIT_FOR_INSTANCE_MS for one; load windows of 5 s, since the planners read
        these windows and 2 s of a bursty app is mostly noise."""
        return DispatchPolicy(algorithm=Algorithm.LST_IMH, overload=OverloadPolicy.REQUEUE, window_s=5.0,
                              max_wait_for_instance_ms=MAX_WAIT_FOR_INSTANCE_MS)

    def install(self, run: SystemRun) -> None:
        self.run = run
        self.names = run.scenario.trace.app_names
        self.index = {n: a for a, n in enumerate(self.names)}
        oracle = self.oracle = CachedOracle(make_oracle(run))
        if run.recorder is not None:
            from ..recording import RecordingOracle

            oracle = RecordingOracle(oracle, run.recorder)
        self.steady = SteadyPlanner(oracle, self.steady_policy, self.pool_policy)
        # An early steady plan needs the fast path's tick to notice the queue: Janus only, not the ablations.
        self.overflow = OverflowWatch(self.steady_policy) if self.mode == "both" else None
        self.num_overflow_plans = 0
        self.scaler = ElasticScaler(oracle, self.elastic_policy)
        if run.recorder is not None:
            from ..recording import RecordingPlanner

            run.recorder.header["config"].update(
                steady_policy=self.steady_policy.model_dump(mode="json"),
                pool_policy=self.pool_policy.model_dump(mode="json"),
                elastic_policy=self.elastic_policy.model_dump(mode="json"))
            self.steady = RecordingPlanner(self.steady, run.recorder, "steady")
            self.scaler = RecordingPlanner(self.scaler, run.recorder, "elastic")
        self.pools = PoolManager(run, resumes_draining=self.resumes_draining)
        self.elastic_models: list[str] = []
        self.steady_models: list[str] = []
        self.latest: dict[str, ModelLoadWindow] = {}
        for app, f in enumerate(initial_features(run.scenario)):
            w = window_of(self.names[app], f, 30.0, 0.0)
            self.on_load(0.0, w)
        self._steady_tick(0.0, preloaded=True)
        # A system that had been running would hold its counts: two agreeing plans get past the debounce.
        self.scaler.tick(0.0, self.elastic_models, UNBOUNDED_BUDGET)
        self._elastic_tick(0.0, preloaded=True)
        run.sim.every(self.steady_period_s, self._steady_tick, start_s=self.steady_period_s,
                      end_s=run.scenario.trace.duration_s)
        run.sim.every(self.elastic_period_s, self._elastic_tick, start_s=self.elastic_period_s,
                      end_s=run.scenario.trace.duration_s)

    def on_load(self, now_s: float, window: ModelLoadWindow) -> None:
        self.latest[window.model] = window
        if window.num_requests > 0:
            self.last_request_s[window.model] = now_s
        self.steady.observe(window)
        self.scaler.observe(window)
        if self.overflow is not None:
            self.overflow.observe(window)

    # ------------------------------------------------------------------------------------------ slow path
    def _worker_order(self) -> list[str]:
        """Devices in order of preference for the steady planner: its own, then free, then elastic ones."""
        sim = self.run.sim
        own = sorted(self.pools.steady_devices)
        rest = [d for d in range(self.run.scenario.num_devices) if d not in self.pools.steady_devices]
        free = [d for d in rest if d not in sim.executor_of_device]
        busy = [d for d in rest if d in sim.executor_of_device]
        return [f"d{d}" for d in own + free + busy]

    def _steady_tick(self, now_s: float, preloaded: bool = False, trigger: str = "periodic") -> None:
        if self.mode == "elastic_only":
            self.elastic_models = list(self.names)
            return
        decision = self.steady.plan(now_s * 1e3, list(self.names), self._worker_order(),
                                    trigger="startup" if preloaded else trigger)
        plan = decision.plan
        self.plans.append(plan)
        bins = {int(b.worker_id[1:]): [self.index[m] for m in b.models] for b in plan.bins}
        self.pools.apply_steady(bins, now_s, preloaded)
        placed = set(plan.steady_models)
        self.elastic_models = [m for m in self.names if m not in placed]
        self.steady_models = sorted(placed)

    # ------------------------------------------------------------------------------------------ fast path
    def _elastic_tick(self, now_s: float, preloaded: bool = False) -> None:
        if self.overflow is not None and self.overflow.due(now_s * 1e3, self.steady_models):
            self.num_overflow_plans += 1
            self._steady_tick(now_s, trigger="overflow")
        decision = self.scaler.tick(now_s * 1e3, self.elastic_models, UNBOUNDED_BUDGET)
        plan = decision.plan
        self.plans.append(plan)
        costs = self.run.costs
        # The scaler counts one device per instance; tensor-parallel models take tp. Scale to the budget in
        # device units with the scaler's own rounding, then split each model's instances into prefill/decode again.
        wanted = {t.model: t.num_prefill + t.num_decode for t in plan.targets}
        tp = {m: costs[self.index[m]].tp for m in wanted}
        wanted_devices = {m: n * tp[m] for m, n in wanted.items()}
        budget = max(0, self.pools.elastic_budget())
        rate = {t.model: self.latest[t.model].features.token_rate_tps if t.model in self.latest else 0.0
                for t in plan.targets}
        floor = None
        if sum(wanted_devices.values()) > budget:  # padding is served last (scale_to_budget's floor)
            floor = {m: n * tp[m] for m, n in unpadded_counts(wanted, self.latest, self.elastic_policy).items()}
        allotted = scale_to_budget(wanted_devices, budget, priority=rate, floor=floor)
        targets: dict[int, tuple[int, int]] = {}
        for t in plan.targets:
            app = self.index[t.model]
            n = allotted[t.model] // costs[app].tp
            recent = now_s - self.last_request_s.get(t.model, float("-inf")) <= self.keepalive_s
            if n == 0 and recent and budget >= costs[app].tp:
                targets[app] = (1, 0)
            elif n == t.num_prefill + t.num_decode:
                targets[app] = (t.num_prefill, t.num_decode)
            else:
                features = self.latest[t.model].features if t.model in self.latest else None
                targets[app] = split_prefill_decode(n, features, self.elastic_policy) if features else (n, 0)
        self.pools.apply_elastic(targets, now_s, {self.index[m]: r for m, r in rate.items()}, preloaded)

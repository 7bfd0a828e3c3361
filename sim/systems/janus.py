"""Janus on the simulator, and its two ablations (steady pool only, elastic pool only): wiring only. The steady
planner every `steady.period_s`, the elastic scaler every `elastic.period_s`, the reconciler and the dispatcher's
LST-IMH are the project's cores with the live system's defaults (`PlannerPolicy()`, `DispatchPolicy()`); the
simulated fleet (systems/fleet.py) carries out the reconciler's commands. What a policy decides is decided in
planner/core or dispatcher/core, never here (docs/sim.md, "One control plane")."""
from __future__ import annotations

from dataclasses import asdict

from contracts import LoadFeatures, ModelLoadWindow, ModelState
from dispatcher.core import DispatchPolicy
from oracle.core.drift import DriftTracker
from oracle.core.intake import WindowIntake
from oracle.core.oracle import ModelProfile, Oracle
from oracle.core.policy import OraclePolicy
from oracle.core.replicas import ReplicaCounts
from planner.core import (ElasticScaler, OverflowWatch, PlannerPolicy, PoolPolicy, Reconciler, SteadyPlanner,
                          decode_kv_by_model, elastic_budget_devices, elastic_models_of, in_flight_by_model,
                          plan_decision, steady_worker_order)

from ..costmodel import fast_roofline
from ..oracle_cache import CachedOracle
from ..refitter import SimulatedRefitter
from .base import ControlPlane, SystemRun, initial_features
from .fleet import SimFleet

MODES = {"both": "janus", "steady_only": "steady-only", "elastic_only": "elastic-only"}


def make_oracle(run: SystemRun, need_rel_std: float = 0.25, attainment_std: float = 0.005) -> Oracle:
    """The project's Oracle with a roofline profile per app (no fitted GP: the simulated devices run the same
    roofline, so its spread is small; `attainment_std` covers the queueing model's error)."""
    profiles = {}
    for app, spec in enumerate(run.scenario.apps):
        profiles[spec.name] = ModelProfile(fast_roofline(run.costs[app]), spec.ttft_slo_s * 1e3, spec.tpot_slo_s * 1e3,
                                           roofline_need_rel_std=need_rel_std,
                                           roofline_attainment_std=attainment_std)
    return Oracle(profiles)


def roofline_oracle(run: SystemRun) -> Oracle:
    """What the live system answers from before any profile: the device's datasheet and the model's shape with
    default efficiencies, and the live defaults' spread (`ModelProfile`)."""
    from oracle.roofline import Efficiency, RooflineModel

    profiles = {}
    for app, spec in enumerate(run.scenario.apps):
        datasheet = run.costs[app].roofline
        roofline = RooflineModel(datasheet.device, datasheet.shape, tp=datasheet.tp,
                                 efficiency=Efficiency(max_num_seqs=datasheet.efficiency.max_num_seqs))
        profiles[spec.name] = ModelProfile(roofline, spec.ttft_slo_s * 1e3, spec.tpot_slo_s * 1e3)
    return Oracle(profiles)


ORACLES = ("learned", "clairvoyant", "roofline")


def window_of(name: str, features: LoadFeatures, window_s: float, now_ms: float) -> ModelLoadWindow:
    tokens = features.input_len_mean + features.output_len_mean
    rate = features.token_rate_tps / tokens if tokens > 0 else 0.0
    return ModelLoadWindow(model=name, window_s=window_s, end_unix_ms=now_ms, num_requests=int(round(rate * window_s)),
                           request_rate_rps=rate, features=features)


def ablation_policy(mode: str, policy: PlannerPolicy) -> PlannerPolicy:
    """The planner policy of an ablation: "elastic_only" sends every model to the elastic pool (every model
    counts as large); "steady_only" sizes the elastic pool's replicas only at the steady period."""
    if mode == "elastic_only":
        return policy.model_copy(update={"pool": PoolPolicy(large_need_enter=1e-9, large_need_exit=1e-9)})
    if mode == "steady_only":
        return policy.model_copy(update={"elastic": policy.elastic.model_copy(
            update={"period_s": policy.steady.period_s})})
    return policy


class JanusControl(ControlPlane):
    """Steady pool + elastic pool. `mode`: "both" (Janus), "steady_only" (no elastic fast path: models the pool
    assigner would isolate get their replicas sized only at the steady period), "elastic_only" (every model in the
    elastic pool)."""

    def __init__(self, mode: str = "both", planner_policy: PlannerPolicy | None = None,
                 dispatch: DispatchPolicy | None = None, name: str | None = None, oracle: str = "clairvoyant",
                 oracle_cache_dir: str = "artifacts/sim-oracle", refit_wall_s: float | None = None,
                 oracle_policy: OraclePolicy | None = None):
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}")
        if oracle not in ORACLES:
            raise ValueError(f"unknown oracle {oracle!r}; one of {', '.join(ORACLES)}")
        self.mode = mode
        # "learned": GPs fitted on profiles of the simulated device (sim/oracle_training.py); "clairvoyant": the
        # roofline of the cost model that times the simulated devices; "roofline": the datasheet's, untrained
        self.oracle_kind = oracle
        self.oracle_cache_dir = oracle_cache_dir
        self.refit_wall_s = refit_wall_s  # None: each online refit serves after its measured wall time
        self.oracle_policy = oracle_policy or OraclePolicy()  # the YAML's `oracle` knobs, as the service reads them
        self.name = name or MODES[mode]
        self.planner_policy = ablation_policy(mode, planner_policy or PlannerPolicy())
        self._dispatch = dispatch or DispatchPolicy()
        self.algorithm = self._dispatch.algorithm
        self.plans: list = []  # every plan, for the audit trail
        self.learner: Oracle | None = None  # the learned oracle, learning online (`_learn`)
        self.intake: WindowIntake | None = None
        self.refitter: SimulatedRefitter | None = None

    def dispatch_policy(self) -> DispatchPolicy:
        return self._dispatch

    def policies(self) -> dict:
        """The policies this system runs with, in the shape `janus config` prints them."""
        return {"dispatcher": self._dispatch.model_dump(mode="json"),
                "planner": self.planner_policy.model_dump(mode="json"), "oracle": asdict(self.oracle_policy)}

    def install(self, run: SystemRun) -> None:
        p = self.planner_policy
        self.run = run
        self.names = list(run.scenario.trace.app_names)
        self.index = {n: a for a, n in enumerate(self.names)}
        self.devices_per_instance = {n: run.costs[a].tp for a, n in enumerate(self.names)}
        oracle = self.oracle = CachedOracle(self._make_oracle(run))
        self.steady = SteadyPlanner(oracle, p.steady, p.pool)
        self.scaler = ElasticScaler(oracle, p.elastic)
        self.reconciler = Reconciler(p.reconciler)
        if run.recorder is not None:
            from ..recording import RecordingOracle, RecordingPlanner, RecordingReconciler

            oracle = RecordingOracle(oracle, run.recorder)
            self.steady, self.scaler = SteadyPlanner(oracle, p.steady, p.pool), ElasticScaler(oracle, p.elastic)
            run.recorder.header["config"].update(planner_policy=p.model_dump(mode="json"))
            self.steady = RecordingPlanner(self.steady, run.recorder, "steady")
            self.scaler = RecordingPlanner(self.scaler, run.recorder, "elastic")
            self.reconciler = RecordingReconciler(self.reconciler, run.recorder)
        # An early steady plan needs the fast path's tick to notice the queue: Janus only, not the ablations.
        self.overflow = OverflowWatch(p.steady) if self.mode == "both" else None
        self.num_overflow_plans = 0
        self.fleet = SimFleet(run, self.reconciler, reconcile_period_s=p.reconcile_period_s)
        self.steady_plan = None
        self.elastic_models = list(self.names)
        self.last_elastic = None
        self.last_elastic_sent_s = float("-inf")
        self._is_wake_due = False
        for app, f in enumerate(initial_features(run.scenario)):
            self.on_load(0.0, window_of(self.names[app], f, 30.0, 0.0))
        # At t = 0 the system has been running: its placement is there and ready. Two agreeing elastic plans get
        # past the debounce. The live planner makes its first steady plan once the workers' heartbeats are in
        # (`startup_delay_s`): so here, else the startup plan sees no device and sends every model elastic.
        self.fleet.report_all(0.0)
        self.fleet.settle(0.0, self._steady_tick(0.0, trigger="startup", deliver=False))
        self.fleet.settle(0.0, self.reconciler.on_tick(0.0))
        self._plan_elastic(0.0)
        self.fleet.settle(0.0, self._elastic_effects(0.0))
        duration_s = run.scenario.trace.duration_s
        steady_s, elastic_s = p.steady.period_s, p.elastic.period_s
        run.sim.every(steady_s, self._steady_tick, start_s=steady_s, end_s=duration_s)
        run.sim.every(elastic_s, self._elastic_tick, start_s=elastic_s, end_s=duration_s)

    def _make_oracle(self, run: SystemRun) -> Oracle:
        if self.oracle_kind == "learned":
            from pathlib import Path

            from ..oracle_training import learned_oracle

            oracle = learned_oracle(run.scenario, Path(self.oracle_cache_dir), elastic=self.planner_policy.elastic,
                                    policy=self.oracle_policy)
            # it learns online as the live oracle service does: the windows' token-level attainment (the workers'
            # outcomes) against the replicas serving, refits as its policy makes them due (`_learn`)
            self.learner = oracle
            # the counts the heartbeats would show, and since when; the windows merged as the service merges them
            self.intake = WindowIntake(DriftTracker(), ReplicaCounts())
            self.refitter = SimulatedRefitter(oracle, run.sim.at, self._refitted, fixed_wall_s=self.refit_wall_s)
            run.dispatch.report_outcomes()
            return oracle
        return roofline_oracle(run) if self.oracle_kind == "roofline" else make_oracle(run)

    @property
    def num_refits(self) -> int:
        return self.refitter.num_refits if self.refitter is not None else 0

    def _learn(self, now_s: float, window: ModelLoadWindow) -> None:
        """What the oracle service does with a window (oracle/service.py, through oracle/core/intake.py): merged
        with the other dispatchers' (one here), scored against the prediction made without it, learnt, and the
        refits now due started one at a time, each new GP serving once its training's wall time has passed
        (sim/refitter.py, as the live refit thread). The replicas are the serving instances the heartbeats report,
        as live."""
        learner = self.learner
        self.intake.replica_counts.update(window.model, sum(
            1 for _, status in self.fleet.instances()
            if status.model == window.model and status.state == ModelState.ACTIVE), now_s * 1e3)
        if self.intake.take(window, learner, learner, now_s).is_learnt:
            self.refitter.poke(now_s)

    def _refitted(self, now_s: float) -> None:
        refitter = self.refitter
        self.run.counters["oracle_refits"] = refitter.num_refits
        self.run.counters["oracle_refit_wall_s"] = round(sum(refitter.fit_walls_s), 1)
        self.run.counters["oracle_refit_max_wall_s"] = round(max(refitter.fit_walls_s), 2)
        self.oracle.clear()  # the memo's answers were the old GPs'

    def on_load(self, now_s: float, window: ModelLoadWindow) -> None:
        if self.learner is not None and now_s > 0:
            self._learn(now_s, window)
        self.steady.observe(window)
        self.scaler.observe(window)
        if self.overflow is not None:
            self.overflow.observe(window)
        if now_s > 0 and not self._is_wake_due and self.scaler.is_waking(window):
            self._is_wake_due = True
            self.run.sim.at(now_s, self._wake)  # after this event: the service's wake task runs next

    def _wake(self, now_s: float) -> None:
        """The scaler service's `wake_once`: the last plan with a first instance for each model waiting for one."""
        self._is_wake_due = False
        budget = elastic_budget_devices(self.fleet.alive_workers(), self.steady_plan, self.fleet.instances())
        plan = self.scaler.wake(now_s * 1e3, budget)
        if plan is None:
            return
        self.plans.append(plan)
        self.last_elastic, self.last_elastic_sent_s = plan, now_s
        self.fleet.apply(self.reconciler.on_elastic_plan(now_s * 1e3, plan), now_s)

    # ------------------------------------------------------------------------------------------ slow path
    def _steady_tick(self, now_s: float, trigger: str = "periodic", deliver: bool = True):
        if self.mode == "elastic_only":
            return self.reconciler.on_tick(now_s * 1e3)
        fleet = self.fleet
        workers = steady_worker_order(fleet.alive_workers(), self.steady_plan, fleet.instances())
        plan = self.steady.plan(now_s * 1e3, self.names, workers, trigger=trigger).plan
        self.plans.append(plan)
        self.steady_plan = plan
        if self.overflow is not None:
            self.overflow.planned(plan)
        self.elastic_models = elastic_models_of(plan, self.names)
        effects = self.reconciler.on_steady_plan(now_s * 1e3, plan)
        if deliver:
            fleet.apply(effects, now_s)
        return effects

    # ------------------------------------------------------------------------------------------ fast path
    def _plan_elastic(self, now_s: float):
        instances = self.fleet.instances()
        budget = elastic_budget_devices(self.fleet.alive_workers(), self.steady_plan, instances)
        plan = self.scaler.tick(now_s * 1e3, self.elastic_models, budget,
                                devices_per_instance=self.devices_per_instance,
                                in_flight=in_flight_by_model(instances),
                                decode_kv=decode_kv_by_model(instances)).plan
        self.plans.append(plan)
        return plan

    def _elastic_effects(self, now_s: float):
        """The elastic plan of this tick, to the reconciler when its decision changed (or, unchanged, every
        `elastic_republish_s`), as the scaler service publishes it."""
        plan = self._plan_elastic(now_s)
        is_due = now_s - self.last_elastic_sent_s >= self.planner_policy.elastic_republish_s
        if self.last_elastic is not None and plan_decision(plan) == plan_decision(self.last_elastic) and not is_due:
            return None
        self.last_elastic, self.last_elastic_sent_s = plan, now_s
        return self.reconciler.on_elastic_plan(now_s * 1e3, plan)

    def _elastic_tick(self, now_s: float) -> None:
        if self.overflow is not None and self.steady_plan is not None and \
                self.overflow.due(now_s * 1e3, self.steady_plan.steady_models):
            self.num_overflow_plans += 1
            self._steady_tick(now_s, trigger="overflow")
        effects = self._elastic_effects(now_s)
        if effects is not None:
            self.fleet.apply(effects, now_s)

"""The elastic scaler service: a thin shell around planner.core.ElasticScaler.

In: model load windows, worker heartbeats (how many devices exist), the latest steady plan (which models are
elastic, how many devices the steady pool holds). Every `planner.elastic.period_s` it ticks in a worker thread (the
binary search asks the oracle over the bus) and publishes the ElasticPlan into PLANS on `janus.plan.elastic` when
its decision changed, and at least every `planner.elastic_republish_s` (so the stream stays small)."""
from __future__ import annotations

import asyncio
import logging
import time

from contracts import ElasticPlan, ModelLoadWindow, SteadyPlan, WorkerHeartbeat, subjects
from runtime.bus import Bus, BusError, Envelope
from runtime.service import Service, cancel_and_wait
from runtime.settings import ClusterConfig, JanusSettings

from .bus_oracle import BusOracle
from .core.fleet_state import decode_kv_by_model, elastic_budget_devices, elastic_models_of, in_flight_by_model
from .core.fleet_state import reported
from .core.elastic import ElasticScaler, plan_decision
from .core.oracle_port import OracleAnswerError
from .core.policy import PlannerPolicy
from .leader import Elected, leadership_detail
from .shell import WorkerLiveness, ensure_plans_stream, last_plan, now_ms, plan_id_prefix, publish_event

log = logging.getLogger("janus.planner.elastic")


class ElasticScalerService(Elected, Service):
    name = "elastic-scaler"

    def __init__(self, settings: JanusSettings, cluster: ClusterConfig) -> None:
        super().__init__(settings, cluster)
        self.policy = PlannerPolicy(**cluster.planner)
        self.core: ElasticScaler | None = None
        self.workers = WorkerLiveness(self.policy.reconciler.heartbeat_timeout_ms)
        self.steady_plan: SteadyPlan | None = None
        self._windows: list[ModelLoadWindow] = []
        self._task: asyncio.Task | None = None
        self.last_published: ElasticPlan | None = None
        self._last_published_ms = 0.0
        self.num_ticks = 0
        self.num_published = 0
        self.num_failures = 0
        self._ticking = asyncio.Lock()  # one tick at a time: the core is not thread-safe
        self._early: asyncio.Task | None = None
        self._waking: asyncio.Task | None = None
        self.num_woken = 0

    async def start(self, bus: Bus) -> None:
        await ensure_plans_stream(bus, self.policy.plans_max_age_s, self.cluster.jetstream_replicas)
        oracle = BusOracle(bus, asyncio.get_running_loop())
        self.core = ElasticScaler(oracle, self.policy.elastic, id_prefix=plan_id_prefix("elastic", self.instance),
                                  is_observe_only=self.policy.is_observe_only)
        self.steady_plan = await last_plan(bus, subjects.PLAN_STEADY, SteadyPlan)  # type: ignore[assignment]
        await bus.subscribe(subjects.MODEL_TELEMETRY_WILDCARD, ModelLoadWindow, self._on_window, traced=False)
        await bus.subscribe(subjects.WORKER_TELEMETRY_WILDCARD, WorkerHeartbeat, self._on_heartbeat, traced=False)
        await bus.subscribe(subjects.PLAN_STEADY, SteadyPlan, self._on_steady_plan)
        await self.campaign()
        self._task = asyncio.create_task(self._periodic())

    async def stop(self) -> None:
        await cancel_and_wait(self._task, self._early, self._waking, what="elastic scaler")
        await self.end_campaign()

    async def _on_leadership(self, is_leader: bool) -> None:
        """Taking over: tick at once (the first plan of a term is always published), not at the next period."""
        if is_leader and (self._early is None or self._early.done()):
            self._early = asyncio.create_task(self._tick_logged())
        elif not is_leader:
            self.last_published = None  # a later term starts with a published plan

    def health_detail(self) -> dict[str, str]:
        detail = {"ticks": str(self.num_ticks), "published": str(self.num_published),
                  "woken": str(self.num_woken), "failures": str(self.num_failures)}
        if self.last_published is not None:
            detail["last_plan"] = self.last_published.plan_id
            detail["elastic_devices"] = str(self.last_published.num_devices_used)
        return detail | leadership_detail(self.leadership)

    async def _on_window(self, window: ModelLoadWindow, env: Envelope) -> None:
        self._windows.append(window)
        if self.core is not None and self.is_leader() and self.core.is_waking(window) and \
                (self._waking is None or self._waking.done()):
            self._waking = asyncio.create_task(self._wake_logged())

    async def _on_heartbeat(self, hb: WorkerHeartbeat, env: Envelope) -> None:
        self.workers.on_heartbeat(hb, now_ms())

    async def _on_steady_plan(self, plan: SteadyPlan, env: Envelope) -> None:
        if not plan.is_observe_only or self.policy.is_observe_only:
            self.steady_plan = plan

    async def _periodic(self) -> None:
        while True:
            started = time.monotonic()
            await self._tick_logged()
            await asyncio.sleep(max(0.0, self.policy.elastic.period_s - (time.monotonic() - started)))

    async def _tick_logged(self) -> None:
        try:
            await self.tick_once()
        except Exception:  # noqa: BLE001 - one bad tick must not stop scaling for good
            self.num_failures += 1
            log.exception("elastic scaler: tick failed")

    async def _wake_logged(self) -> None:
        try:
            await self.wake_once()
        except Exception:  # noqa: BLE001 - a failed wake leaves the model to the next tick
            self.num_failures += 1
            log.exception("elastic scaler: wake failed")

    async def wake_once(self) -> ElasticPlan | None:
        """A dispatcher's window shows requests waiting for a model the last plan gave no instance: the last plan
        with its first instance, published now rather than at the next tick (ElasticScaler.wake). No oracle call:
        nothing is sized, so it takes no worker thread."""
        async with self._ticking:
            if not self.is_leader() or self.steady_plan is None or self.core is None or self.bus is None:
                return None
            now = now_ms()
            budget = elastic_budget_devices(self.workers.alive(now), self.steady_plan,
                                            reported(self.workers.heartbeats(now)))
            windows, self._windows = self._windows, []
            for w in windows:
                self.core.observe(w)
            plan = self.core.wake(now, budget)
            if plan is None:
                return None
            plan = plan.model_copy(update={"epoch": self.leadership.epoch})
            await publish_event(self.bus, subjects.PLAN_ELASTIC, plan)
            self.last_published, self._last_published_ms = plan, now
            self.num_published += 1
            self.num_woken += 1
            log.info("elastic plan %s: %s", plan.plan_id, plan.reason)
            return plan

    async def tick_once(self) -> ElasticPlan | None:
        """One tick; returns the plan when it was published. A standby only feeds the load windows to its core (so
        that it knows the recent load when it takes over)."""
        async with self._ticking:
            if not self.is_leader():
                windows, self._windows = self._windows, []
                for w in windows:
                    self.core.observe(w)
                return None
            return await self._tick_once()

    async def _tick_once(self) -> ElasticPlan | None:
        assert self.core is not None and self.bus is not None
        if self.steady_plan is None:
            return None  # which models are elastic, and what the steady pool leaves, come with a steady plan
        now = now_ms()
        instances = reported(self.workers.heartbeats(now))
        budget = elastic_budget_devices(self.workers.alive(now), self.steady_plan, instances)
        in_flight = in_flight_by_model(instances)
        decode_kv = decode_kv_by_model(instances)
        elastic_models = elastic_models_of(self.steady_plan, [m.name for m in self.cluster.models])
        windows, self._windows = self._windows, []
        core = self.core

        def decide():
            for w in windows:
                core.observe(w)
            t0 = time.perf_counter()
            decision = core.tick(now, elastic_models, budget, in_flight=in_flight, decode_kv=decode_kv)
            return decision, (time.perf_counter() - t0) * 1e3

        try:
            decision, decision_ms = await asyncio.to_thread(decide)
        except (BusError, OracleAnswerError, TimeoutError) as exc:
            self.num_failures += 1
            log.warning("elastic scaler: no plan this tick: %s", exc)
            return None
        self.num_ticks += 1
        if not self.is_leader():  # deposed while deciding: the new leader publishes
            return None
        plan = decision.plan.model_copy(update={"decision_ms": decision_ms, "epoch": self.leadership.epoch})
        is_changed = self.last_published is None or plan_decision(plan) != plan_decision(self.last_published)
        if not is_changed and now - self._last_published_ms < self.policy.elastic_republish_s * 1000.0:
            return None
        await publish_event(self.bus, subjects.PLAN_ELASTIC, plan)
        self.last_published, self._last_published_ms = plan, now
        self.num_published += 1
        if is_changed:
            log.info("elastic plan %s: %s", plan.plan_id, plan.reason)
        return plan

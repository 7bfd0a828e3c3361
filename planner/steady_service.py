"""The steady planner service: a thin shell around planner.core.SteadyPlanner.

In: model load windows, worker heartbeats (which devices exist), the catalogue from the cluster config. Every
`planner.steady.period_s` (and once at start) it plans in a worker thread (the core asks the oracle over the bus)
and publishes the SteadyPlan into the JetStream stream PLANS on `janus.plan.steady`. A steady model whose requests
queue at the dispatchers gets an early plan (trigger "overflow", planner.core.overflow)."""
from __future__ import annotations

import asyncio
import logging
import time

from contracts import ModelLoadWindow, SteadyPlan, WorkerHeartbeat, subjects
from runtime.bus import Bus, BusError, Envelope
from runtime.service import Service, cancel_and_wait
from runtime.settings import ClusterConfig, JanusSettings

from .bus_oracle import BusOracle
from .core.oracle_port import OracleAnswerError
from .core.fleet_state import reported, steady_worker_order
from .core.overflow import OverflowWatch
from .core.policy import PlannerPolicy
from .core.steady import SteadyPlanner
from .leader import Elected, leadership_detail
from .shell import WorkerLiveness, ensure_plans_stream, last_plan, now_ms, plan_id_prefix, publish_event

log = logging.getLogger("janus.planner.steady")


class SteadyPlannerService(Elected, Service):
    name = "steady-planner"

    def __init__(self, settings: JanusSettings, cluster: ClusterConfig) -> None:
        super().__init__(settings, cluster)
        self.policy = PlannerPolicy(**cluster.planner)
        self.models = [m.name for m in cluster.models]
        self.core: SteadyPlanner | None = None
        self.workers = WorkerLiveness(self.policy.reconciler.heartbeat_timeout_ms)
        self._windows: list[ModelLoadWindow] = []
        self._task: asyncio.Task | None = None
        self._early: asyncio.Task | None = None
        self._planning = asyncio.Lock()  # one plan at a time: the core is not thread-safe
        self.overflow = OverflowWatch(self.policy.steady)
        self.last_plan: SteadyPlan | None = None
        self.num_plans = 0
        self.num_overflow_plans = 0
        self.num_failures = 0
        self._inherited: SteadyPlan | None = None  # the last plan in PLANS when this copy took over

    async def start(self, bus: Bus) -> None:
        await ensure_plans_stream(bus, self.policy.plans_max_age_s, self.cluster.jetstream_replicas)
        oracle = BusOracle(bus, asyncio.get_running_loop())
        self.core = SteadyPlanner(oracle, self.policy.steady, self.policy.pool,
                                  id_prefix=plan_id_prefix("steady", self.instance),
                                  is_observe_only=self.policy.is_observe_only)
        await bus.subscribe(subjects.MODEL_TELEMETRY_WILDCARD, ModelLoadWindow, self._on_window, traced=False)
        await bus.subscribe(subjects.WORKER_TELEMETRY_WILDCARD, WorkerHeartbeat, self._on_heartbeat, traced=False)
        await self.campaign()
        self._task = asyncio.create_task(self._periodic())

    async def stop(self) -> None:
        await cancel_and_wait(self._task, self._early, what="steady planner")
        await self.end_campaign()

    async def _on_leadership(self, is_leader: bool) -> None:
        """Taking over: carry on from the last plan in PLANS (its worker order keeps bins in place), and plan at once
        unless the service is still in its start-up delay (the periodic round comes then)."""
        if not is_leader or self.bus is None:
            return
        self._inherited = await last_plan(self.bus, subjects.PLAN_STEADY, SteadyPlan)  # type: ignore[assignment]
        if time.monotonic() - self.started_monotonic >= self.policy.startup_delay_s and (
                self._early is None or self._early.done()):
            self._early = asyncio.create_task(self.plan_once("startup"))

    def health_detail(self) -> dict[str, str]:
        detail = {"plans": str(self.num_plans), "overflow_plans": str(self.num_overflow_plans),
                  "failures": str(self.num_failures)}
        if self.last_plan is not None:
            detail["last_plan"] = self.last_plan.plan_id
            detail["steady_devices"] = str(len(self.last_plan.bins))
        return detail | leadership_detail(self.leadership)

    async def _on_window(self, window: ModelLoadWindow, env: Envelope) -> None:
        self._windows.append(window)  # handed to the core at the next plan, in the core's thread
        self.overflow.observe(window)
        if self.last_plan is None or (self._early is not None and not self._early.done()) or not self.is_leader():
            return
        overflowing = self.overflow.due(now_ms(), self.last_plan.steady_models)
        if overflowing:
            log.info("steady planner: %s queue(s) up: planning now", ", ".join(overflowing))
            self.num_overflow_plans += 1
            self._early = asyncio.create_task(self.plan_once("overflow"))

    async def _on_heartbeat(self, hb: WorkerHeartbeat, env: Envelope) -> None:
        self.workers.on_heartbeat(hb, now_ms())

    async def _periodic(self) -> None:
        await asyncio.sleep(self.policy.startup_delay_s)
        while True:
            started = time.monotonic()
            try:
                await self.plan_once("periodic" if self.num_plans else "startup")
            except Exception:  # noqa: BLE001 - one bad round must not stop planning for good
                self.num_failures += 1
                log.exception("steady planner: round failed")
            await asyncio.sleep(max(0.0, self.policy.steady.period_s - (time.monotonic() - started)))

    async def plan_once(self, trigger: str = "periodic") -> SteadyPlan | None:
        """Plan now and publish; None when there is nothing to plan on (no live worker), the oracle failed, or this
        copy does not lead."""
        async with self._planning:
            if not self.is_leader():
                return None
            return await self._plan_once(trigger)

    async def _plan_once(self, trigger: str) -> SteadyPlan | None:
        assert self.core is not None and self.bus is not None
        now = now_ms()
        workers = steady_worker_order(self.workers.alive(now), self.last_plan or self._inherited,
                                      reported(self.workers.heartbeats(now)))
        if not workers:
            log.info("steady planner: no live worker yet, no plan")
            return None
        windows, self._windows = self._windows, []
        core = self.core

        def decide():
            for w in windows:
                core.observe(w)
            t0 = time.perf_counter()
            decision = core.plan(now, self.models, workers, trigger=trigger)
            return decision, (time.perf_counter() - t0) * 1e3

        try:
            decision, decision_ms = await asyncio.to_thread(decide)
        except (BusError, OracleAnswerError, TimeoutError) as exc:
            self.num_failures += 1
            log.warning("steady planner: no plan this period: %s", exc)
            return None
        if not self.is_leader():  # deposed while deciding: the new leader plans
            return None
        plan = decision.plan.model_copy(update={"decision_ms": decision_ms, "epoch": self.leadership.epoch})
        await publish_event(self.bus, subjects.PLAN_STEADY, plan)
        self.last_plan = plan
        self.overflow.planned(plan)
        self.num_plans += 1
        log.info("steady plan %s: %s", plan.plan_id, plan.reason)
        return plan

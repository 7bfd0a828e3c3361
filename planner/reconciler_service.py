"""The reconciler service: a thin shell around planner.core.Reconciler.

In: steady and elastic plans (janus.plan.*; the latest of each recovered from PLANS at start), worker heartbeats,
the `instances` registry (KV watch), the workers' replies to commands. Out: lifecycle commands (request/reply on
janus.worker.<worker>.cmd), PlanAction events into PLANS, registry corrections. The core decides; every
`planner.reconcile_period_s` it also re-checks deadlines and retries."""
from __future__ import annotations

import asyncio
import contextlib
import logging

from contracts import (
    ElasticPlan,
    ErrorCode,
    ErrorInfo,
    InstanceRecord,
    LifecycleCommand,
    LifecycleReply,
    ModelState,
    SteadyPlan,
    WorkerHeartbeat,
    subjects,
)
from runtime.bus import Bus, BusError, Envelope
from runtime.jetstream import instances_bucket, watch_all
from runtime.service import Service, cancel_and_wait
from runtime.settings import ClusterConfig, JanusSettings

from .core.commands import ReconcileEffects
from .core.policy import PlannerPolicy
from .core.reconciler import Reconciler
from .leader import Elected, leadership_detail
from .shell import ensure_plans_stream, last_plan, now_ms, publish_event

log = logging.getLogger("janus.planner.reconciler")


class ReconcilerService(Elected, Service):
    name = "reconciler"

    def __init__(self, settings: JanusSettings, cluster: ClusterConfig) -> None:
        super().__init__(settings, cluster)
        self.policy = PlannerPolicy(**cluster.planner)
        self.core = Reconciler(self.policy.reconciler)
        self._kv = None
        self._watcher = None
        self._tasks: list[asyncio.Task] = []
        self._stopping = False
        self._lock = asyncio.Lock()  # effects are applied in the order the core produced them
        self.num_commands = 0
        self.num_failed_actions = 0
        self.num_unaudited = 0
        self.plan_statuses: list = []  # the latest few, for health and tests
        self.resumed_plan_ids: list[str] = []  # the plans found in PLANS when this copy took office
        self._watch_task: asyncio.Task | None = None

    async def start(self, bus: Bus) -> None:
        await ensure_plans_stream(bus, self.policy.plans_max_age_s, self.cluster.jetstream_replicas)
        self._kv = await instances_bucket(bus.js, self.cluster)  # with the cluster's replicas, should it be first
        await self._watch_from_snapshot()
        await bus.subscribe(subjects.WORKER_TELEMETRY_WILDCARD, WorkerHeartbeat, self._on_heartbeat, traced=False)
        await bus.subscribe(subjects.PLAN_STEADY, SteadyPlan, self._on_steady)
        await bus.subscribe(subjects.PLAN_ELASTIC, ElasticPlan, self._on_elastic)
        await self.campaign()  # only the leader acts; a standby's core observes heartbeats and the registry
        self._tasks.append(asyncio.create_task(self._periodic()))

    async def stop(self) -> None:
        self._stopping = True  # no new command goes out: a reply or a tick landing meanwhile must not start one
        while self._tasks:  # first: _periodic would start the watch again
            tasks, self._tasks = self._tasks, []
            await cancel_and_wait(*tasks, what="reconciler")
        await self._stop_watch()
        await self.end_campaign()

    async def _on_leadership(self, is_leader: bool) -> None:
        async with self._lock:
            if not is_leader:
                # what the old term's core waits for may never come: the next term starts from a fresh core, a
                # fresh registry snapshot and the plans in PLANS, as a restart does
                self.core = Reconciler(self.policy.reconciler)
                if not self._stopping:  # stop() ends the campaign after stopping the watch: none is started again
                    await self._watch_from_snapshot()
                return
        await self._resume_plans()

    async def _resume_plans(self) -> None:
        """Carry on the latest steady and elastic plans in PLANS (after a restart, or on taking over)."""
        assert self.bus is not None
        self.resumed_plan_ids = []
        for subject, tp, handler in ((subjects.PLAN_STEADY, SteadyPlan, self.core.on_steady_plan),
                                     (subjects.PLAN_ELASTIC, ElasticPlan, self.core.on_elastic_plan)):
            plan = await last_plan(self.bus, subject, tp)
            if plan is not None:
                self.resumed_plan_ids.append(plan.plan_id)
                await self._apply(handler(now_ms(), plan))

    async def _watch_from_snapshot(self) -> None:
        await self._stop_watch()
        self._watcher = await watch_all(self._kv)
        self._watch_task = asyncio.create_task(self._watch_registry(self._watcher))

    def _is_watching(self) -> bool:
        return self._watch_task is not None and not self._watch_task.done()

    async def _ensure_watching(self) -> None:
        """A new term whose watch could not be set up (JetStream electing for longer than `watch_all` waits) left
        no registry watch: every activation then looked 'not ready' and was taken down again. Start it over."""
        if self._is_watching():
            return
        async with self._lock:
            if self._is_watching():  # a new term's handler, holding the lock, was setting one up
                return
            log.warning("reconciler: no registry watch running: starting one from a fresh snapshot")
            self.core = Reconciler(self.policy.reconciler)
            await self._watch_from_snapshot()
        if self.is_leader():
            await self._resume_plans()

    async def _stop_watch(self) -> None:
        if self._watcher is not None:  # a KV watcher left running makes drain() hang for 30 s
            with contextlib.suppress(Exception):
                await self._watcher.stop()
        await cancel_and_wait(self._watch_task, what="registry watch")

    def health_detail(self) -> dict[str, str]:
        return {"commands": str(self.num_commands), "failed_actions": str(self.num_failed_actions),
                "in_flight": str(len(self.core.pending_ops())), "resumed": ",".join(self.resumed_plan_ids),
                "unaudited": str(self.num_unaudited)} | leadership_detail(self.leadership)

    # --- inputs ---
    async def _on_steady(self, plan: SteadyPlan, env: Envelope) -> None:
        if self.is_leader():  # a standby takes the latest plan from PLANS when it takes over
            await self._apply(self.core.on_steady_plan(now_ms(), plan))

    async def _on_elastic(self, plan: ElasticPlan, env: Envelope) -> None:
        if self.is_leader():
            await self._apply(self.core.on_elastic_plan(now_ms(), plan))

    async def _on_heartbeat(self, hb: WorkerHeartbeat, env: Envelope) -> None:
        self.core.observe_heartbeat(now_ms(), hb)  # reconciled on the next tick: heartbeats are many

    async def _watch_registry(self, watcher) -> None:
        async for entry in watcher:
            if entry is None:  # end of the initial snapshot
                continue
            if entry.operation in ("DEL", "PURGE") or not entry.value:
                self.core.view.on_record_deleted(subjects.untoken(entry.key.replace("=", "~")))
                continue
            try:
                self.core.observe_record(InstanceRecord.model_validate_json(entry.value))
            except ValueError:
                log.warning("reconciler: malformed registry record %s", entry.key)

    async def _periodic(self) -> None:
        while True:
            await asyncio.sleep(self.policy.reconcile_period_s)
            try:
                await self._ensure_watching()
            except Exception:  # noqa: BLE001 - tried again next period
                log.warning("reconciler: registry watch not started", exc_info=True)
                continue
            if not self.is_leader():
                continue
            try:
                # its own stalls and lost connection are not its workers' silence (ClusterView.on_tick)
                is_listening = self.bus is None or self.bus.nc.is_connected
                await self._apply(self.core.on_tick(now_ms(), expected_period_ms=self.policy.reconcile_period_s * 1e3,
                                                    is_listening=is_listening))
            except Exception:  # noqa: BLE001 - one bad tick must not stop reconciliation for good
                log.exception("reconciler tick failed")

    # --- outputs ---
    async def _apply(self, effects: ReconcileEffects) -> None:
        if effects.is_empty or not self.is_leader():  # deposed meanwhile: the next term starts afresh
            return
        assert self.bus is not None and self._kv is not None
        async with self._lock:
            for record in effects.registry_updates:
                await self._kv.put(subjects.instance_key(record.instance_id), record.model_dump_json().encode())
            for action in effects.actions:
                if action.status in ("failed", "timed_out"):
                    self.num_failed_actions += 1
                    log.warning("plan %s: %s %s on %s %s: %s", action.plan_id, action.action.value,
                                action.instance_id, action.worker_id, action.status, action.reason)
                await self._audit(subjects.PLAN_ACTION, action)
            for status in effects.plan_statuses:
                log.info("plan %s (%s): %s %s", status.plan_id, status.kind, status.status, status.detail)
                self.plan_statuses = (self.plan_statuses + [status])[-100:]
                await self._audit(subjects.PLAN_STATUS, status)
        for cmd in effects.commands:
            if self._stopping:  # what it would have sent, the next leader's core decides again from the registry
                break
            self.num_commands += 1
            self._tasks.append(asyncio.create_task(self._send(cmd)))
        self._tasks = [t for t in self._tasks if not t.done()]

    async def _audit(self, subject: str, event) -> None:
        """An audit event that cannot be stored is logged loudly, but the commands it describes still go out: the
        cluster converging matters more than its record."""
        try:
            await publish_event(self.bus, subject, event)
        except Exception as exc:  # noqa: BLE001
            self.num_unaudited += 1
            log.error("audit event on %s not stored (%s): %s", subject, exc, event.model_dump_json())

    async def _send(self, cmd: LifecycleCommand) -> None:
        assert self.bus is not None and self.leadership is not None
        # fencing: workers refuse a command of an older term than one they have seen (worker/core/fencing.py)
        cmd = cmd.model_copy(update={"epoch": self.leadership.epoch, "issued_by": self.instance})
        try:
            reply = await self.bus.request(subjects.worker_cmd(cmd.worker_id), cmd, LifecycleReply,
                                           timeout_s=cmd.deadline_ms / 1000.0)
        except BusError as exc:  # no worker answered, or too late: the core decides whether to retry
            reply = LifecycleReply(command_id=cmd.command_id, instance_id=cmd.instance_id, ok=False,
                                   state=ModelState.FAILED, detail=exc.error.message, error=exc.error)
        except Exception as exc:  # noqa: BLE001 - never lose a command's outcome
            reply = LifecycleReply(command_id=cmd.command_id, instance_id=cmd.instance_id, ok=False,
                                   state=ModelState.FAILED, detail=str(exc),
                                   error=ErrorInfo(code=ErrorCode.INTERNAL, message=str(exc)))
        await self._apply(self.core.on_reply(now_ms(), reply))

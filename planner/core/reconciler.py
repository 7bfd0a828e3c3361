"""The reconciler core: compares desired state (the latest steady and elastic plans) with the registry and the
workers' heartbeats, and emits lifecycle commands; tracks every command to completion (an activation is done only
when the registry says the instance is ready), retries failures and timeouts within a budget, and reports every
outcome as a `contracts.PlanAction` (never dropped in silence).

Level-triggered: every input (plan, heartbeat, record, reply, tick) re-runs the same comparison, so a lost message
only delays convergence. Order on a device: removals first, and a device takes a new instance only once its
removal is over (drained and released: the new model needs the room), except that the last ready replicas of a
model that is only moving stay up until the model can serve without them (make before break: a ready colocated
replica, or a ready prefill and a ready decode instance), as long as a replacement may still come: when a newcomer
waits for the device, the placer finds no device for the model's missing instances, none of its wanted instances is
coming up and no removal is freeing a device the placer could give it, for `ReconcilerPolicy.no_room_wait_ms`, the
two would wait for each other forever: the old instance goes and the plan wins (a steady
plan that claimed the device of an elastic instance with no room elsewhere once waited forever: docs/sim.md, "The
five-app ablation"). A model with no ready replica is loaded once (from disk or
a peer's warm copy); its other replicas fork from that one when it is ready
(`ReconcilerPolicy.is_one_load_per_model`). An elastic instance that is draining and wanted again is resumed in
place (`ReconcilerPolicy.resumes_draining`). A tensor-parallel instance is one command to its lead worker, naming
the group's other devices.

The simulator drives this same core through its fleet port (sim/systems/fleet.py): every placement, retry and
drain of a simulated Janus is decided here (docs/sim.md, "One control plane")."""
from __future__ import annotations

from contracts import (
    ElasticPlan,
    ErrorCode,
    ErrorInfo,
    InstanceRecord,
    InstanceRole,
    LifecycleAction,
    LifecycleCommand,
    LifecycleReply,
    ModelState,
    Pool,
    SteadyPlan,
    WorkerHeartbeat,
)

from .cluster_view import ClusterView, SeenInstance
from .commands import EffectsBuilder, Op, PlanStatus, ReconcileEffects, command_id_for
from .desired import ElasticPlacer, Slot, steady_slots
from .policy import ReconcilerPolicy

_RELEASED = frozenset({ModelState.WARM, ModelState.COLD, ModelState.FAILED})


class Reconciler:
    def __init__(self, policy: ReconcilerPolicy | None = None) -> None:
        self.policy = policy or ReconcilerPolicy()
        self.view = ClusterView(self.policy.heartbeat_timeout_ms)
        self._placer = ElasticPlacer(resumes_draining=self.policy.resumes_draining,
                                     pairs_roles=self.policy.pairs_disaggregated_roles)
        self._plans: dict[str, SteadyPlan | ElasticPlan] = {}  # kind -> latest plan acted on
        # kind -> the newest planner epoch seen (planner/leader.py): a plan of an older term is ignored, as workers
        # refuse an older reconciler's commands (worker/core/fencing.py)
        self._newest_epoch: dict[str, int] = {}
        self._done: set[str] = set()
        self._blocked_reported: set[tuple[str, str]] = set()
        self._ops: dict[str, Op] = {}  # instance id -> op
        self._cooldown_until_ms: dict[tuple[str, str], float] = {}  # (model, worker) -> until
        # A removal the worker confirmed: until a newer heartbeat arrives, the old one still lists the instance.
        self._released_ms: dict[str, float] = {}
        self._stuck_since_ms: dict[str, float] = {}  # instance id -> since when its make before break has no way out
        self._observed = EffectsBuilder()  # what observe_reply learnt, reported with the next reconciliation
        self._last_desired: tuple | None = None  # (inputs, (desired, blocked, no_room)) of the last placement

    # -- inputs: each returns what to do now ------------------------------------------------------------------

    def on_steady_plan(self, now_ms: float, plan: SteadyPlan) -> ReconcileEffects:
        return self._on_plan(now_ms, "steady", plan)

    def on_elastic_plan(self, now_ms: float, plan: ElasticPlan) -> ReconcileEffects:
        return self._on_plan(now_ms, "elastic", plan)

    def on_heartbeat(self, now_ms: float, hb: WorkerHeartbeat) -> ReconcileEffects:
        self.view.on_heartbeat(now_ms, hb)
        return self._reconcile(now_ms, EffectsBuilder())

    def observe_heartbeat(self, now_ms: float, hb: WorkerHeartbeat) -> None:
        """Record a heartbeat without reconciling: for large fleets the shell batches and calls `on_tick`."""
        self.view.on_heartbeat(now_ms, hb)

    def observe_alive(self, now_ms: float, worker_ids) -> None:
        """Workers heard from again whose heartbeats say nothing new (their last one stands)."""
        self.view.on_alive(now_ms, worker_ids)

    def observe_record(self, record: InstanceRecord) -> None:
        self.view.on_record(record)

    def on_record(self, now_ms: float, record: InstanceRecord) -> ReconcileEffects:
        self.view.on_record(record)
        return self._reconcile(now_ms, EffectsBuilder())

    def observe_record_deleted(self, instance_id: str) -> None:
        self.view.on_record_deleted(instance_id)

    def on_record_deleted(self, now_ms: float, instance_id: str) -> ReconcileEffects:
        self.view.on_record_deleted(instance_id)
        return self._reconcile(now_ms, EffectsBuilder())

    def on_reply(self, now_ms: float, reply: LifecycleReply) -> ReconcileEffects:
        out = EffectsBuilder()
        self._take_reply(now_ms, reply, out)
        return self._reconcile(now_ms, out)

    def observe_reply(self, now_ms: float, reply: LifecycleReply) -> None:
        """Record a reply without reconciling (its outcome is reported with the next `on_tick`): for a fleet
        whose replies come by the thousand, as the simulator's does."""
        self._take_reply(now_ms, reply, self._observed)

    def _take_reply(self, now_ms: float, reply: LifecycleReply, out: EffectsBuilder) -> None:
        op = next((o for o in self._ops.values() if o.command_id == reply.command_id), None)
        if op is None or op.phase == "backoff":
            return  # an answer to a command since replaced (a resumed drain, a cancelled retry)
        if self._is_drain_going_on(now_ms, op, reply):
            return  # still draining: done when its heartbeat no longer lists it (`_complete`)
        if not reply.ok:
            why = reply.detail or (reply.error.message if reply.error else "the worker refused")
            self._fail(now_ms, op, "failed", why, reply.error, out)
        elif op.is_up:
            op.phase, op.acked_ms = "acked", now_ms  # done only when the registry says ready
        else:
            out.actions.append(op.action_event("succeeded", now_ms, f"now {reply.state.value}"))
            self._released_ms[op.instance_id] = now_ms
            del self._ops[op.instance_id]

    def _is_drain_going_on(self, now_ms: float, op: Op, reply: LifecycleReply) -> bool:
        """A removal not finished within the command deadline because the instance still drains: the worker's
        answer says DRAINING, or (when the bus's own deadline answered first) its heartbeats do. A drain may rightly
        outlast the deadline: a streaming request runs until its client would stop waiting (docs/lifecycle.md,
        "Leaving Active: drain first"). Sending the removal again would only queue behind the drain, and three such
        tries used to end in a reported failure and a cooldown on a removal that was going well."""
        if op.is_up or reply.ok or reply.error is None or reply.error.code != ErrorCode.TIMEOUT:
            return False
        return (reply.state == ModelState.DRAINING
                or op.instance_id in self.view.draining(self.view.alive_workers(now_ms)))

    def on_tick(self, now_ms: float, *, expected_period_ms: float | None = None,
                is_listening: bool = True) -> ReconcileEffects:
        """The periodic re-check. A live shell passes its period and whether it has a bus connection, so that its
        own stalls and disconnections are not taken for its workers' deaths (ClusterView.on_tick)."""
        self.view.on_tick(now_ms, expected_period_ms=expected_period_ms, is_listening=is_listening)
        return self._reconcile(now_ms, EffectsBuilder())

    def pending_ops(self) -> dict[str, Op]:
        return dict(self._ops)

    def is_done(self, plan_id: str) -> bool:
        return plan_id in self._done

    # -- the comparison ----------------------------------------------------------------------------------------

    def _on_plan(self, now_ms: float, kind: str, plan: SteadyPlan | ElasticPlan) -> ReconcileEffects:
        out = EffectsBuilder()
        if plan.is_observe_only:
            out.plan_statuses.append(PlanStatus(plan_id=plan.plan_id, kind=kind, status="ignored", unix_ms=now_ms,
                                                detail="observe-only plan"))
            return out.build()
        newest = self._newest_epoch.get(kind, 0)
        if plan.epoch < newest:  # from a planner that lost its lease (paused past it): a newer term has planned
            out.plan_statuses.append(PlanStatus(
                plan_id=plan.plan_id, kind=kind, status="ignored", unix_ms=now_ms,
                detail=f"stale epoch {plan.epoch}: a {kind} planner of epoch {newest} leads now"))
            return out.build()
        self._newest_epoch[kind] = plan.epoch
        prev = self._plans.get(kind)
        if prev is not None and prev.plan_id not in self._done:
            out.plan_statuses.append(PlanStatus(plan_id=prev.plan_id, kind=kind, status="superseded", unix_ms=now_ms,
                                                detail=f"by {plan.plan_id}"))
        self._plans[kind] = plan
        return self._reconcile(now_ms, out)

    def _reconcile(self, now_ms: float, out: EffectsBuilder) -> ReconcileEffects:
        if self._observed.actions:
            out.actions[:0], self._observed = self._observed.actions, EffectsBuilder()
        alive = self.view.alive_workers(now_ms)
        self._fix_registry(now_ms, alive, out)
        resident = self.view.resident(alive)
        self._complete(now_ms, alive, resident, out)  # first: a command that is done has not timed out
        self._expire(now_ms, alive, out)
        desired, blocked, no_room = self._desired(now_ms, alive)
        self._cancel_unwanted_retries(now_ms, desired, out)
        rooms = self._issue_removals(now_ms, alive, desired, resident, no_room, out)
        self._issue_ups(now_ms, alive, desired, resident, rooms, blocked, out)
        self._track_plans(now_ms, alive, desired, resident, blocked, out)
        return out.build()

    def _desired(self, now_ms: float, alive: set[str]) -> tuple[dict[str, Slot], dict[str, list[str]], frozenset[str]]:
        """The instances the plans want, each on its devices, what cannot be placed (reported), and the models with
        an elastic instance the placer found no device for. The same inputs give the
        same answer, so it is kept until a plan, an instance's state, a record, a cooldown or liveness changes (a
        tick of a large, busy fleet otherwise places every instance again every 0.2 s)."""
        avoid = frozenset(key for key, until in self._cooldown_until_ms.items() if now_ms < until)
        steady_plan, elastic_plan = self._plans.get("steady"), self._plans.get("elastic")
        # Records are not part of the key: readiness only orders which replicas a shrinking count keeps, and a
        # count changes with a new plan; an instance that appears, leaves or changes state changes the structure.
        key = (self.view.structure_version, steady_plan.plan_id if steady_plan else None,
               elastic_plan.plan_id if elastic_plan else None, avoid, self.view.alive_key(alive))
        if self._last_desired is not None and self._last_desired[0] == key:
            desired, blocked, no_room = self._last_desired[1]
            return desired, {kind: list(details) for kind, details in blocked.items()}, no_room
        blocked: dict[str, list[str]] = {"steady": [], "elastic": []}
        steady = self._adopt(steady_slots(steady_plan), alive)  # type: ignore[arg-type]
        steady_workers = {b.worker_id for b in steady_plan.bins} if steady_plan else set()
        free = [w for w in self.view.ordered_workers(alive) if w not in steady_workers]
        elastic, unplaced = self._placer.place(elastic_plan, free,  # type: ignore[arg-type]
                                               self.view.elastic_instances(alive), self.view.ready_ids(alive),
                                               self.view.occupied_workers(alive), self.view.warm_index(), set(avoid))
        for model, n in sorted(unplaced.items()):
            blocked["elastic"].append(f"{n} instance(s) of {model}: no free device")
        desired = {**elastic, **steady}
        no_room = frozenset(unplaced)
        self._last_desired = (key, (desired, blocked, no_room))
        return desired, {kind: list(details) for kind, details in blocked.items()}, no_room

    def _adopt(self, slots: dict[str, Slot], alive: set[str]) -> dict[str, Slot]:
        """A slot is filled by whatever instance of its model, role and pool already sits on its device, under the
        id the worker gave it (e.g. one it started at bootstrap): no second copy, no needless restart."""
        out = {}
        for iid, slot in slots.items():
            found = self.view.instance_on(slot.worker_id, slot.model, slot.role, slot.pool, alive)
            if found is not None and found != iid:
                slot = Slot(found, slot.model, slot.worker_id, slot.role, slot.pool, slot.plan_id)
            out[slot.instance_id] = slot
        return out

    def _fix_registry(self, now_ms: float, alive: set[str], out: EffectsBuilder) -> None:
        for rec, state, why in self.view.stale_records(now_ms, alive):
            fixed = rec.model_copy(update={"is_ready": False, "state": state, "updated_unix_ms": now_ms})
            self.view.on_record(fixed)
            out.registry_updates.append(fixed)

    def _expire(self, now_ms: float, alive: set[str], out: EffectsBuilder) -> None:
        p = self.policy
        draining = self.view.draining(alive)
        for op in list(self._ops.values()):
            if not op.is_up and op.instance_id in draining:
                continue  # a removal under way: the worker's drain deadline bounds it (docs/lifecycle.md)
            if op.phase == "sent" and now_ms - op.issued_ms > p.command_deadline_ms:
                self._fail(now_ms, op, "timed_out", f"no reply within {p.command_deadline_ms:.0f} ms", None, out)
            elif op.phase == "acked" and now_ms - (op.acked_ms or now_ms) > p.ready_grace_ms:
                why = f"ok reply but not ready within {p.ready_grace_ms:.0f} ms"
                self._fail(now_ms, op, "timed_out", why, None, out)
            elif op.phase != "backoff" and op.worker_id not in alive:
                self._fail(now_ms, op, "failed", f"worker {op.worker_id} is not alive", None, out)

    def _fail(self, now_ms: float, op: Op, status: str, why: str, error: ErrorInfo | None, out: EffectsBuilder) -> None:
        if error is None:
            code = ErrorCode.TIMEOUT if status == "timed_out" else ErrorCode.INSTANCE_FAILED
            error = ErrorInfo(code=code, message=why, retryable=op.attempt < self.policy.max_num_attempts)
        if op.attempt < self.policy.max_num_attempts:
            out.actions.append(op.action_event("timed_out" if status == "timed_out" else "retrying", now_ms,
                                               f"{why}; retry {op.attempt + 1} of {self.policy.max_num_attempts}",
                                               error))
            op.phase, op.retry_at_ms = "backoff", now_ms + self.policy.retry_backoff_ms
            op.is_fork_failed = op.is_fork_failed or op.action == LifecycleAction.FORK_FROM
            return
        if status == "timed_out":
            out.actions.append(op.action_event("timed_out", now_ms, why, error))
        out.actions.append(op.action_event("failed", now_ms, f"{why}; gave up after {op.attempt} attempt(s)", error))
        self._cooldown_until_ms[(op.model, op.worker_id)] = now_ms + self.policy.failure_cooldown_ms
        del self._ops[op.instance_id]

    def _complete(self, now_ms: float, alive: set[str], resident: dict[str, SeenInstance], out: EffectsBuilder) -> None:
        for op in list(self._ops.values()):
            if op.is_up and self.view.is_ready(op.instance_id, alive):
                out.actions.append(op.action_event("succeeded", now_ms, "ready in the registry"))
                del self._ops[op.instance_id]
            elif not op.is_up and op.worker_id in alive:
                seen = self.view.seen(alive).get(op.instance_id)
                if seen is None or seen.status.state in _RELEASED:
                    state = seen.status.state.value if seen else "gone"
                    out.actions.append(op.action_event("succeeded", now_ms, f"the worker reports it {state}"))
                    del self._ops[op.instance_id]

    def _cancel_unwanted_retries(self, now_ms: float, desired: dict[str, Slot], out: EffectsBuilder) -> None:
        """A retry waiting for its backoff whose purpose a newer plan dropped is not sent; reported, not dropped."""
        for op in list(self._ops.values()):
            if op.phase == "backoff" and op.is_up != (op.instance_id in desired):
                error = ErrorInfo(code=ErrorCode.CANCELLED, message="no longer in the plan")
                out.actions.append(op.action_event("cancelled", now_ms, "cancelled before retry: superseded", error))
                del self._ops[op.instance_id]

    def _issue_removals(self, now_ms, alive, desired, resident, no_room, out) -> set[str]:
        """Removals of resident instances nobody wants; returns the devices that are not ready for a newcomer: a
        removal pending, under way (a drain) or deferred (make before break). `no_room`: models with elastic
        instances the placer found no device for."""
        ready = self.view.ready_ids(alive)
        waiting_workers = {w for iid in desired.keys() - ready for w in desired[iid].worker_ids}
        steady_plan = self._plans.get("steady")
        steady_workers = {b.worker_id for b in steady_plan.bins} if steady_plan else set()
        pending: set[str] = set()
        for op in self._ops.values():
            if not op.is_up:
                pending.update(op.worker_ids)
        for iid, s in self.view.draining(alive).items():
            if iid not in desired:
                pending.update(s.worker_ids)
        unwanted = sorted(resident.keys() - desired.keys())
        stuck: list[tuple[str, SeenInstance, Op | None]] = []
        by_model: dict[str, list[Slot]] = {}
        handed_over: set[str] = set()
        if unwanted:
            for d in desired.values():
                by_model.setdefault(d.model, []).append(d)
            handed_over = self._handed_to_elastic()
        for iid in unwanted:
            s = resident[iid]
            pool = s.status.pool
            # Only a plan for its pool may remove an instance (a restarted reconciler that has seen no elastic plan
            # yet must not tear the elastic pool down), except that the steady plan claims its devices.
            is_claimed = pool == Pool.ELASTIC and s.worker_id in steady_workers
            if pool.value not in self._plans and not is_claimed:
                continue
            if self._released_ms.get(iid, float("-inf")) >= self.view.last_seen_ms(s.worker_id):
                continue  # released; this heartbeat predates it
            pending.update(s.worker_ids)
            op = self._ops.get(iid)
            if op is not None and (op.phase != "backoff" or now_ms < op.retry_at_ms):
                continue
            if self._cooling(now_ms, s.status.model, s.worker_id):
                continue
            model = s.status.model
            wanted = by_model.get(model, [])
            # A device a newcomer waits for is given up first only when this model moves inside the steady pool:
            # two steady models swapping devices would otherwise each wait for the other. A model going to the
            # elastic pool is replaced on other devices, so it keeps serving here until then.
            yields = any(d.pool == Pool.STEADY for d in wanted) and any(w in waiting_workers for w in s.worker_ids)
            if ((wanted or model in handed_over) and self.view.is_ready(iid, alive)
                    and not self._can_serve(wanted, alive) and not yields):
                # make before break: the model cannot serve without it yet. A replacement may be coming up; with
                # none coming, no device for the missing ones and a newcomer waiting for this device, the two
                # may wait for each other forever (below). With no newcomer waiting here, it keeps serving.
                if (model in no_room and all(d.instance_id in ready for d in wanted)
                        and any(w in waiting_workers for w in s.worker_ids)):
                    stuck.append((iid, s, op))
                continue
            self._remove(now_ms, iid, s, op, out)
        # No replacement is coming and the placer has no device for one: while a removal frees a device it could
        # use, wait for it; once nothing has moved for no_room_wait_ms (a plan that frees one may be a tick away),
        # the device this instance holds may be the very one a replacement (or the instance whose leaving frees
        # one) waits for, so it goes.
        if stuck and self._is_freeing_elastic_room(alive, desired, steady_workers):
            stuck = []
        since = {iid: self._stuck_since_ms.get(iid, now_ms) for iid, _, _ in stuck}
        self._stuck_since_ms = since
        for iid, s, op in stuck:
            if now_ms - since[iid] >= self.policy.no_room_wait_ms:
                self._remove(now_ms, iid, s, op, out)
        return pending

    def _is_freeing_elastic_room(self, alive: set[str], desired: dict[str, Slot], steady_workers: set[str]) -> bool:
        """Whether a removal in flight (or a drain of an instance nobody wants) will free a device the elastic
        placer may use (one outside the steady plan)."""
        for op in self._ops.values():
            if not op.is_up and any(w not in steady_workers for w in op.worker_ids):
                return True
        return any(iid not in desired and any(w not in steady_workers for w in s.worker_ids)
                   for iid, s in self.view.draining(alive).items())

    def _remove(self, now_ms: float, iid: str, s: SeenInstance, op: Op | None, out: EffectsBuilder) -> None:
        pool = s.status.pool
        action = LifecycleAction(
            self.policy.steady_removal_action if pool == Pool.STEADY else self.policy.elastic_removal_action
        )
        plan = self._plans.get(pool.value) or self._plans.get("steady")
        self._send(now_ms, Slot(iid, s.status.model, s.worker_id, s.status.role, pool, plan.plan_id if plan else "",
                                s.status.peer_worker_ids), action, None, op, out)
        rec = self.view.record(iid)
        if rec is not None and rec.is_ready:  # stop routing to it now, not when the drain ends
            fixed = rec.model_copy(update={"is_ready": False, "state": ModelState.DRAINING,
                                           "updated_unix_ms": now_ms})
            self.view.on_record(fixed)
            out.registry_updates.append(fixed)

    def _handed_to_elastic(self) -> set[str]:
        """Models the steady plan hands to the elastic pool that the elastic plan has not placed yet: it predates
        the hand-over, or its debounce still holds the model's old count of 0. Still wanted (make before break),
        unless the elastic plan found the model has no traffic at all."""
        steady_plan = self._plans.get("steady")
        if steady_plan is None:
            return set()
        elastic_plan = self._plans.get("elastic")
        targets = {t.model: t for t in elastic_plan.targets} if elastic_plan else {}
        handed = set(steady_plan.elastic_models) | set(steady_plan.unplaced_models)
        return {m for m in handed if m not in targets or targets[m].desired_replicas > 0}

    def _can_serve(self, slots: list[Slot], alive: set[str]) -> bool:
        """Whether a model's desired instances can serve it now: a ready colocated one, or a ready prefill and a
        ready decode instance (a prefill instance alone hands its requests to nobody)."""
        ready_ids = self.view.ready_ids(alive)
        ready = {s.role for s in slots if s.instance_id in ready_ids}
        return InstanceRole.COLOCATED in ready or {InstanceRole.PREFILL, InstanceRole.DECODE} <= ready

    def _issue_ups(self, now_ms, alive, desired, resident, rooms, blocked, out) -> None:
        removing = {iid for iid, op in self._ops.items() if not op.is_up}
        # models being brought up (an up in flight): without a ready replica, their other replicas wait for it
        loading = {op.model for op in self._ops.values() if op.is_up and op.phase != "backoff"}
        seen = self.view.seen(alive)
        for iid in sorted(desired.keys() - self.view.ready_ids(alive)):
            slot = desired[iid]
            op = self._ops.get(iid)
            here = seen.get(iid)
            is_resume = (self.policy.resumes_draining and here is not None and here.worker_id == slot.worker_id
                         and here.status.state == ModelState.DRAINING)
            if is_resume and op is not None and not op.is_up:
                # wanted again while it drains: admit again in place, before anything new is loaded
                out.actions.append(op.action_event("cancelled", now_ms, "wanted again: resumed instead",
                                                   ErrorInfo(code=ErrorCode.CANCELLED, message="resumed")))
                del self._ops[iid]
                op = None
            if op is not None and (not op.is_up or op.phase != "backoff" or now_ms < op.retry_at_ms):
                continue
            dead = [w for w in slot.worker_ids if w not in alive]
            if dead:
                blocked[slot.pool.value].append(f"{iid}: worker {dead[0]} is not alive")
                continue
            if self._cooling(now_ms, slot.model, slot.worker_id):
                blocked[slot.pool.value].append(f"{iid}: failed recently on {slot.worker_id}, cooling down")
                continue
            if is_resume:
                self._send(now_ms, slot, LifecycleAction.ACTIVATE, None, op, out, "resume the drain")
                continue
            if any(w in rooms for w in slot.worker_ids):
                continue  # a removal on this device goes first
            source = None
            if op is None or not op.is_fork_failed:
                source = self.view.fork_source(slot.model, alive, exclude_ids=removing | {iid},
                                               target_worker=slot.worker_id)
            has_replica = source is not None and source.kind == "replica"
            is_warm_here = here is not None and here.status.state == ModelState.WARM
            if not has_replica and not is_warm_here:
                if self.policy.is_one_load_per_model and slot.model in loading:
                    continue  # one load per model: this replica forks from the first once that one is ready
                loading.add(slot.model)
            action = LifecycleAction.FORK_FROM if source else LifecycleAction.ACTIVATE
            self._send(now_ms, slot, action, source, op, out)

    def _send(self, now_ms, slot: Slot, action, source, prev: Op | None, out: EffectsBuilder, why: str = "") -> None:
        if prev is not None and prev.is_up != (action in (LifecycleAction.ACTIVATE, LifecycleAction.FORK_FROM)):
            prev = None  # a different purpose starts its own attempt count
        attempt = prev.attempt + 1 if prev is not None else 1
        plan_id = slot.plan_id
        cmd = LifecycleCommand(
            command_id=command_id_for(plan_id, slot.instance_id, action, attempt),
            worker_id=slot.worker_id,
            model=slot.model,
            instance_id=slot.instance_id,
            action=action,
            role=slot.role,
            pool=slot.pool,
            fork_source=source,
            peer_worker_ids=slot.peer_worker_ids,
            plan_id=plan_id,
            issued_unix_ms=now_ms,
            deadline_ms=self.policy.command_deadline_ms,
        )
        op = Op(slot.instance_id, slot.model, slot.worker_id, slot.role, slot.pool, action, plan_id, attempt,
                cmd.command_id, now_ms, is_fork_failed=prev.is_fork_failed if prev else False,
                peer_worker_ids=slot.peer_worker_ids)
        self._ops[slot.instance_id] = op
        out.commands.append(cmd)
        why = why or (f"fork from {source.instance_id} on {source.worker_id}" if source else action.value)
        out.actions.append(op.action_event("issued", now_ms, why))

    def _cooling(self, now_ms: float, model: str, worker_id: str) -> bool:
        return now_ms < self._cooldown_until_ms.get((model, worker_id), float("-inf"))

    def _track_plans(self, now_ms, alive, desired, resident, blocked, out) -> None:
        for kind, plan in self._plans.items():
            if plan.plan_id in self._done:
                continue
            for detail in blocked.get(kind, []):
                if (plan.plan_id, detail) not in self._blocked_reported:
                    self._blocked_reported.add((plan.plan_id, detail))
                    out.plan_statuses.append(PlanStatus(plan_id=plan.plan_id, kind=kind, status="blocked",
                                                            unix_ms=now_ms, detail=detail))
            pool = Pool(kind)
            wanted = {iid for iid, s in desired.items() if s.pool == pool}
            is_up = wanted <= self.view.ready_ids(alive)
            is_clean = not any(resident[iid].status.pool == pool for iid in resident.keys() - desired.keys())
            is_idle = not any(op.pool == pool for op in self._ops.values())
            if is_up and is_clean and is_idle and not blocked.get(kind):
                self._done.add(plan.plan_id)
                n = sum(1 for s in desired.values() if s.pool == pool)
                out.plan_statuses.append(PlanStatus(plan_id=plan.plan_id, kind=kind, status="done", unix_ms=now_ms,
                                                    detail=f"{n} instance(s) ready"))

"""The simulated fleet behind the reconciler's ports: one worker per device (`d<n>`), carrying out the lifecycle
commands of `planner.core.Reconciler` on the simulated devices and reporting back what a worker reports: the reply
(once the instance is ready, or once a removal's drain is over), the registry record, and a heartbeat every 0.5 s.

This is the worker side only: where an instance goes, when it is removed, resumed, retried or forked from whom is
the reconciler's decision, the same code the live reconciler service runs. What is modelled here is the device and
the worker's mechanics: how long a load takes by the path the command names (a fork from a live replica over the
device link, a pull of a peer's host copy over the network, a warm copy from this host's memory, else the disk),
that a drain finishes what runs before the devices free, and that a device has room for an instance or not.

Cadence, as the live reconciler service runs: heartbeats are observed and the core reconciles every
`reconcile_period_s`; plans are handed over when they come. Replies and records are observed as they happen and
acted on at the next reconciliation (a fleet's replies come by the thousand: one full comparison per reply would
cost the simulator a minute of a half-hour run)."""
from __future__ import annotations

import copy

from contracts import (
    DeviceInfo,
    ErrorCode,
    ErrorInfo,
    HostCopy,
    InstanceRecord,
    InstanceRole,
    InstanceStatus,
    LifecycleAction,
    LifecycleCommand,
    LifecycleReply,
    ModelState,
    PageCounters,
    Pool,
    WeightSegment,
    WorkerHeartbeat,
)
from planner.core import ReconcileEffects, Reconciler
from planner.core.commands import UP_ACTIONS
from planner.core.desired import instance_id_for

from ..executor import SimInstance
from .base import VERIFY_S, SystemRun, mark_fork_source

_ROLE = {"colocated": InstanceRole.COLOCATED, "prefill": InstanceRole.PREFILL, "decode": InstanceRole.DECODE}
_POOL = {"steady": Pool.STEADY, "elastic": Pool.ELASTIC}
_SEGMENTS = (WeightSegment.model_construct(global_offset_bytes=0, num_bytes=1, checksum=""),)
_HOST_COPY = HostCopy.model_construct(base_offset_bytes=0, segments=_SEGMENTS)
# The simulated engine's KV block, in tokens (the engine's paged KV cache allocates in blocks of this many tokens).
KV_BLOCK_TOKENS = 16


def kv_blocks(inst: SimInstance) -> tuple[int, int]:
    """The KV blocks an instance reports in its heartbeat: those its requests hold (the simulated engine reserves
    a request's prompt and answer when it admits it, so these are its reservations) and those free on its
    executor."""
    block_bytes = inst.cost.kv_bytes_per_token * KV_BLOCK_TOKENS
    free = inst.executor.free_hbm_bytes if inst.executor is not None else 0.0
    return round(inst.kv_bytes_used / block_bytes), max(0, int(free // block_bytes))


def worker_id_of(device: int) -> str:
    return f"d{device}"


def device_of(worker_id: str) -> int:
    return int(worker_id[1:])


class SimFleet:
    def __init__(self, run: SystemRun, reconciler: Reconciler, heartbeat_period_s: float = 0.5,
                 reconcile_period_s: float = 0.2):
        self.run = run
        self.rec = reconciler
        self.names = run.scenario.trace.app_names
        self.index = {n: a for a, n in enumerate(self.names)}
        self.by_iid: dict[str, SimInstance] = {}  # the instances this fleet runs, by the reconciler's ids
        self._coming_up: dict[str, LifecycleCommand] = {}  # answered when the instance is ready
        self._removing: dict[str, LifecycleCommand] = {}  # answered when the drain is over
        self._devices: dict[str, tuple[int, ...]] = {}  # instance id -> its devices, lead first
        self._warm_role: dict[int, dict[int, str]] = {}  # device -> app kept warm there -> the role it had
        self._warm_lines: dict[int, tuple[tuple, tuple[InstanceStatus, ...]]] = {}  # device -> (key, WARM lines)
        self._statuses: dict[str, InstanceStatus] = {}  # instance id -> its line in the last heartbeat
        self._heartbeats: dict[str, WorkerHeartbeat] = {}
        self._dirty: set[int] = set(range(run.scenario.num_devices))  # devices whose heartbeat must be rebuilt
        self._seq = 0
        self.preloading = False  # install(): what is placed is there already, ready at once
        self.num_failed_actions = 0
        # (time s, detail) of each wanted instance the reconciler reported it could not bring up, once per plan and
        # detail ("1 instance(s) of m: no free device", "...: cooling down"): what `--watch` shows of a wait for a
        # device (sim/watch.py)
        self.blocked_log: list[tuple[float, str]] = []
        dev = run.scenario.device
        self._device_info = DeviceInfo.model_construct(kind="npu", name=dev.name, hbm_bytes=int(dev.hbm_bytes))
        self._pages = PageCounters.model_construct(page_size_bytes=2 << 20, num_pages_total=0, num_pages_free=0,
                                                   fragmentation=0.0, pages_by_model={})
        if run.scenario.is_warm_at_start:
            # A fleet that had been running holds every model in some host's memory: one host copy per model, on
            # the host of device (model index mod fleet size), offered to peers as its heartbeat's WARM line.
            for app in range(len(self.names)):
                device = app % run.scenario.num_devices
                run.warm.add((device, app))
                self._warm_role.setdefault(device, {})[app] = "colocated"
        run.sim.on_ready.append(self._on_ready)
        run.sim.on_removed.append(self._on_removed)
        run.sim.every(heartbeat_period_s, self._beat, start_s=heartbeat_period_s)
        run.sim.every(reconcile_period_s, self.tick, start_s=reconcile_period_s)

    # ------------------------------------------------------------------------------------------ inputs of the core
    def tick(self, now_s: float) -> None:
        self._report(now_s)
        self.apply(self.rec.on_tick(now_s * 1e3), now_s)

    def apply(self, effects: ReconcileEffects, now_s: float) -> None:
        """Carry out what the core decided: its commands, in order (its audit events are counted, its blocked reports
        kept, the rest not stored)."""
        self.num_failed_actions += sum(1 for a in effects.actions if a.status == "failed")
        self.blocked_log.extend((now_s, ps.detail) for ps in effects.plan_statuses if ps.status == "blocked")
        for cmd in effects.commands:
            self._execute(cmd, now_s)

    def settle(self, now_s: float, effects: ReconcileEffects | None, max_num_rounds: int = 16) -> None:
        """At the start of a run: carry out `effects` with every instance ready at once, and what the core asks in
        answer, until it asks nothing more (a system that had been running holds its placement)."""
        self.preloading = True
        effects = effects if effects is not None else self.rec.on_tick(now_s * 1e3)
        try:
            for _ in range(max_num_rounds):
                self.apply(effects, now_s)
                self._report(now_s, everyone=True)
                effects = self.rec.on_tick(now_s * 1e3)
                if not effects.commands:
                    break
            self.apply(effects, now_s)
        finally:
            self.preloading = False

    def instances(self) -> list[tuple[str, InstanceStatus]]:
        """(worker, status) of every instance on a device, as the last heartbeats report them."""
        return [(worker_id_of(self._lead(inst)), self._statuses[iid]) for iid, inst in self.by_iid.items()
                if iid in self._statuses]

    def alive_workers(self) -> list[str]:
        return list(self._heartbeats)

    # ------------------------------------------------------------------------------------------ the worker side
    def _execute(self, cmd: LifecycleCommand, now_s: float) -> None:
        if cmd.action in UP_ACTIONS:
            self._bring_up(cmd, now_s)
        elif cmd.action in (LifecycleAction.WARM, LifecycleAction.COLD):
            self._remove(cmd, now_s)
        else:
            self._reply(cmd, now_s, ok=False, state=ModelState.COLD,
                        error=ErrorInfo(code=ErrorCode.INVALID_REQUEST, message=f"{cmd.action.value}: not simulated"))

    def _bring_up(self, cmd: LifecycleCommand, now_s: float) -> None:
        run, iid = self.run, cmd.instance_id
        inst = self.by_iid.get(iid)
        if inst is not None:
            if inst.is_draining:  # wanted again while it drains: admit again (DRAINING -> ACTIVE)
                if run.sim.resume(inst, now_s):
                    run.counters["resumed"] += 1
                    removal = self._removing.pop(iid, None)
                    if removal is not None:
                        self._reply(removal, now_s, ok=False, state=ModelState.ACTIVE, error=ErrorInfo(
                            code=ErrorCode.CANCELLED, message="the instance was wanted again and resumed"))
                    self._ready_now(cmd, inst, now_s)
                else:
                    self._reply(cmd, now_s, ok=False, state=ModelState.DRAINING, error=ErrorInfo(
                        code=ErrorCode.ILLEGAL_TRANSITION, retryable=True, message="drained before it was ready"))
            elif inst.is_ready:
                self._ready_now(cmd, inst, now_s)
            else:
                self._coming_up[iid] = cmd  # still loading: answered when ready
            return
        app = self.index[cmd.model]
        devices = tuple(device_of(w) for w in (cmd.worker_id, *cmd.peer_worker_ids))
        why = self._no_room(app, devices, cmd.pool)
        if why:
            self._reply(cmd, now_s, ok=False, state=ModelState.COLD, error=ErrorInfo(
                code=ErrorCode.INSTANCE_FAILED, retryable=True, message=f"could not bring the instance up: {why}"))
            return
        via, load_s = self._load_path(cmd, app, devices)
        inst = run.launch_via(app, cmd.role.value, cmd.pool.value, devices, now_s, via, load_s, instance_id=iid)
        self.by_iid[iid] = inst
        self._devices[iid] = devices
        self._coming_up[iid] = cmd
        self._dirty.update(devices)
        if self.preloading:
            run.sim.ready_now(inst, now_s)

    def _no_room(self, app: int, devices: tuple[int, ...], pool: Pool) -> str:
        sim, cost = self.run.sim, self.run.costs[app]
        if len(devices) != cost.tp:
            return f"{len(devices)} device(s) for a model at tensor parallelism {cost.tp}"
        if pool == Pool.ELASTIC or len(devices) > 1:  # a single model's devices
            busy = [d for d in devices if d in sim.executor_of_device]
            return f"device d{busy[0]} holds another instance" if busy else ""
        executor = sim.executor_of_device.get(devices[0])
        if executor is None:
            return ""
        if executor.device_ids != devices or any(i.pool != "steady" for i in executor.instances):
            return f"device d{devices[0]} holds an elastic instance"
        if cost.weight_bytes > executor.free_hbm_bytes:
            return f"no room on d{devices[0]} for the weights"
        return ""

    def _load_path(self, cmd: LifecycleCommand, app: int, devices: tuple[int, ...]) -> tuple[str, float]:
        """How long the command takes to make the instance ready, by the way it names (docs/lifecycle.md), then
        checksums and a canary step. A fork whose source is gone falls back as the worker does: a warm copy of
        its own, else the disk."""
        if self.preloading:
            return "preloaded", 0.0
        times = self.run.costs[app].load_times()
        source = cmd.fork_source
        if cmd.action == LifecycleAction.FORK_FROM and source is not None:
            if source.kind == "host_copy" and (device_of(source.worker_id), app) in self.run.warm:
                return "remote_warm", times.net_s + VERIFY_S
            live = self.by_iid.get(source.instance_id)
            if source.kind == "replica" and live is not None and live.is_ready:
                mark_fork_source(live, self.run.sim.now_s + times.d2d_s)
                return "fork", times.d2d_s + VERIFY_S
        if all((d, app) in self.run.warm for d in devices):
            return "warm_copy", times.h2d_s + VERIFY_S
        return "cold_load", times.disk_s + VERIFY_S

    def _remove(self, cmd: LifecycleCommand, now_s: float) -> None:
        inst = self.by_iid.get(cmd.instance_id)
        if inst is None or inst.executor is None:
            state = ModelState.WARM if cmd.action == LifecycleAction.WARM else ModelState.COLD
            self._reply(cmd, now_s, ok=True, state=state, detail="not resident: nothing to do")
            return
        self._coming_up.pop(cmd.instance_id, None)  # a removal supersedes an activation still loading
        self._removing[cmd.instance_id] = cmd
        self._dirty.update(self._devices[cmd.instance_id])
        self.run.retire(inst, now_s, keep_warm=cmd.action == LifecycleAction.WARM)  # may leave at once

    # ------------------------------------------------------------------------------------------ engine hooks
    def _on_ready(self, inst: SimInstance, now_s: float) -> None:
        if self.by_iid.get(inst.instance_id) is not inst:
            return
        cmd = self._coming_up.pop(inst.instance_id, None)
        self.rec.observe_record(self._record(inst, now_s))
        self._dirty.update(self._devices[inst.instance_id])
        if cmd is not None:
            self._reply(cmd, now_s, ok=True, state=ModelState.ACTIVE)

    def _ready_now(self, cmd: LifecycleCommand, inst: SimInstance, now_s: float) -> None:
        self.rec.observe_record(self._record(inst, now_s))
        self._dirty.update(self._devices[inst.instance_id])
        self._reply(cmd, now_s, ok=True, state=ModelState.ACTIVE)

    def _on_removed(self, inst: SimInstance, now_s: float) -> None:
        iid = inst.instance_id
        if self.by_iid.get(iid) is not inst:
            return
        del self.by_iid[iid]
        self._statuses.pop(iid, None)
        devices = self._devices.pop(iid)
        self._dirty.update(devices)
        for d in devices:
            if (d, inst.app) in self.run.warm:
                self._warm_role.setdefault(d, {})[inst.app] = inst.role
        self.rec.observe_record_deleted(iid)
        cmd = self._removing.pop(iid, None)
        if cmd is not None:
            state = ModelState.WARM if cmd.action == LifecycleAction.WARM else ModelState.COLD
            self._reply(cmd, now_s, ok=True, state=state)

    # ------------------------------------------------------------------------------------------ reports
    def _reply(self, cmd: LifecycleCommand, now_s: float, ok: bool, state: ModelState, detail: str = "",
               error: ErrorInfo | None = None) -> None:
        self.rec.observe_reply(now_s * 1e3, LifecycleReply.model_construct(
            command_id=cmd.command_id, instance_id=cmd.instance_id, ok=ok, state=state,
            detail=detail or (error.message if error else ""), timings_ms={}, error=error))

    def _record(self, inst: SimInstance, now_s: float) -> InstanceRecord:
        return InstanceRecord.model_construct(
            instance_id=inst.instance_id, model=self.names[inst.app], worker_id=worker_id_of(self._lead(inst)),
            role=_ROLE[inst.role], pool=_POOL[inst.pool], state=ModelState.ACTIVE, is_ready=True,
            prefill_tokens_per_s=None, max_num_seqs=inst.cost.max_num_seqs, updated_unix_ms=now_s * 1e3)

    @staticmethod
    def _lead(inst: SimInstance) -> int:
        return int(inst.worker_id[1:])  # Sim.launch names the worker after the group's first device

    def _status(self, inst: SimInstance) -> InstanceStatus:
        state = (ModelState.ACTIVE if inst.is_ready else ModelState.DRAINING if inst.is_draining
                 else ModelState.LOADING)
        num_waiting, num_running = len(inst.waiting), inst.batch
        kv_used, kv_free = kv_blocks(inst)
        old = self._statuses.get(inst.instance_id)
        if old is not None and old.state == state:
            if (old.num_waiting == num_waiting and old.num_running == num_running
                    and old.num_kv_blocks_used == kv_used and old.num_kv_blocks_free == kv_free):
                return old
            # only the counts moved: a copy of the line with them (a third of the cost of building one; the
            # simulator's own values, already valid)
            status = copy.copy(old)
            status.__dict__.update(num_waiting=num_waiting, num_running=num_running, num_kv_blocks_used=kv_used,
                                   num_kv_blocks_free=kv_free)
            self._statuses[inst.instance_id] = status
            return status
        devices = self._devices[inst.instance_id]
        status = InstanceStatus.model_construct(
            instance_id=inst.instance_id, model=self.names[inst.app], role=_ROLE[inst.role], pool=_POOL[inst.pool],
            state=state, num_waiting=num_waiting, num_running=num_running, num_kv_blocks_used=kv_used,
            num_kv_blocks_free=kv_free, ttft_ms_p50=None, tpot_ms_p50=None, prefill_tokens_per_s=None,
            decode_tokens_per_s=None, weight_segments=_SEGMENTS, host_copy=None,
            peer_worker_ids=tuple(worker_id_of(d) for d in devices[1:]))
        self._statuses[inst.instance_id] = status
        return status

    def _warm_statuses(self, device: int, resident_apps: set[int]) -> tuple[InstanceStatus, ...]:
        """The models this device's host keeps warm (pinned host copies peers may pull), as WARM instances: the
        same objects while nothing changes (the view's cheap path)."""
        warm = self._warm_role.get(device, {})
        key = (tuple(warm.items()), frozenset(resident_apps & warm.keys()))
        cached = self._warm_lines.get(device)
        if cached is not None and cached[0] == key:
            return cached[1]
        wid = worker_id_of(device)
        lines = tuple(InstanceStatus.model_construct(
            instance_id=instance_id_for(self.names[app], wid, _ROLE[role]), model=self.names[app],
            role=_ROLE[role], pool=Pool.ELASTIC, state=ModelState.WARM, num_waiting=0, num_running=0,
            weight_segments=(), host_copy=_HOST_COPY, peer_worker_ids=())
            for app, role in warm.items() if app not in resident_apps)
        self._warm_lines[device] = (key, lines)
        return lines

    def _heartbeat(self, device: int, now_s: float) -> WorkerHeartbeat:
        executor = self.run.sim.executor_of_device.get(device)
        insts = [i for i in executor.instances if self._lead(i) == device] if executor is not None else []
        statuses = tuple(self._status(i) for i in insts if self.by_iid.get(i.instance_id) is i)
        statuses += self._warm_statuses(device, {i.app for i in insts})
        self._seq += 1
        wid = worker_id_of(device)
        last = self._heartbeats.get(wid)
        if last is None:
            return WorkerHeartbeat.model_construct(
                worker_id=wid, seq=self._seq, sent_unix_ms=now_s * 1e3, device=self._device_info, pages=self._pages,
                instances=statuses, transfer_session=f"sim-{device}", is_draining=False)
        hb = copy.copy(last)  # a new heartbeat, the fields that move replaced (a third of the cost of building one)
        hb.__dict__.update(seq=self._seq, sent_unix_ms=now_s * 1e3, instances=statuses)
        return hb

    def _report(self, now_s: float, everyone: bool = False) -> None:
        """Heartbeats of the devices whose instances changed; with `everyone`, the others' liveness too (their
        last heartbeats stand: the periodic beat)."""
        now_ms = now_s * 1e3
        observe = self.rec.observe_heartbeat
        for d in sorted(self._dirty):
            hb = self._heartbeats[worker_id_of(d)] = self._heartbeat(d, now_s)
            observe(now_ms, hb)
        self._dirty.clear()
        if everyone:
            self.rec.observe_alive(now_ms, self._heartbeats)

    def report_all(self, now_s: float) -> None:
        """Every worker's heartbeat now (at start: the planners see the fleet before their first plan)."""
        self._report(now_s, everyone=True)

    def _beat(self, now_s: float) -> None:
        """The periodic heartbeat, every worker's: also the backlog counts and the KV, which change without a
        lifecycle event."""
        for iid, inst in self.by_iid.items():
            old = self._statuses.get(iid)
            if (old is None or old.num_waiting != len(inst.waiting) or old.num_running != inst.batch
                    or (old.num_kv_blocks_used, old.num_kv_blocks_free) != kv_blocks(inst)):
                self._dirty.add(self._lead(inst))
        self._report(now_s, everyone=True)

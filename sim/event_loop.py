"""The discrete-event engine: a virtual clock, an event heap, the open-loop arrival stream, and the cluster of
devices, executors and instances that a system's control plane places models on.

Event order is total and deterministic: (time, sequence number of scheduling). Arrivals come from the trace's
columns in order; at equal times, already-scheduled events go first (a run that ends exactly when a request
arrives has freed its slot before the request is dispatched)."""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Callable, Protocol

from .costmodel import StepCost
from .device_effects import DeviceEffects, StepEffects
from .device_ledger import DeviceLedger
from .executor import Executor, SimInstance, score_decode_tokens
from .requests import RequestTable

# event kinds
RUN_END, KV_ARRIVE, READY, CALL = 0, 1, 2, 3


class Dispatch(Protocol):
    """Routes requests to instances (wraps the dispatcher core)."""

    def on_arrival(self, request: int, now_s: float) -> None: ...

    def on_first_token(self, instance: SimInstance, request: int, now_s: float) -> None: ...

    def on_instances_changed(self, app: int, now_s: float) -> None: ...


@dataclass
class DeviceLog:
    """The active-device step function: from time_s[k] on, count[k] devices hold at least one instance."""

    time_s: list[float] = field(default_factory=list)
    count: list[int] = field(default_factory=list)
    pinned_count: int | None = None  # a system that reserves a fixed pool is charged for all of it

    def record(self, now_s: float, count: int) -> None:
        if self.pinned_count is not None:
            count = self.pinned_count
        if self.count and self.count[-1] == count:
            return
        if self.time_s and self.time_s[-1] == now_s:
            self.count[-1] = count
            return
        self.time_s.append(now_s)
        self.count.append(count)


class Sim:
    """One system on one trace. The control plane calls `launch`, `drain`, `at`, `every`; the dispatch layer calls
    `assign`; executors call the hooks below."""

    def __init__(self, table: RequestTable, num_devices: int, hbm_bytes_per_device: float,
                 link_bytes_per_s: float, effects: DeviceEffects | None = None, horizon_s: float = math.inf):
        if num_devices < 1:
            raise ValueError("num_devices must be >= 1")
        self.table = table
        self.num_devices = num_devices
        self.hbm_bytes_per_device = hbm_bytes_per_device
        self.link_bytes_per_s = link_bytes_per_s
        self.now_s = 0.0
        self._heap: list[tuple] = []
        self._seq = 0
        self.dispatch: Dispatch | None = None
        self.instances: dict[str, SimInstance] = {}
        self.instances_by_app: dict[int, list[SimInstance]] = {}
        self.executor_of_device: dict[int, Executor] = {}
        self.devices_log = DeviceLog()
        self.ledger = DeviceLedger(horizon_s)  # device time by kind of instance, over the span devices_log is charged
        self.decode_target: dict[int, SimInstance] = {}  # request -> its decode instance (P/D)
        self.num_events = 0
        self.num_done = 0  # requests finished or failed
        self.num_decodes_moved = 0  # running decodes moved off draining instances (move_decodes)
        self._next_arrival = 0
        self.on_done: Callable[[int, float], None] | None = None
        self._next_instance = 0
        self.lifecycle_log: list[tuple[float, str, str, str]] = []  # (time, instance, event, detail)
        self.app_of_instance: dict[str, int] = {}  # every instance launched, gone or not (for `janus sim --watch`)
        self.effects = effects if effects is not None and not effects.is_off else None
        self._num_executors = 0
        # told of every instance that became ready or left (a fleet port reports them to the reconciler)
        self.on_ready: list[Callable[[SimInstance, float], None]] = []
        self.on_removed: list[Callable[[SimInstance, float], None]] = []

    # ------------------------------------------------------------------------------------------------ clock
    def _push(self, time_s: float, kind: int, a, b=None) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (time_s, self._seq, kind, a, b))

    def at(self, time_s: float, fn: Callable[[float], None]) -> None:
        """Call fn(now_s) at time_s."""
        self._push(max(time_s, self.now_s), CALL, fn)

    def every(self, period_s: float, fn: Callable[[float], None], start_s: float = 0.0, end_s: float | None = None):
        """Call fn(now_s) every period_s from start_s (until end_s)."""
        if period_s <= 0:
            raise ValueError("period_s must be > 0")

        def tick(now_s: float) -> None:
            fn(now_s)
            if end_s is None or now_s + period_s <= end_s:
                self.at(now_s + period_s, tick)

        self.at(start_s, tick)

    # ------------------------------------------------------------------------------------------------ run
    def run(self, until_s: float | None = None, progress: Callable[[int], None] | None = None,
            drain_s: float = 900.0) -> None:
        """Replay every arrival, then run until every request has finished or failed (periodic timers never
        stop on their own), or until `until_s` (default: last arrival + `drain_s`; what is still running then
        counts as failed)."""
        table = self.table
        arrivals = table.arrival_s
        n = len(arrivals)
        heap = self._heap
        pop = heapq.heappop
        dispatch = self.dispatch
        if dispatch is None:
            raise RuntimeError("no dispatch layer attached")
        i = self._next_arrival
        report_every = max(1, n // 200)
        limit = (arrivals[-1] if n else 0.0) + drain_s if until_s is None else until_s
        while True:
            if i >= n and self.num_done >= n:
                break
            next_arrival = arrivals[i] if i < n else float("inf")
            if heap and heap[0][0] <= next_arrival:
                if heap[0][0] > limit:
                    break
                time_s, _, kind, a, b = pop(heap)
                self.now_s = time_s
                self.num_events += 1
                if kind == RUN_END:
                    a.on_run_end(time_s, b)
                elif kind == KV_ARRIVE:
                    self._kv_arrived(a, b, time_s)
                elif kind == READY:
                    self._ready(a, time_s)
                else:
                    a(time_s)
            elif i < n:
                if next_arrival > limit:
                    break
                self.now_s = next_arrival
                i += 1
                self._next_arrival = i
                dispatch.on_arrival(i - 1, next_arrival)
                if progress is not None and i % report_every == 0:
                    progress(i)
            else:
                break
        if progress is not None:
            progress(i)
        for inst in self.instances.values():
            score_decode_tokens(inst)  # what finished since the instance's last batch (removed ones scored theirs)
        if until_s is None:
            self._fail_unfinished()

    def _fail_unfinished(self) -> None:
        t = self.table
        for request in range(len(t.arrival_s)):
            if t.finish_s[request] != t.finish_s[request] and t.first_token_s[request] == t.first_token_s[request]:
                t.first_token_s[request] = float("nan")  # cut off mid-stream: counts as failed
                t.num_on_time[request] = 0

    # ------------------------------------------------------------------------------------------------ placement
    def free_device_ids(self) -> list[int]:
        return [d for d in range(self.num_devices) if d not in self.executor_of_device]

    def num_active_devices(self) -> int:
        return len(self.executor_of_device)

    def launch(self, app: int, role: str, pool: str, device_ids: tuple[int, ...], cost: StepCost, load_s: float,
               via: str = "", now_s: float | None = None, instance_id: str | None = None) -> SimInstance:
        """Place a new instance of `app` on `device_ids` (one device for a steady-pool instance, which may share
        it; a whole tensor-parallel group otherwise). It becomes ready after `load_s` (the lifecycle's load
        time by the path `via`). `instance_id`: the control plane's name for it (default: a fresh one)."""
        now_s = self.now_s if now_s is None else now_s
        if len(device_ids) != cost.tp:
            raise ValueError(f"app {app}: {len(device_ids)} devices for tp={cost.tp}")
        executor = self.executor_of_device.get(device_ids[0])
        if executor is None:
            for d in device_ids:
                if d in self.executor_of_device or not 0 <= d < self.num_devices:
                    raise ValueError(f"device {d} is taken or out of range")
            self._num_executors += 1
            step_effects = None
            if self.effects is not None:
                step_effects = StepEffects(self.effects, f"ex{device_ids[0]}-{self._num_executors}")
            executor = Executor(f"ex{device_ids[0]}", tuple(device_ids), self.hbm_bytes_per_device, self,
                                step_effects)
            for d in device_ids:
                self.executor_of_device[d] = executor
        elif executor.device_ids != tuple(device_ids):
            raise ValueError(f"devices {device_ids} split an existing group {executor.device_ids}")
        self._next_instance += 1
        if instance_id is None:
            instance_id = f"i{self._next_instance}-a{app}-{role[0]}"
        elif instance_id in self.instances:
            raise ValueError(f"instance {instance_id} exists")
        inst = SimInstance(instance_id, app, role, pool, cost, self.table, worker_id=f"w{device_ids[0]}")
        inst.created_s = now_s
        inst.ready_at_s = now_s + load_s
        self.ledger.changing(executor, now_s)
        executor.add(inst)
        self.instances[inst.instance_id] = inst
        self.app_of_instance[inst.instance_id] = app
        self.instances_by_app.setdefault(app, []).append(inst)
        self.devices_log.record(now_s, len(self.executor_of_device))
        self.lifecycle_log.append((now_s, inst.instance_id, "launch", f"{via} {load_s:.3f}s on {device_ids}"))
        self._push(now_s + load_s, READY, inst)
        return inst

    def drain(self, inst: SimInstance, now_s: float | None = None) -> None:
        """Stop routing to the instance; it leaves (freeing its devices if it was their last) when idle."""
        now_s = self.now_s if now_s is None else now_s
        if inst.is_draining:
            return
        inst.is_draining = True
        was_ready = inst.is_ready
        inst.is_ready = False
        self.lifecycle_log.append((now_s, inst.instance_id, "drain", ""))
        if was_ready and self.dispatch is not None:
            self.dispatch.on_instances_changed(inst.app, now_s)
        if not inst.waiting and not inst.batch and inst.num_in_flight <= 0:
            self._remove(inst, now_s)

    def resume(self, inst: SimInstance, now_s: float | None = None) -> bool:
        """Admit again an instance that is draining (the lifecycle's RESUME: DRAINING -> ACTIVE, its weights never
        left). False when it cannot: not draining, already gone, or drained before its load finished."""
        now_s = self.now_s if now_s is None else now_s
        if not inst.is_draining or inst.executor is None or now_s < inst.ready_at_s:
            return False
        inst.is_draining = False
        inst.is_ready = True
        self.lifecycle_log.append((now_s, inst.instance_id, "resume", ""))
        if self.dispatch is not None:
            self.dispatch.on_instances_changed(inst.app, now_s)
        return True

    def _remove(self, inst: SimInstance, now_s: float) -> None:
        executor = inst.executor
        if executor is None:
            return
        self.ledger.changing(executor, now_s)
        executor.remove(inst)
        del self.instances[inst.instance_id]
        self.instances_by_app[inst.app].remove(inst)
        if not executor.instances:
            self.ledger.emptied(executor)
            for d in executor.device_ids:
                del self.executor_of_device[d]
        self.devices_log.record(now_s, len(self.executor_of_device))
        self.lifecycle_log.append((now_s, inst.instance_id, "removed", ""))
        for listener in self.on_removed:
            listener(inst, now_s)

    def _ready(self, inst: SimInstance, now_s: float) -> None:
        if inst.is_draining or inst.executor is None or inst.is_ready:
            return  # drained while loading, or made ready already (ready_now)
        inst.is_ready = True
        self.lifecycle_log.append((now_s, inst.instance_id, "ready", ""))
        if self.dispatch is not None:
            self.dispatch.on_instances_changed(inst.app, now_s)
        for listener in self.on_ready:
            listener(inst, now_s)

    def ready_now(self, inst: SimInstance, now_s: float) -> None:
        """Make a just-launched instance ready at once (a placement that was there before the run started)."""
        inst.ready_at_s = min(inst.ready_at_s, now_s)
        self._ready(inst, now_s)

    # ------------------------------------------------------------------------------------------------ requests
    def assign(self, inst: SimInstance, request: int, now_s: float, decode: SimInstance | None = None) -> None:
        """Queue the request's prefill on `inst` (and, P/D, remember where its decode goes)."""
        inst.waiting.append(request)
        inst.num_in_flight += 1
        if decode is not None:
            self.decode_target[request] = decode
            decode.num_in_flight += 1
        inst.executor.notify(now_s)

    def fail(self, request: int, now_s: float) -> None:
        """The request failed: every token late (outcome arrays keep NaN times and zero on-time tokens)."""
        t = self.table
        t.first_token_s[request] = float("nan")
        t.finish_s[request] = float("nan")
        t.num_on_time[request] = 0
        self._finished(request, now_s)

    def _finished(self, request: int, now_s: float) -> None:
        self.num_done += 1
        if self.on_done is not None:
            self.on_done(request, now_s)

    def _kv_arrived(self, decode: SimInstance, request: int, now_s: float) -> None:
        decode.waiting.append(request)
        if decode.executor is not None:
            decode.executor.notify(now_s)

    # ------------------------------------------------------------------------------------------------ executor hooks
    def schedule_run_end(self, executor: Executor, time_s: float) -> None:
        self._push(time_s, RUN_END, executor, executor.version)

    def on_first_token(self, inst: SimInstance, request: int, now_s: float) -> None:
        self.dispatch.on_first_token(inst, request, now_s)
        if inst.role == "prefill":
            decode = self.decode_target.pop(request, None)
            if decode is None or decode.executor is None or self.table.output_tokens[request] <= 1:
                if decode is not None:
                    decode.num_in_flight -= 1
                if self.table.output_tokens[request] <= 1:
                    self.table.finish_s[request] = now_s
                    self._finished(request, now_s)
                else:
                    self.fail(request, now_s)  # its decode instance went away: the stream breaks
                self._maybe_idle(decode, now_s)
                return
            transfer_s = inst.cost.kv_transfer_s(self.table.input_tokens[request] + 1, self.link_bytes_per_s)
            self._push(now_s + transfer_s, KV_ARRIVE, decode, request)
            self._maybe_idle(inst, now_s)

    def on_request_done(self, inst: SimInstance, request: int, now_s: float) -> None:
        self._finished(request, now_s)
        self._maybe_idle(inst, now_s)

    def on_request_failed(self, inst: SimInstance, request: int, now_s: float) -> None:
        decode = self.decode_target.pop(request, None)
        if decode is not None:
            decode.num_in_flight -= 1
        self.fail(request, now_s)

    def on_instance_idle(self, inst: SimInstance, now_s: float) -> None:
        self._maybe_idle(inst, now_s)

    # ------------------------------------------------------------------------------------------------ moving decodes
    def move_decodes(self, source: SimInstance, target: SimInstance, num_requests: int, now_s: float) -> None:
        """Move up to `num_requests` running decodes of `source` to `target` (the dispatcher's order, carried out
        as the workers do: worker/dataplane/move_flow.py). The engine takes them out at its next step boundary."""
        if source.executor is None or not source.batch or source is target:
            return
        source.moves_out.append((target, num_requests))
        source.executor.notify(now_s)  # cut the run at its next round

    def on_moves_due(self, inst: SimInstance, now_s: float) -> None:
        """At a step boundary: the longest-running decodes go first (the worker's order); each one's KV (prompt and
        tokens so far) crosses the device link, and the target admits it when it lands. A target that went away or
        stopped being ready meanwhile takes nothing: those decodes stay (the worker's refused move)."""
        orders, inst.moves_out = inst.moves_out, []
        table = self.table
        longest_first = iter(r for _, r in sorted(inst.finish_heap, key=lambda e: table.join_round[e[1]]))
        moving = [(target, request) for target, num_requests in orders if target.executor is not None
                  and target.is_ready for _, request in zip(range(num_requests), longest_first)]
        if not moving:
            return
        emitted = inst.executor.take_out(inst, [request for _, request in moving])
        self.num_decodes_moved += len(moving)
        for (target, request), num_emitted in zip(moving, emitted):
            target.num_in_flight += 1
            transfer_s = inst.cost.kv_transfer_s(int(table.input_tokens[request]) + num_emitted, self.link_bytes_per_s)
            self.at(now_s + transfer_s, lambda t, d=target, r=request, n=num_emitted: self._moved_in(d, r, n, t))

    def _moved_in(self, target: SimInstance, request: int, num_emitted: int, now_s: float) -> None:
        if target.executor is None:  # gone while the KV crossed: the stream breaks (live, a timed-out hand-over)
            self.fail(request, now_s)
            return
        target.resume_at[request] = num_emitted
        self._kv_arrived(target, request, now_s)

    def _maybe_idle(self, inst: SimInstance | None, now_s: float) -> None:
        if inst is not None and inst.is_draining and not inst.waiting and not inst.batch and inst.num_in_flight <= 0:
            self._remove(inst, now_s)

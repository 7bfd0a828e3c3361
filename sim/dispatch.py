"""The dispatch layer of the simulator: one `dispatcher.core.DispatcherCore` per model, driven on the virtual
clock exactly as the dispatcher service drives it (requests, registry snapshots, prefill completions, decode
backlogs from heartbeats, ticks at `next_wakeup_ms`), its effects carried out on the simulated instances.

One core per model is a partitioned deployment (each model's queue lives in one dispatcher); it also keeps every
core's registry view to its own model's instances, so a scheduling round costs what that model has, not the fleet."""
from __future__ import annotations

from typing import Callable

import numpy as np

from contracts import InstanceRecord, InstanceRole, InstanceStatus, ModelLoadWindow, ModelState, Pool
from contracts import WorkerHeartbeat
from dispatcher.core import Assign, DispatcherCore, DispatchPolicy, DispatchRequest, PublishLoad, Reject
from dispatcher.core.effects import MoveDecodes

from .event_loop import Sim
from .executor import SimInstance, score_decode_tokens

_ROLE = {"colocated": InstanceRole.COLOCATED, "prefill": InstanceRole.PREFILL, "decode": InstanceRole.DECODE}
_POOL = {"steady": Pool.STEADY, "elastic": Pool.ELASTIC}
HEARTBEAT_PERIOD_S = 0.5
# Live, a worker tells the dispatchers each finished request's on-time tokens as it finishes (contracts.
# RequestOutcome); here the finished requests are scored and reported once a simulated second, in one batch (the
# executor scores token times from its step segments in batches: docs/sim.md). A window's token-level attainment
# is then up to a second behind its arrivals, against a 5 s window.
OUTCOME_PERIOD_S = 1.0


class SimPrefillTime:
    """The dispatcher's p_j from the same roofline cost model the simulated devices run on (what the oracle would
    answer for a model without a fitted profile)."""

    def __init__(self, cost_by_model: dict[str, object]):
        self._cost = cost_by_model
        self._table_ms: dict[str, np.ndarray] = {}  # model -> p_j by prompt length, grown as longer prompts come

    def predict_ms(self, instance: InstanceRecord, num_prompt_tokens: int) -> float:
        return 1e3 * self._cost[instance.model].prefill_s(int(num_prompt_tokens))

    def predict_many_ms(self, instance: InstanceRecord, num_prompt_tokens: np.ndarray) -> np.ndarray:
        return 1e3 * self._cost[instance.model].prefill_s_many(num_prompt_tokens)

    def predict_rows_ms(self, instances, num_prompt_tokens: np.ndarray) -> np.ndarray:
        """A round's instances are one model's, all on one kind of device: one row serves them all (the core asks
        this once per round). Looked up in a per-model table of `predict_many_ms` by prompt length, the same values
        elementwise: a queued request is in every round until it is sent, and computing its p_j each time was
        ~4 % of a Janus run."""
        model = instances[0].model
        lengths = num_prompt_tokens.astype(np.int64)
        table = self._table_ms.get(model)
        if table is not None:
            try:
                return table[lengths][None, :]
            except IndexError:  # a prompt longer than any so far: grow the table
                pass
        size = 1 << max(10, int(lengths.max(initial=0)).bit_length())
        table = self._table_ms[model] = self.predict_many_ms(instances[0], np.arange(size, dtype=np.float64))
        return table[lengths][None, :]


class CoreDispatch:
    """Implements engine.Dispatch over per-model dispatcher cores."""

    def __init__(self, sim: Sim, app_names: tuple[str, ...], cost_by_app: list, policy: DispatchPolicy,
                 recorder=None):
        self.sim = sim
        self.app_names = app_names
        self.policy = policy
        prefill_time = SimPrefillTime({app_names[a]: c for a, c in enumerate(cost_by_app)})
        self.cores = [DispatcherCore(policy, prefill_time, dispatcher_id=f"sim-{a}") for a in range(len(app_names))]
        if recorder is not None:
            from .recording import RecordingDispatcher

            self.cores = [RecordingDispatcher(c, recorder, app_names[a]) for a, c in enumerate(self.cores)]
        self._wake_ms: list[float | None] = [None] * len(app_names)
        self._last_tick_ms: list[float] = [float("-inf")] * len(app_names)
        self.load_listeners: list[Callable[[float, ModelLoadWindow], None]] = []
        self.num_rejected = 0
        self.num_assigned = 0
        # every rejection as (time s, app, error code): which apps fail, why, and when (the report's worst apps)
        self.rejections: list[tuple[float, int, str]] = []
        self._records: dict[str, InstanceRecord] = {}
        self._statuses: dict[str, InstanceStatus] = {}
        self._finished: list[int] | None = None  # requests finished since the last outcome report (when reported)
        sim.dispatch = self
        sim.every(HEARTBEAT_PERIOD_S, self._heartbeats)

    def report_outcomes(self) -> None:
        """From now on the cores hear each finished request's on-time tokens, as the live dispatchers hear the
        workers' RequestOutcome, so their windows carry token-level attainment (for a control plane that learns from
        them: scoring token times costs a run time, so only then)."""
        if self._finished is not None:
            return
        self._finished = []
        self.sim.on_done = self._request_done
        self.sim.every(OUTCOME_PERIOD_S, self._report_outcomes, start_s=OUTCOME_PERIOD_S)

    def _request_done(self, request: int, now_s: float) -> None:
        self._finished.append(request)

    def _report_outcomes(self, now_s: float) -> None:
        finished, self._finished = self._finished, []
        if not finished:
            return
        table = self.sim.table
        apps = sorted({int(table.app[r]) for r in finished})
        for app in apps:  # their decode tokens scored now (a removed instance scored its own when it went)
            for inst in self.sim.instances_by_app.get(app, ()):
                score_decode_tokens(inst)
        now_ms = now_s * 1e3
        for request in finished:
            app = int(table.app[request])
            self.cores[app].on_request_outcome(now_ms, str(request), self.app_names[app],
                                               int(table.output_tokens[request]), int(table.num_on_time[request]))

    # ------------------------------------------------------------------------------------------ engine.Dispatch
    def on_arrival(self, request: int, now_s: float) -> None:
        t = self.sim.table
        app = t.app[request]
        now_ms = now_s * 1e3
        req = DispatchRequest(
            request_id=str(request),
            model=self.app_names[app],
            num_prompt_tokens=t.input_tokens[request],
            arrival_ms=now_ms,
            ttft_deadline_ms=now_ms + t.ttft_slo_s[request] * 1e3,
            expected_output_tokens=t.output_tokens[request],
            tpot_slo_ms=t.tpot_slo_s[request] * 1e3,
        )
        self._apply(app, self.cores[app].on_request(now_ms, req), now_s)

    def on_first_token(self, instance: SimInstance, request: int, now_s: float) -> None:
        app = instance.app
        now_ms = now_s * 1e3
        self._apply(app, self.cores[app].on_prefill_done(now_ms, instance.instance_id, str(request), True, now_ms),
                    now_s)

    def on_instances_changed(self, app: int, now_s: float) -> None:
        now_ms = now_s * 1e3
        records = [self._record(inst, now_ms) for inst in self.sim.instances_by_app.get(app, ())
                   if inst.is_ready or inst.is_draining]
        self._apply(app, self.cores[app].on_instances(now_ms, records), now_s)

    # ------------------------------------------------------------------------------------------ internals
    def _record(self, inst: SimInstance, now_ms: float) -> InstanceRecord:
        key = f"{inst.instance_id}/{inst.is_ready}"
        record = self._records.get(key)
        if record is None:
            record = InstanceRecord(
                instance_id=inst.instance_id, model=self.app_names[inst.app], worker_id=inst.worker_id,
                role=_ROLE[inst.role], pool=_POOL[inst.pool],
                state=ModelState.ACTIVE if inst.is_ready else ModelState.DRAINING, is_ready=inst.is_ready,
                max_num_seqs=inst.cost.max_num_seqs, updated_unix_ms=now_ms)
            self._records[key] = record
        return record

    def _apply(self, app: int, effects: list, now_s: float) -> None:
        sim = self.sim
        for e in effects:
            if isinstance(e, Assign):
                inst = sim.instances.get(e.instance_id)
                request = int(e.request_id)
                if inst is None or inst.executor is None:
                    sim.fail(request, now_s)
                    continue
                decode = sim.instances.get(e.decode_instance_id) if e.decode_instance_id else None
                sim.assign(inst, request, now_s, decode)
                self.num_assigned += 1
            elif isinstance(e, Reject):
                self.num_rejected += 1
                self.rejections.append((now_s, app, e.code.value))
                sim.fail(int(e.request_id), now_s)
            elif isinstance(e, PublishLoad):
                for listener in self.load_listeners:
                    listener(now_s, e.window)
            elif isinstance(e, MoveDecodes):
                source, target = sim.instances.get(e.instance_id), sim.instances.get(e.target_instance_id)
                if source is not None and target is not None:
                    sim.move_decodes(source, target, e.max_requests, now_s)
        self._rearm(app, now_s)

    def _rearm(self, app: int, now_s: float) -> None:
        wake_ms = self.cores[app].next_wakeup_ms()
        if wake_ms is None:
            return
        # The core asked for a time in its own ms; keep that exact value for the tick (seconds -> ms rounding
        # could land a hair before it, the round would not be due yet, and the core would ask again forever).
        wake_ms = max(wake_ms, now_s * 1e3)
        if wake_ms <= self._last_tick_ms[app]:
            wake_ms = self._last_tick_ms[app] + 1e-3  # never two ticks at one instant: no zero-time loop
        current = self._wake_ms[app]
        if current is not None and current <= wake_ms and current >= now_s * 1e3:
            return  # an earlier (or the same) tick is already due; it re-arms after running
        self._wake_ms[app] = wake_ms
        self.sim.at(wake_ms / 1e3, lambda t, a=app, w=wake_ms: self._tick(a, w, t))

    def _tick(self, app: int, wake_ms: float, now_s: float) -> None:
        if self._wake_ms[app] != wake_ms:
            return  # superseded by an earlier wakeup
        self._wake_ms[app] = None
        tick_ms = max(wake_ms, now_s * 1e3)
        self._last_tick_ms[app] = tick_ms
        self._apply(app, self.cores[app].on_tick(tick_ms), now_s)

    def _heartbeats(self, now_s: float) -> None:
        """Decode and co-located instances report their backlog (waiting + running) as the worker heartbeat carries
        it; built with model_construct: these are the simulator's own, already-valid values. Moving decodes off
        draining instances, draining decode instances report too, and decode instances their decode rate."""
        now_ms = now_s * 1e3
        last, self._statuses = self._statuses, {}  # only instances still reporting are kept
        cores = self.cores
        moves = self.policy.moves_draining_decodes
        for app, insts in self.sim.instances_by_app.items():
            # the roles whose backlog this core reads (a baseline reads no co-located ones: ~10 % of its run)
            roles = ("colocated", "decode") if cores[app].reads_colocated_backlog else ("decode",)
            statuses = [self._status(i, last, moves) for i in insts if i.role in roles and (
                i.is_ready or moves and i.is_draining and i.role == "decode" and i.executor is not None)]
            if statuses:
                hb = WorkerHeartbeat.model_construct(worker_id=f"sim-{app}", seq=0, sent_unix_ms=now_ms,
                                                     instances=tuple(statuses))
                self._apply(app, self.cores[app].on_heartbeat(now_ms, hb), now_s)

    def _status(self, inst: SimInstance, last_statuses: dict[str, InstanceStatus], moves: bool) -> InstanceStatus:
        """The instance's line in a heartbeat: the last one again while its backlog is unchanged, else a copy of it
        with the new counts (half the cost of building one). A heartbeat every 0.5 s for each of up to ~10^3
        instances: building each anew was ~4 % of a Janus run and ~10 % of static partition's."""
        num_waiting, num_running = len(inst.waiting), inst.batch
        if moves and inst.role == "decode":  # state and decode rate change without the counts: built each time
            return self._decode_status(inst, num_waiting, num_running)
        status = last_statuses.get(inst.instance_id)
        if status is not None and (status.num_waiting != num_waiting or status.num_running != num_running):
            status = status.model_copy(update={"num_waiting": num_waiting, "num_running": num_running})
        elif status is None:
            status = InstanceStatus.model_construct(
                instance_id=inst.instance_id, model=self.app_names[inst.app], role=_ROLE[inst.role],
                pool=_POOL[inst.pool], state=ModelState.ACTIVE, num_waiting=num_waiting, num_running=num_running)
        self._statuses[inst.instance_id] = status
        return status

    def _decode_status(self, inst: SimInstance, num_waiting: int, num_running: int) -> InstanceStatus:
        """A decode instance's line with its state and its decode rate now: its batch over its step (what the
        engine's measured rate says, without the window's lag)."""
        executor = inst.executor
        step_s = executor.run_round_s if executor is not None and executor.is_running else 0.0
        status = InstanceStatus.model_construct(
            instance_id=inst.instance_id, model=self.app_names[inst.app], role=_ROLE[inst.role],
            pool=_POOL[inst.pool], state=ModelState.ACTIVE if inst.is_ready else ModelState.DRAINING,
            num_waiting=num_waiting, num_running=num_running,
            decode_tokens_per_s=num_running / step_s if num_running and step_s > 0 else None)
        self._statuses[inst.instance_id] = status
        return status

"""The dispatcher core: per-model global queues, EPDT per prefill instance, LST-IMH (or a baseline), load windows.

Pure policy: every event method takes now_ms (one clock: wall-clock Unix ms in the service, virtual ms in the
simulator) and returns effects for the caller to carry out. No I/O, no clock reads.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import inf, isfinite
from typing import Iterable, Sequence

import numpy as np

from contracts import ErrorCode, GenerateRequest, InstanceRecord, InstanceRole, ModelState, WorkerHeartbeat

from .decode_routing import DecodeBacklog
from .effects import Assign, Effect, PublishLoad, Reject, Relaxed, Requeued
from .jobs import Job
from .least_load import LeastLoadIndex
from .load_window import LoadWindow
from .moves import DecodeMover
from .round import Affinity, plan_round
from .poison import is_poison, note_instance_failure, poison_message
from .policy import Algorithm, DispatchPolicy, OverloadPolicy
from .prefill_time import PrefillTimeModel
from .prefix_affinity import PrefixAffinityIndex, prefix_block_keys
from .registry import InstanceView
from .requests import DispatchRequest
from .scheduling import shared_rows


# roles whose instances decode what they hold: their backlog is tracked for routing
_DECODING_ROLES = (InstanceRole.DECODE, InstanceRole.COLOCATED)


@dataclass(slots=True)
class _InFlight:
    job: Job
    instance_id: str
    worker_id: str
    assigned_ms: float


class DispatcherCore:
    """See docs/dispatcher.md for the event and effect reference."""

    def __init__(
        self, policy: DispatchPolicy, prefill_time: PrefillTimeModel, *, dispatcher_id: str = ""
    ) -> None:
        if not isinstance(policy, DispatchPolicy):
            raise TypeError(f"policy must be a DispatchPolicy, got {type(policy).__name__}")
        if not (hasattr(prefill_time, "predict_ms") and hasattr(prefill_time, "predict_many_ms")):
            raise TypeError("prefill_time must implement PrefillTimeModel (predict_ms and predict_many_ms)")
        self.policy = policy
        self._prefill_time = prefill_time
        self._dispatcher_id = dispatcher_id
        self._view = InstanceView()
        self._decode = DecodeBacklog()
        self._queues: dict[str, dict[str, Job]] = {}  # model -> request id -> job, arrival order
        self._queued_model: dict[str, str] = {}  # request id -> model, for every queued job
        self._inflight: dict[str, _InFlight] = {}
        self._windows: dict[str, LoadWindow] = {}
        self._rr_cursor: dict[str, int] = {}
        self._least_load: dict[str, LeastLoadIndex] = {}
        self._waiting_for_instance: dict[str, set[str]] = {}  # model -> ids of jobs queued while it had no instance
        self._wake_published: set[str] = set()  # models whose window went out at once since they last had one
        self._mover = DecodeMover(after_draining_ms=policy.move_after_draining_ms,
                                  tpot_margin_frac=policy.move_tpot_margin_frac,
                                  max_per_target=policy.move_max_per_target)
        self._tpot_slo_ms: dict[str, float] = {}  # model -> the TPOT SLO its latest request carried
        self._now_ms = float("-inf")
        self._next_publish_ms: float | None = None
        self._prefixes = PrefixAffinityIndex(policy.prefix_block_size, policy.prefix_blocks_per_instance)

    # ------------------------------------------------------------------ events

    def on_request(self, now_ms: float, request: DispatchRequest | GenerateRequest) -> list[Effect]:
        """A new request (from janus.req.<model>). A request id already queued or in flight is ignored (redelivery)."""
        return self.on_requests(now_ms, [request])

    def on_requests(self, now_ms: float, requests: Sequence[DispatchRequest | GenerateRequest]) -> list[Effect]:
        """Several arrivals at once: one scheduling round per model instead of one per request."""
        now = self._advance(now_ms)
        models: dict[str, None] = {}  # arrival order of models, for a deterministic effect order
        for raw in requests:
            request = DispatchRequest.from_generate(raw) if isinstance(raw, GenerateRequest) else raw
            if not isinstance(request, DispatchRequest):
                raise TypeError(f"on_request takes DispatchRequest or GenerateRequest, got {type(raw).__name__}")
            request_id = request.request_id
            if request_id in self._inflight or request_id in self._queued_model:
                continue
            self._window(request.model, now).record_arrival(
                now, request.num_prompt_tokens, request.expected_output_tokens
            )
            if request.tpot_slo_ms > 0:
                self._tpot_slo_ms[request.model] = request.tpot_slo_ms
            job = Job.from_request(request)
            token_ids = getattr(request.source, "prompt_token_ids", None)  # a GenerateRequest's, live
            if self.policy.is_prefix_affine and token_ids:
                job.prefix_keys = prefix_block_keys(token_ids, self.policy.prefix_block_size)
            self._enqueue(job)
            models[request.model] = None
        effects: list[Effect] = []
        for model in models:
            effects += self._dispatch(now, model)
        return effects

    def on_instances(self, now_ms: float, records: Iterable[InstanceRecord]) -> list[Effect]:
        """A registry snapshot (the whole `instances` bucket). Only is_ready ACTIVE instances are routed to."""
        now = self._advance(now_ms)
        effects: list[Effect] = []
        records = list(records)
        lost = self._view.update(now, records)  # checks the records
        self._prefixes.retain({r.instance_id for r in records if r.is_ready and r.state == ModelState.ACTIVE})
        for instance_id in lost:
            # FAILED: its engine broke (poison.py counts it); gone from the registry: a loss, not a failure
            is_failure = self._view.record(instance_id) is not None
            effects += self._lose_instance(now, instance_id, is_ban=False, is_failure=is_failure)
        for model in self._view.models():
            self._window(model, now)
        for model in list(self._queues):
            effects += self._dispatch(now, model)
        return effects

    def on_heartbeat(self, now_ms: float, heartbeat: WorkerHeartbeat) -> list[Effect]:
        """A worker heartbeat: the backlogs (waiting + running sequences) of decode instances, for decode routing,
        and of co-located ones, for breaking LST-IMH's ties; with `moves_draining_decodes`, the moves of running
        decodes off draining decode instances it makes possible (moves.py)."""
        now = self._advance(now_ms)
        roles = _DECODING_ROLES if self.reads_colocated_backlog else (InstanceRole.DECODE,)
        for status in heartbeat.instances:
            if status.role in roles:
                self._decode.report(status.instance_id, heartbeat.sent_unix_ms, status.num_waiting + status.num_running)
        if not self.policy.moves_draining_decodes:
            return []
        effects: list[Effect] = []
        for model in sorted(self._mover.report(now, heartbeat)):
            effects += self._mover.plan(now, model, self._view.decode_instances(model), self._decode.backlog,
                                        self._tpot_slo_ms.get(model, 0.0))
        return effects

    def on_prefill_done(
        self,
        now_ms: float,
        instance_id: str,
        request_id: str,
        ok: bool = True,
        first_token_ms: float | None = None,
        failure: str = "handed_back",
    ) -> list[Effect]:
        """A prefill finished (PrefillDone): correct the instance's EPDT. ok=False means it failed before its first
        token, and `failure` says how (contracts.PrefillDone): "handed_back" and "instance_failed" send the request
        back to the queue (or fail it once its attempts are used up, or as a poison request: poison.py);
        "request_failed" ended it on the instance with its own error, so it is only forgotten here."""
        now = self._advance(now_ms)
        ledger = self._view.existing_ledger(instance_id)
        if ledger is not None:
            ledger.complete(now, request_id)
        inflight = self._inflight.get(request_id)
        if inflight is None or inflight.instance_id != instance_id:
            return []  # duplicate, or a late report from an instance the request has since left
        del self._inflight[request_id]
        job = inflight.job
        model = job.request.model
        effects: list[Effect] = []
        if ok:
            first_ms = now if first_token_ms is None else first_token_ms
            is_on_time = not job.is_late and first_ms <= job.request.ttft_deadline_ms
            self._window(model, now).record_first_token(now, is_on_time)
            self._decode.record_prefill_done(request_id, now)
        else:
            self._decode.forget_request(request_id)
            if failure == "instance_failed":
                effects += self._retry(now, job, instance_id, is_instance_failure=True)
                # its engine broke: route nothing more there until the registry says FAILED (the worker writes
                # that too, but this report may come first), and what else it held goes back to the queue now
                effects += self._lose_instance(now, instance_id, is_ban=True, is_failure=True)
            elif failure != "request_failed":
                effects += self._retry(now, job, instance_id, is_instance_failure=False)
        return effects + self._dispatch(now, model)

    def on_request_outcome(self, now_ms: float, request_id: str, model: str, num_output_tokens: int,
                           num_on_time_tokens: int) -> list[Effect]:
        """A request this dispatcher sent finished on a worker (contracts.RequestOutcome): its on-time output tokens
        go into the model's window (its token-level attainment, what the oracle learns from). The shell passes only
        outcomes of its own requests: each dispatcher's window holds the requests it dispatched. It no longer
        decodes: a backlog that counted it as sent since the instance's last heartbeat stops counting it now, not
        at the next heartbeat (short requests would otherwise pile up there: DecodeBacklog.forget_request)."""
        now = self._advance(now_ms)
        self._decode.forget_request(request_id)
        self._window(model, now).record_outcome(now, num_output_tokens, num_on_time_tokens)
        return []

    def on_cancel(self, now_ms: float, request_id: str) -> list[Effect]:
        """The client went away: forget the request wherever it is (the worker gets the cancel too)."""
        now = self._advance(now_ms)
        model = self._queued_model.pop(request_id, None)
        if model is not None:
            del self._queues[model][request_id]
            return []
        inflight = self._inflight.pop(request_id, None)
        if inflight is None:
            return []
        ledger = self._view.existing_ledger(inflight.instance_id)
        if ledger is not None:
            ledger.remove(now, request_id)
        self._decode.forget_request(request_id)
        return self._dispatch(now, inflight.job.request.model)

    def on_instance_lost(self, now_ms: float, instance_id: str) -> list[Effect]:
        """The instance died (heartbeat timeout, lifecycle FAILED): what it held before the first token goes back to
        the queue. Requests past their first token are not tracked here; the shell fails those."""
        now = self._advance(now_ms)
        effects = self._lose_instance(now, instance_id, is_ban=True, is_failure=True)
        record = self._view.record(instance_id)
        models = [record.model] if record is not None else list(self._queues)
        for model in models:
            effects += self._dispatch(now, model)
        return effects

    def on_tick(self, now_ms: float) -> list[Effect]:
        """Time passed (the shell calls this at next_wakeup_ms): run rounds that are due, publish load windows."""
        now = self._advance(now_ms)
        effects: list[Effect] = []
        for model in list(self._queues):
            effects += self._dispatch(now, model)
        if self._next_publish_ms is not None and now >= self._next_publish_ms:
            for model in sorted(self._windows):
                depth = len(self._queues.get(model, ()))
                effects.append(PublishLoad(self._windows[model].snapshot(now, depth, self._dispatcher_id)))
            period = self.policy.publish_period_ms
            self._next_publish_ms += period * ((now - self._next_publish_ms) // period + 1)
        return effects

    def next_wakeup_ms(self) -> float | None:
        """When on_tick should next be called: about lookahead_ms before an instance with queued work ahead of it
        frees up, when a late request turns hopeless, when a request waiting for a model's first ready instance has
        waited max_wait_for_instance_ms, or at the next load-window publication."""
        times: list[float] = []
        if self._next_publish_ms is not None:
            times.append(self._next_publish_ms)
        is_lst_imh = self.policy.algorithm == Algorithm.LST_IMH
        max_wait_ms = self.policy.max_wait_for_instance_ms
        for model, queue in self._queues.items():
            if not queue:
                continue
            instances = self._view.prefill_instances(model)
            if not instances and max_wait_ms > 0:
                times.append(min(job.request.arrival_ms for job in queue.values()) + max_wait_ms)
            if not is_lst_imh:
                continue
            lookahead_ms, now_ms = self.policy.lookahead_ms, self._now_ms
            times.append(min((wake_ms for led in self._view.prefill_ledgers(model)
                              if (wake_ms := led.epdt_ms - lookahead_ms) > now_ms), default=inf))
            times.extend(job.hopeless_at_ms for job in queue.values() if job.is_late and job.hopeless_at_ms < inf)
        earliest_ms = min(times, default=inf)
        return None if earliest_ms == inf else earliest_ms

    # ------------------------------------------------------------------ views (for the shell, tests, the simulator)

    @property
    def reads_colocated_backlog(self) -> bool:
        """Whether co-located instances' backlogs matter: only LST-IMH reads them (to break ties); the baselines
        ignore their heartbeat lines, and a caller may leave them out."""
        return self.policy.algorithm == Algorithm.LST_IMH

    def routable_models(self) -> list[str]:
        """Models a new request can be routed for now: at least one routable instance takes its prefill (and, for a
        prefill instance, a routable decode instance takes the hand-over). Sorted; what `/ready` waits for."""
        return sorted(m for m in self._view.models() if self._view.prefill_instances(m))

    def queue_depth(self, model: str) -> int:
        return len(self._queues.get(model, ()))

    def epdt_ms(self, instance_id: str) -> float | None:
        ledger = self._view.existing_ledger(instance_id)
        return None if ledger is None else ledger.epdt_ms

    def outstanding(self, instance_id: str) -> list[str]:
        """Requests sent to the instance whose first token has not been reported, in assignment order."""
        ledger = self._view.existing_ledger(instance_id)
        return [] if ledger is None else ledger.outstanding_ids()

    def pending_prefill_ms(self, instance_id: str) -> float:
        ledger = self._view.existing_ledger(instance_id)
        return 0.0 if ledger is None else ledger.pending_ms

    def queued_ids(self, model: str) -> list[str]:
        return list(self._queues.get(model, ()))

    def inflight_ids(self) -> list[str]:
        return list(self._inflight)

    def unconfirmed(self, now_ms: float, *, max_num_per_worker: int) -> dict[str, list[tuple[str, str]]]:
        """Per worker, the (request id, instance id) pairs assigned there at least `confirm_assignment_after_ms` ago
        and never reported by a PrefillDone, oldest first: what the shell asks the worker about (HoldsQuery)."""
        oldest_ms = now_ms - self.policy.confirm_assignment_after_ms
        out: dict[str, list[tuple[str, str]]] = {}
        # a scan, not an early stop at the first young one: a re-assignment that kept its key's place would hide the
        # older ones behind it, and this runs once a second over what has no first token yet
        for request_id, inflight in self._inflight.items():
            if inflight.assigned_ms > oldest_ms:
                continue
            ids = out.setdefault(inflight.worker_id, [])
            if len(ids) < max_num_per_worker:
                ids.append((request_id, inflight.instance_id))
        return out

    # ------------------------------------------------------------------ internals

    def _advance(self, now_ms: float) -> float:
        # One monotone clock: a wall clock stepping back a little must not reorder EPDTs and deadlines.
        if not isfinite(now_ms):  # math, not numpy: this runs on every event
            raise ValueError(f"now_ms must be a finite number, got {now_ms!r}")
        self._now_ms = max(self._now_ms, float(now_ms))
        if self._next_publish_ms is None:
            self._next_publish_ms = self._now_ms + self.policy.publish_period_ms
        return self._now_ms

    def _window(self, model: str, now: float) -> LoadWindow:
        window = self._windows.get(model)
        if window is None:
            window = self._windows[model] = LoadWindow(model, self.policy.window_s, now)
        return window

    def _lose_instance(self, now: float, instance_id: str, is_ban: bool, is_failure: bool) -> list[Effect]:
        effects: list[Effect] = []
        self._decode.forget_instance(instance_id)
        self._mover.forget(instance_id)
        self._prefixes.forget(instance_id)  # slept, reloaded or gone: its prefix cache went with it
        for request_id in self._view.mark_lost(now, instance_id, is_ban):
            inflight = self._inflight.pop(request_id, None)
            if inflight is not None:
                effects += self._retry(now, inflight.job, instance_id, is_instance_failure=is_failure)
        return effects

    def _retry(self, now: float, job: Job, instance_id: str, *, is_instance_failure: bool) -> list[Effect]:
        if is_instance_failure:
            job.failed_on = note_instance_failure(job.failed_on, instance_id)
            if is_poison(job.failed_on):
                return [self._reject(now, job, ErrorCode.POISON_REQUEST,
                                     poison_message(job.request_id, job.failed_on), retryable=False)]
        job.attempt += 1
        model = job.request.model
        if job.attempt >= self.policy.max_num_attempts:
            return [self._reject(now, job, ErrorCode.INSTANCE_FAILED, f"instance {instance_id} failed before the "
                                 f"first token on each of {job.attempt} attempts", retryable=True)]
        self._enqueue(job)
        return [Requeued(job.request.request_id, model, instance_id, job.attempt)]

    def _enqueue(self, job: Job) -> None:
        self._queues.setdefault(job.request.model, {})[job.request_id] = job
        self._queued_model[job.request_id] = job.request.model

    def _dequeue(self, queue: dict[str, Job], job: Job) -> None:
        del queue[job.request_id]
        del self._queued_model[job.request_id]

    def _reject(self, now: float, job: Job, code: ErrorCode, reason: str, retryable: bool) -> Reject:
        self._window(job.request.model, now).record_rejection(now, job.request.expected_output_tokens)
        return Reject(job.request.request_id, job.request.model, code, reason, retryable, job.request)

    def _assign(self, now: float, job: Job, record: InstanceRecord, predicted_ms: float) -> Assign:
        request = job.request
        done_ms = self._view.ledger(record.instance_id).assign(now, request.request_id, predicted_ms)
        self._prefixes.record(record.instance_id, job.prefix_keys)
        self._inflight[request.request_id] = _InFlight(job, record.instance_id, record.worker_id, now)
        decode = None
        if record.role == InstanceRole.COLOCATED:
            if self.reads_colocated_backlog:
                self._decode.record_sent(record.instance_id, request.request_id)  # it decodes where it prefills
        elif record.role == InstanceRole.PREFILL:
            decode = self._decode.choose(self._view.decode_instances(request.model))
            if decode is not None:
                self._decode.record_sent(decode.instance_id, request.request_id)
        return Assign(
            request_id=request.request_id,
            model=request.model,
            instance_id=record.instance_id,
            worker_id=record.worker_id,
            predicted_prefill_ms=predicted_ms,
            expected_done_ms=done_ms,
            ttft_deadline_ms=job.deadline_ms,
            is_late=job.is_late,
            attempt=job.attempt,
            request=request,
            decode_instance_id=None if decode is None else decode.instance_id,
            decode_worker_id=None if decode is None else decode.worker_id,
        )

    def _dispatch(self, now: float, model: str) -> list[Effect]:
        queue = self._queues.get(model)
        if not queue:
            return []
        instances = self._view.prefill_instances(model)
        if not instances:
            jobs = list(queue.values())
            max_wait_ms = self.policy.max_wait_for_instance_ms
            if max_wait_ms > 0:
                # wait for an instance to come up (next_wakeup_ms fires when the first of these has waited enough)
                jobs = [job for job in jobs if job.request.arrival_ms + max_wait_ms <= now]
            for job in jobs:
                self._dequeue(queue, job)
            effects: list[Effect] = [
                self._reject(now, job, ErrorCode.NO_INSTANCE, f"model {model!r} has no ready instance", True)
                for job in jobs
            ]
            if queue:
                self._waiting_for_instance[model] = set(queue)
                if self.policy.is_wake_published_at_once and model not in self._wake_published:
                    # the scaler learns of the wait now, not at the next publication (ElasticScaler.wake)
                    self._wake_published.add(model)
                    effects.append(PublishLoad(self._window(model, now).snapshot(now, len(queue),
                                                                                 self._dispatcher_id)))
            else:
                self._wake_published.discard(model)  # nobody waits now: the next request wakes it again
            return effects
        self._wake_published.discard(model)
        if self._waiting_for_instance.get(model):
            self._rebase_waiting(now, model, queue)
        if self.policy.algorithm == Algorithm.LST_IMH:
            return self._dispatch_lst_imh(now, model, queue, instances)
        return self._dispatch_baseline(now, model, queue, instances)

    def _rebase_waiting(self, now: float, model: str, queue: dict[str, Job]) -> None:
        """The model has a routable instance again: the requests that waited for one get their TTFT SLO (and their
        relaxations) counted from now. The wait was for an instance, not for capacity: without this, a request that
        waited longer than its SLO and relaxations (1 + max_num_relaxations SLOs: 6 s at a 2 s SLO, less than a cold
        load) was refused as overloaded by the idle instance it had waited for, although max_wait_for_instance_ms
        promised it service. Plans see it as arriving now; its attainment still counts against its own deadline
        (on_prefill_done reads the request's, not the plan's)."""
        for request_id in self._waiting_for_instance.pop(model):
            job = queue.get(request_id)
            if job is None:
                continue  # cancelled meanwhile
            rebased_ms = now + job.request.ttft_slo_ms
            if rebased_ms > job.deadline_ms:
                job.deadline_ms, job.num_relaxations, job.hopeless_at_ms = rebased_ms, 0, float("inf")

    def _dispatch_lst_imh(
        self, now: float, model: str, queue: dict[str, Job], instances: list[InstanceRecord]
    ) -> list[Effect]:
        ledgers = self._view.prefill_ledgers(model)
        if self._view.has_colocated(model):
            # LST-IMH breaks ties between equally free instances by position: put the least decode backlog first,
            # so that a co-located model's decoding spreads over its instances instead of piling on the first one
            # (docs/dispatcher.md: on 60 co-located instances, token attainment 0.885 -> 0.9999)
            # (prefill_instances come sorted by id, and the sort is stable: ties stay in id order)
            backlog = self._decode.backlog
            order = sorted(range(len(instances)), key=lambda i: backlog(instances[i].instance_id))
            instances = [instances[i] for i in order]
            ledgers = [ledgers[i] for i in order]
        available_ms = [max(now, led.epdt_ms) for led in ledgers]  # PrefillLedger.available_ms
        if self._can_defer_round(now, queue, available_ms):
            return []
        jobs = list(queue.values())
        num_prompt_tokens = np.fromiter((j.request.num_prompt_tokens for j in jobs), np.float64, len(jobs))
        cached = [self._cached_tokens(job) for job in jobs]  # per job: instance -> tokens it holds
        rows = self._proc_rows(instances, num_prompt_tokens)
        affinity = None
        if any(cached):
            cached = self._may_take_more(model, cached)
        if any(cached):
            position = {record.instance_id: i for i, record in enumerate(instances)}
            rows = self._uncached_rows(instances, position, num_prompt_tokens, rows, cached)
            affinity = Affinity({k: {position[h]: n for h, n in hits.items() if h in position}
                                 for k, hits in enumerate(cached) if hits})
        decision = plan_round(now, jobs, available_ms, rows, self.policy, affinity)
        effects: list[Effect] = []
        for k, (deadline_ms, num_relaxations) in decision.relaxed.items():
            job = jobs[k]
            job.deadline_ms, job.num_relaxations, job.is_late = deadline_ms, num_relaxations, True
            effects.append(Relaxed(job.request_id, model, deadline_ms, num_relaxations))
        for k, hopeless_ms in decision.hopeless_at_ms.items():
            jobs[k].hopeless_at_ms = hopeless_ms
        earliest_ms = min(available_ms) - now
        for k in decision.rejected:
            job = jobs[k]
            self._dequeue(queue, job)
            effects.append(
                self._reject(
                    now,
                    job,
                    ErrorCode.OVERLOADED,
                    f"no ready instance of {model!r} can finish the prefill by the TTFT deadline "
                    f"({len(instances)} instances, earliest free in {earliest_ms:.0f} ms, {len(jobs)} queued)",
                    retryable=True,
                )
            )
        for i, k, predicted_ms in decision.commits:
            job = jobs[k]
            self._dequeue(queue, job)
            effects.append(self._assign(now, job, instances[i], predicted_ms))
        return effects

    def _proc_rows(self, instances: Sequence[InstanceRecord], num_prompt_tokens: np.ndarray) -> list[list[float]]:
        """p_ij for every instance and queued job, one list per instance. A predictor with `predict_rows_ms` answers
        for all of a model's instances at once, one shared row when they are alike (PrefillTimeModel): rounds of
        models with hundreds of instances run on every arrival, and the planner sorts a shared row once."""
        predict_rows = getattr(self._prefill_time, "predict_rows_ms", None)
        if predict_rows is not None:
            rows = np.asarray(predict_rows(instances, num_prompt_tokens), dtype=np.float64)
            if rows.shape == (1, len(num_prompt_tokens)):
                return [rows[0].tolist()] * len(instances)
            return shared_rows(np.broadcast_to(rows, (len(instances), len(num_prompt_tokens))))
        predict = self._prefill_time.predict_many_ms
        return shared_rows(np.array([predict(record, num_prompt_tokens) for record in instances],
                                    dtype=np.float64).reshape(len(instances), len(num_prompt_tokens)))

    def _cached_tokens(self, job: Job) -> dict[str, int]:
        """The prompt tokens each instance holds of the job's prompt, looked up again only when what those
        instances hold changed (every round asks for every queued job)."""
        if not job.prefix_keys:
            return {}
        stamp = self._prefixes.stamp(job.prefix_keys)
        if not stamp:
            return {}
        if job.cached[0] != stamp:
            job.cached = (stamp, self._prefixes.cached_tokens(job.prefix_keys))
        return job.cached[1]

    def _may_take_more(self, model: str, cached: list[dict[str, int]]) -> list[dict[str, int]]:
        """The holders a round may favour: a co-located instance is favoured for at most as many of the queued jobs
        (in queue order) as keep it within `prefix_max_decode_gap` sequences of the least busy instance's decode
        backlog; past that it counts as holding nothing for the others (their p_ij the whole prompt's). Else a
        prefix every request shares, a system prompt, makes its first holder look nearly free to LST-IMH for every
        request, and the model's decoding piles up there; past the gap another instance takes a request and holds
        the prefix too."""
        if not self._view.has_colocated(model):
            return cached
        backlog = self._decode.backlog
        least = min(backlog(r.instance_id) for r in self._view.prefill_instances(model))
        room = {}  # holder -> jobs it may still be favoured for
        out = []
        for hits in cached:
            kept = {}
            for h, n in hits.items():
                left = room.get(h)
                if left is None:
                    left = room[h] = least + self.policy.prefix_max_decode_gap - backlog(h) + 1
                if left > 0:
                    kept[h] = n
                    room[h] = left - 1
            out.append(kept)
        return out

    def _uncached_rows(self, instances: Sequence[InstanceRecord], position: dict[str, int],
                       num_prompt_tokens: np.ndarray, rows: list[list[float]],
                       cached: list[dict[str, int]]) -> list[list[float]]:
        """The rows of instances holding some queued prompt's prefix, those entries predicted on the tokens the
        instance would compute (a request has one or two holders: entries, not whole rows, are predicted again).
        `position`: instance id -> index in `instances`."""
        rows = list(rows)
        copied: set[int] = set()
        predict = self._prefill_time.predict_ms
        for k, hits in enumerate(cached):
            for instance_id, num_cached in hits.items():
                i = position.get(instance_id)
                if i is None:
                    continue
                if i not in copied:
                    rows[i] = list(rows[i])  # alike instances share one row: this one now differs
                    copied.add(i)
                # the keys cover all but the last token: at least one is computed
                rows[i][k] = float(predict(instances[i], int(num_prompt_tokens[k]) - num_cached))
        return rows

    def _can_defer_round(self, now: float, queue: dict[str, Job], available_ms: list[float]) -> bool:
        """Nothing to commit yet: every instance is busy beyond the lookahead, and no late request has turned
        hopeless. The round then waits for next_wakeup_ms (an instance coming near free) with the same EPDTs, so
        it plans the same jobs plus whatever arrives meanwhile. Only under requeue, where a round's relaxations
        stay inside the dispatcher; a rejection must reach the client at once."""
        policy = self.policy
        if not (policy.defers_rounds_until_near and policy.is_late_binding
                and policy.overload == OverloadPolicy.REQUEUE):
            return False
        if min(available_ms) <= now + policy.lookahead_ms:
            return False
        return not any(job.is_late and job.hopeless_at_ms <= now for job in queue.values())

    def _least_load_index(self, model: str) -> LeastLoadIndex:
        """The model's least-load order, rebuilt when its routable set changes."""
        ledgers = self._view.prefill_ledgers(model)
        index = self._least_load.get(model)
        if index is None or index.ledgers is not ledgers:
            if index is not None:
                index.close()
            index = self._least_load[model] = LeastLoadIndex(ledgers)
        return index

    def _dispatch_baseline(
        self, now: float, model: str, queue: dict[str, Job], instances: list[InstanceRecord]
    ) -> list[Effect]:
        """Round-robin and least-load: deadline-blind, every request goes out at once, nothing is rejected late."""
        effects: list[Effect] = []
        is_round_robin = self.policy.algorithm == Algorithm.ROUND_ROBIN
        least_load = None if is_round_robin else self._least_load_index(model)
        for job in sorted(queue.values(), key=lambda j: (j.request.arrival_ms, j.request_id)):
            if least_load is None:
                cursor = self._rr_cursor.get(model, 0)
                chosen = cursor % len(instances)
                self._rr_cursor[model] = cursor + 1
            else:
                chosen = least_load.choose(now)  # the assignment below tells the index of its ledger's change
            record = instances[chosen]
            predicted_ms = float(self._prefill_time.predict_ms(record, job.request.num_prompt_tokens))
            self._dequeue(queue, job)
            effects.append(self._assign(now, job, record, predicted_ms))
        return effects

"""The dispatcher service: a thin shell around dispatcher.core.DispatcherCore.

In: submissions (janus.req.<model>, queue group), the `instances` registry (KV watch), prefill completions, request
outcomes, worker heartbeats, cancellations. Out: RunAssignments to workers, typed refusals, per-model load windows.
The core decides; this file only moves messages and keeps the clock (wall-clock Unix ms, the one clock of every
service).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from opentelemetry.trace import SpanKind

from contracts import (
    CancelRequest,
    DispatcherHeartbeat,
    ErrorCode,
    ErrorInfo,
    GenerateRequest,
    HoldsQuery,
    HoldsReply,
    InstanceRecord,
    KVTarget,
    ModelState,
    MoveDecodes,
    MoveDecodesAck,
    PrefillDone,
    RequestFailed,
    RequestOutcome,
    RunAssignment,
    SubmitAck,
    WorkerHeartbeat,
    subjects,
)
from contracts.worker import MAX_NUM_HOLDS_IDS
from runtime import tracing
from runtime.bus import Bus, BusError, Envelope
from runtime.jetstream import instances_bucket, watch_all
from runtime.liveness import PeerLiveness
from runtime.service import Service, cancel_and_wait
from runtime.settings import ClusterConfig, JanusSettings

from .core.core import DispatcherCore
from .core.effects import Assign, Effect, MoveDecodes as MoveOrder, PublishLoad, Reject, Relaxed, Requeued
from .core.policy import DispatchPolicy
from .core.prefill_time import ThroughputPrefillModel
from .core.record_truth import corrected_by_heartbeat
from .core.streaming import StreamingBook
from .metrics import (
    ASSIGNED,
    DECODES_MOVED,
    QUEUE_DEPTH,
    QUEUE_TIME_S,
    REJECTED,
    REQUEST_RATE,
    REQUEUED,
    TOKEN_ATTAINMENT,
    TTFT_ATTAINMENT,
)

log = logging.getLogger("janus.dispatcher")

# a worker silent for this long is dead: its instances are lost (requests before the first token are re-dispatched)
WORKER_TIMEOUT_S = 2.0
# until an instance has measured its prefill speed, assume this (tokens/s); the heartbeat corrects it
DEFAULT_PREFILL_TOKENS_PER_S = 2000.0
HEARTBEAT_PERIOD_S = 0.5
# how often a held assignment checks whether its worker was heard since our reconnect (heartbeats come every 0.5 s)
DEFERRED_ASSIGN_POLL_S = 0.02
# the timer wakes at least this often (sooner when the core asks for it)
TIMER_PERIOD_S = 0.25
# streaming requests older than the gateway's timeout are forgotten this often (nothing else reports their end)
STREAMING_EXPIRY_PERIOD_S = 5.0
CONFIRM_PERIOD_S = 1.0  # how often long-unconfirmed assignments are checked (confirm_assignment_after_ms)
CONFIRM_TIMEOUT_S = 2.0


def now_ms() -> float:
    return time.time() * 1000.0


class DispatcherService(Service):
    name = "dispatcher"

    def __init__(self, settings: JanusSettings, cluster: ClusterConfig) -> None:
        super().__init__(settings, cluster)
        self.policy = DispatchPolicy(**cluster.dispatcher)
        self.core = DispatcherCore(self.policy, ThroughputPrefillModel(DEFAULT_PREFILL_TOKENS_PER_S),
                                   dispatcher_id=settings.instance)
        self.models = {m.name for m in cluster.models}
        self._requests: dict[str, GenerateRequest] = {}
        self._queued_since_s: dict[str, float] = {}  # request id -> when it (re)entered the queue, monotonic s
        # past the first token, by the instance streaming each: failed by us if that instance dies
        self._streaming = StreamingBook()
        self._next_expiry_s = 0.0
        self._records: dict[str, InstanceRecord] = {}
        self._failed_keys: set[str] = set()  # records that say FAILED: a heartbeat may prove them stale
        self._workers = PeerLiveness(timeout_s=WORKER_TIMEOUT_S, check_period_s=TIMER_PERIOD_S)
        self._dead_workers: set[str] = set()
        # the NATS connection (_connection_number) on which each worker was last heard: see _publish_when_heard
        self._heard_on_connection: dict[str, int] = {}
        self._deferred: set[asyncio.Task] = set()
        self._kick = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._watcher = None
        self._tracer = tracing.tracer("janus.dispatcher")
        self.num_received = 0
        self.num_assigned = 0
        self.num_rejected = 0
        self.num_decodes_moved = 0  # running decodes off draining instances whose move started

    async def start(self, bus: Bus) -> None:
        kv = await instances_bucket(bus.js, self.cluster)
        self._watcher = await watch_all(kv)
        self._tasks.append(asyncio.create_task(self._watch_registry()))
        await bus.serve(subjects.REQ_WILDCARD, GenerateRequest, self._on_request, queue=subjects.DISPATCH_QUEUE)
        await bus.subscribe(subjects.PREFILL_DONE, PrefillDone, self._on_prefill_done, traced=False)
        await bus.subscribe(subjects.REQUEST_OUTCOME, RequestOutcome, self._on_request_outcome, traced=False)
        await bus.subscribe(subjects.CANCEL, CancelRequest, self._on_cancel, traced=False)
        await bus.subscribe(subjects.WORKER_TELEMETRY_WILDCARD, WorkerHeartbeat, self._on_heartbeat, traced=False)
        self._tasks.append(asyncio.create_task(self._timer()))
        self._tasks.append(asyncio.create_task(self._heartbeat_forever()))
        self._tasks.append(asyncio.create_task(self._confirm_assignments_forever()))

    async def stop(self) -> None:
        # a KV watcher left running makes drain() hang for 30 s
        if self._watcher is not None:
            with contextlib.suppress(Exception):
                await self._watcher.stop()
        await cancel_and_wait(*self._tasks, *self._deferred, what="dispatcher")

    # --- inputs ---
    async def _on_request(self, req: GenerateRequest, env: Envelope) -> SubmitAck:
        self.num_received += 1
        if req.model not in self.models:
            raise BusError.of(ErrorCode.UNKNOWN_MODEL, f"model {req.model} is not served by this cluster")
        self._requests[req.request_id] = req
        self._queued_since_s[req.request_id] = time.monotonic()
        effects = self.core.on_request(now_ms(), req)
        own = next((e for e in effects if isinstance(e, Reject) and e.request_id == req.request_id), None)
        await self._apply([e for e in effects if e is not own])
        self._kick.set()
        if own is not None:
            self._requests.pop(req.request_id, None)
            self._queued_since_s.pop(req.request_id, None)
            self.num_rejected += 1
            REJECTED.labels(own.model, own.code.value).inc()
            return SubmitAck(request_id=req.request_id, status="rejected", error=own.error_info(),
                             dispatcher_id=self.instance)
        return SubmitAck(request_id=req.request_id, status="queued", queue_depth=self.core.queue_depth(req.model),
                         dispatcher_id=self.instance)

    async def _on_prefill_done(self, done: PrefillDone, env: Envelope) -> None:
        if done.handed_over_to_instance_id:
            # a P/D hand-over notice: the decode instance streams it now (the prefill itself was reported before)
            self._streaming.handed_over(done.request_id, done.handed_over_to_instance_id)
            return
        req = self._requests.get(done.request_id)
        effects = self.core.on_prefill_done(now_ms(), done.instance_id, done.request_id, ok=done.ok,
                                            first_token_ms=done.first_token_unix_ms, failure=done.failure)
        if done.ok and req is not None:
            self._requests.pop(done.request_id, None)
            self._streaming.started(req, done.instance_id)
        elif done.failure == "request_failed":
            self._requests.pop(done.request_id, None)  # it ended on the worker, with its own error
        await self._apply(effects)
        self._kick.set()

    async def _on_request_outcome(self, outcome: RequestOutcome, env: Envelope) -> None:
        """A request finished on its worker. Every dispatcher hears it; only the one that dispatched it (it holds
        the stream in its book) counts it, so that each request's tokens enter one load window, as its arrival did.
        Its stream ended: nothing is left for this dispatcher to fail if the instance dies now. Heard before its
        first token (another subscription's task), it still counts, and its first token will not start a stream."""
        if not self._streaming.ended(outcome.request_id, self._requests.get(outcome.request_id)):
            return
        await self._apply(self.core.on_request_outcome(now_ms(), outcome.request_id, outcome.model,
                                                       outcome.num_output_tokens, outcome.num_on_time_tokens))

    async def _on_cancel(self, cancel: CancelRequest, env: Envelope) -> None:
        self._requests.pop(cancel.request_id, None)
        self._queued_since_s.pop(cancel.request_id, None)
        self._streaming.forget(cancel.request_id)
        await self._apply(self.core.on_cancel(now_ms(), cancel.request_id))

    async def _on_heartbeat(self, hb: WorkerHeartbeat, env: Envelope) -> None:
        self._workers.heard(hb.worker_id, time.monotonic())
        self._heard_on_connection[hb.worker_id] = self._connection_number()
        is_changed = False
        if self._failed_keys:
            # a reconciler took the worker for dead, wrongly: its own heartbeat says otherwise (record_truth.py)
            corrected = corrected_by_heartbeat({key: self._records[key] for key in self._failed_keys}, hb)
            if corrected:
                log.warning("registry says %s FAILED, but %s's heartbeat reports it ACTIVE: routing to it again",
                            ", ".join(r.instance_id for r in corrected.values()), hb.worker_id)
                for key, record in corrected.items():
                    self._set_record(key, record)
                is_changed = True
        if hb.worker_id in self._dead_workers:
            # back from the dead (a partition or a NATS restart): the heartbeat is fresher evidence than the
            # registry record, and a record newer than the loss is what lifts the core's ban on the instance
            self._dead_workers.discard(hb.worker_id)
            active = {st.instance_id for st in hb.instances if st.state == ModelState.ACTIVE}
            for key, record in list(self._records.items()):
                if record.worker_id == hb.worker_id and record.instance_id in active:
                    self._set_record(key, record.model_copy(update={"updated_unix_ms": hb.sent_unix_ms}))
            is_changed = True
        if is_changed:
            await self._apply(self.core.on_instances(now_ms(), self._live_records()))
            self._kick.set()
        await self._apply(self.core.on_heartbeat(now_ms(), hb))

    def _set_record(self, key: str, record: InstanceRecord | None) -> None:
        if record is None:
            self._records.pop(key, None)
        else:
            self._records[key] = record
        if record is not None and record.state == ModelState.FAILED:
            self._failed_keys.add(key)
        else:
            self._failed_keys.discard(key)

    async def _watch_registry(self) -> None:
        async for entry in self._watcher:
            if entry is None:  # end of the initial snapshot
                await self._apply(self.core.on_instances(now_ms(), self._live_records()))
                continue
            key = entry.key
            if entry.operation in ("DEL", "PURGE") or not entry.value:
                self._set_record(key, None)
            else:
                try:
                    record = InstanceRecord.model_validate_json(entry.value)
                except ValueError:
                    log.warning("malformed registry record %s", key)
                    continue
                self._set_record(key, record)
                self._workers.know(record.worker_id, time.monotonic())
            await self._apply(self.core.on_instances(now_ms(), self._live_records()))
            self._kick.set()

    def _live_records(self) -> list[InstanceRecord]:
        return [r for r in self._records.values() if r.worker_id not in self._dead_workers]

    async def _heartbeat_forever(self) -> None:
        """Gateways watch this: what a silent dispatcher held before its first token is submitted again."""
        while True:
            beat = DispatcherHeartbeat(dispatcher_id=self.instance, sent_unix_ms=now_ms(),
                                       num_queued=len(self._requests),
                                       routable_models=tuple(self.core.routable_models()))
            with contextlib.suppress(Exception):
                await self.bus.publish(subjects.dispatcher_telemetry(self.instance), beat, propagate=False)
            await asyncio.sleep(HEARTBEAT_PERIOD_S)

    # --- time ---
    async def _timer(self) -> None:
        while True:
            wake = self.core.next_wakeup_ms()
            delay_s = TIMER_PERIOD_S if wake is None else min(TIMER_PERIOD_S, max(0.0, (wake - now_ms()) / 1000.0))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._kick.wait(), delay_s)
            self._kick.clear()
            try:
                await self._check_workers()
                self._expire_streaming()
                await self._apply(self.core.on_tick(now_ms()))
            except Exception:  # noqa: BLE001 - the dispatcher must keep dispatching
                log.exception("dispatcher tick failed")

    async def _check_workers(self) -> None:
        # while we have no NATS connection (our node lost, reconnecting) workers' silence is ours, not theirs
        is_listening = self.bus is None or self.bus.nc.is_connected
        for worker_id, silent_s in self._workers.check(time.monotonic(), is_listening=is_listening).items():
            if worker_id in self._dead_workers:
                continue
            log.warning("worker %s silent for %.1f s: its instances are lost", worker_id, silent_s)
            self._dead_workers.add(worker_id)
            lost = [r.instance_id for r in self._records.values() if r.worker_id == worker_id]
            effects: list[Effect] = []
            for instance_id in lost:
                effects += self.core.on_instance_lost(now_ms(), instance_id)
            await self._apply(effects + self.core.on_instances(now_ms(), self._live_records()))
            await self._fail_streaming(set(lost))

    async def _confirm_assignments_forever(self) -> None:
        while True:
            await asyncio.sleep(CONFIRM_PERIOD_S)
            try:
                unconfirmed = self.core.unconfirmed(now_ms(), max_num_per_worker=MAX_NUM_HOLDS_IDS)
                await asyncio.gather(*(self._confirm_assignments(worker_id, pairs)
                                       for worker_id, pairs in unconfirmed.items()
                                       if worker_id not in self._dead_workers))
            except Exception:  # noqa: BLE001 - checked again next period
                log.exception("checking unconfirmed assignments failed")

    async def _confirm_assignments(self, worker_id: str, pairs: list[tuple[str, str]]) -> None:
        """Ask the worker which of these it holds (contracts.HoldsQuery). One it never received, or handed back
        with a notice we never got, goes back to the queue as a hand-back would; one it already streamed lost its
        PrefillDone, and is taken as started. Its silence is the watchdog's to judge (_check_workers)."""
        query = HoldsQuery(request_ids=tuple(request_id for request_id, _ in pairs))
        try:
            reply = await self.bus.request(subjects.worker_holds(worker_id), query, HoldsReply,
                                           timeout_s=CONFIRM_TIMEOUT_S)
        except BusError:
            return
        waiting, started = set(reply.waiting_ids), set(reply.started_ids)
        for request_id, instance_id in pairs:
            req = self._requests.get(request_id)
            if request_id in waiting or req is None:
                continue
            # its end heard already (its worker holds it no more): it ran, and must not run again
            has_ended = self._streaming.ended_before_first_token(request_id)
            is_started = request_id in started or has_ended
            why = ("finished, its PrefillDone not heard yet" if has_ended else "streaming, but its PrefillDone was lost"
                   if is_started else "its worker does not hold it (lost on the bus): back to the queue")
            log.warning("%s on %s: %s", request_id, instance_id, why)
            await self._on_prefill_done(PrefillDone(
                request_id=request_id, model=req.model, worker_id=worker_id, instance_id=instance_id,
                num_prompt_tokens=req.num_prompt_tokens, prefill_ms=0.0, first_token_unix_ms=now_ms(),
                ok=is_started, failure="handed_back"), None)

    async def _fail_streaming(self, instance_ids: set[str]) -> None:
        """Requests past their first token cannot move: their clients get a clear error."""
        for req, instance_id in self._streaming.lost(instance_ids):
            err = ErrorInfo(code=ErrorCode.INSTANCE_FAILED, retryable=False,
                            message=f"instance {instance_id} died after streaming had begun")
            await self.bus.publish(req.reply_subject, RequestFailed(request_id=req.request_id, seq=0, error=err),
                                   propagate=False)

    def _expire_streaming(self) -> None:
        """The dispatcher hears of a request's first token but not of its end: without this, every request that
        streamed would stay in the book until some worker died. The gateway has given up on requests this old."""
        if time.monotonic() < self._next_expiry_s:
            return
        self._next_expiry_s = time.monotonic() + STREAMING_EXPIRY_PERIOD_S
        self._streaming.expire(now_ms() - self.cluster.gateway.request_timeout_s * 1000.0)

    # --- outputs ---
    async def _apply(self, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, Assign):
                await self._assign(effect)
            elif isinstance(effect, Reject):
                await self._reject(effect)
            elif isinstance(effect, PublishLoad):
                window = effect.window
                QUEUE_DEPTH.labels(window.model).set(window.queue_depth)
                REQUEST_RATE.labels(window.model).set(window.request_rate_rps)
                if window.ttft_attainment is not None:
                    TTFT_ATTAINMENT.labels(window.model).set(window.ttft_attainment)
                if window.token_attainment is not None:
                    TOKEN_ATTAINMENT.labels(window.model).set(window.token_attainment)
                await self.bus.publish(subjects.model_telemetry(window.model), window, propagate=False)
            elif isinstance(effect, Requeued):
                REQUEUED.labels(effect.model).inc()
                if effect.request_id in self._requests:  # a new wait, not counting the failed attempt's
                    self._queued_since_s[effect.request_id] = time.monotonic()
                log.info("%s", effect)
            elif isinstance(effect, Relaxed):
                log.info("%s", effect)
            elif isinstance(effect, MoveOrder):
                self._deferred.add(task := asyncio.create_task(self._order_moves(effect)))
                task.add_done_callback(self._deferred.discard)

    async def _order_moves(self, order: MoveOrder) -> None:
        """Ask a draining decode instance's worker to move some of its decodes (worker/dataplane/move_flow.py)."""
        cmd = MoveDecodes(instance_id=order.instance_id, target_worker_id=order.target_worker_id,
                          target_instance_id=order.target_instance_id, max_requests=order.max_requests)
        try:
            ack = await self.bus.request(subjects.worker_move(order.worker_id), cmd, MoveDecodesAck, timeout_s=2.0)
        except BusError as exc:
            log.info("moves off %s refused: %s", order.instance_id, exc.error.message)
            return
        DECODES_MOVED.labels(order.model).inc(len(ack.request_ids))
        self.num_decodes_moved += len(ack.request_ids)

    async def _assign(self, a: Assign) -> None:
        queued_since_s = self._queued_since_s.pop(a.request_id, None)
        if queued_since_s is not None:
            QUEUE_TIME_S.labels(a.model).observe(time.monotonic() - queued_since_s)
        req = self._requests.get(a.request_id)
        if req is None:
            log.warning("assignment of unknown request %s dropped", a.request_id)
            return
        req = req.model_copy(update={"attempt": a.attempt, "is_late": a.is_late})
        self._requests[a.request_id] = req
        if a.decode_instance_id is not None and a.decode_worker_id is not None:
            # prefill/decode disaggregated: the prefill worker reserves blocks on the decode instance, writes the KV
            # cache there and hands the request over (docs/lifecycle.md); the target is resolved by the workers
            target = KVTarget(decode_worker_id=a.decode_worker_id, decode_instance_id=a.decode_instance_id)
            run = RunAssignment(request=req, instance_id=a.instance_id, phase="prefill", kv_target=target,
                                predicted_prefill_ms=a.predicted_prefill_ms, dispatched_unix_ms=now_ms(),
                                dispatcher_id=self.instance)
        else:
            run = RunAssignment(request=req, instance_id=a.instance_id, predicted_prefill_ms=a.predicted_prefill_ms,
                                dispatched_unix_ms=now_ms(), dispatcher_id=self.instance)
        ctx = tracing.context_from_traceparent(req.traceparent)
        with self._tracer.start_as_current_span("dispatcher assign", context=ctx, kind=SpanKind.PRODUCER) as span:
            span.set_attribute("janus.instance_id", a.instance_id)
            span.set_attribute("janus.predicted_prefill_ms", a.predicted_prefill_ms)
            if self._is_heard_since_reconnect(a.worker_id):
                await self.bus.publish(subjects.worker_run(a.worker_id), run)
            else:
                task = asyncio.create_task(self._publish_when_heard(a.worker_id, run))
                self._deferred.add(task)
                task.add_done_callback(self._deferred.discard)
        self.num_assigned += 1
        ASSIGNED.labels(a.model, str(a.is_late).lower()).inc()

    def _connection_number(self) -> int:
        """Counts our reconnects; nats-py counts one as soon as the server accepted CONNECT, before replaying our
        subscriptions, so no message can reach us on a new connection while this still names the old one."""
        return self.bus.nc.stats["reconnects"]

    def _is_heard_since_reconnect(self, worker_id: str) -> bool:
        if not self.bus.nc.is_connected:
            return False  # published now it would wait in the client's buffer and race the worker's reconnect
        heard_on = self._heard_on_connection.get(worker_id)
        return heard_on is None or heard_on >= self._connection_number()  # None: known from the registry only

    async def _publish_when_heard(self, worker_id: str, run: RunAssignment) -> None:
        """Right after our own reconnect (a NATS restart, our node lost) a worker's subscriptions may not be back on
        the server yet: its reconnect races ours by milliseconds, and core NATS drops a message nobody is subscribed
        to, silently. Such a lost assignment stayed outstanding in our ledger while its client waited for good, so
        hold it until the worker is heard on our new connection (its heartbeat then went out after its
        subscriptions were restored), or WORKER_TIMEOUT_S, when the watchdog decides about the worker anyway."""
        deadline_s = time.monotonic() + WORKER_TIMEOUT_S
        while not self._is_heard_since_reconnect(worker_id) and time.monotonic() < deadline_s:
            await asyncio.sleep(DEFERRED_ASSIGN_POLL_S)
        try:
            await self.bus.publish(subjects.worker_run(worker_id), run)
        except Exception:  # noqa: BLE001 - as if lost: the worker's death or the gateway's timeout ends the request
            log.warning("assignment of %s to %s not sent", run.request.request_id, worker_id, exc_info=True)

    async def _reject(self, r: Reject) -> None:
        req = self._requests.pop(r.request_id, None)
        self._queued_since_s.pop(r.request_id, None)
        self.num_rejected += 1
        REJECTED.labels(r.model, r.code.value).inc()
        if req is None:
            return
        await self.bus.publish(req.reply_subject, RequestFailed(request_id=r.request_id, seq=0,
                                                                 error=r.error_info()), propagate=False)

    def health_detail(self) -> dict[str, str]:
        return {"assigned": str(self.num_assigned), "rejected": str(self.num_rejected),
                "instances": str(len(self._records)), "queued": str(len(self._requests)),
                "streaming": str(len(self._streaming)), "decodes_moved": str(self.num_decodes_moved)}

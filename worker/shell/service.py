"""The worker service: one per device. Holds the device's page pool (xTensor) shared by every engine on it, the
Mooncake transfer engine, and the model instances with their lifecycle; runs the dispatcher's assignments (full,
prefill, decode), streams tokens straight to the gateway, answers lifecycle commands, heartbeats, and keeps its
registry records true.

The shell only moves messages: lifecycle decisions come from worker/core/lifecycle.py through
worker/lifecycle/controller.py, P/D hand-overs from worker/dataplane/pd_flow.py.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Awaitable

from opentelemetry.trace import SpanKind

from contracts import (
    CancelRequest,
    ErrorCode,
    ErrorInfo,
    HoldsQuery,
    MoveDecodes,
    InstanceRecord,
    InstanceRole,
    LifecycleAction,
    LifecycleCommand,
    LifecycleEvent,
    LifecycleReply,
    ModelState,
    Pool,
    PrefillDone,
    ResendRequest,
    RunAssignment,
    WorkerHeartbeat,
    subjects,
)
from runtime import tracing
from runtime.bus import Bus, BusError, Envelope
from runtime.catalog import max_model_len, model_dir
from runtime.jetstream import instances_bucket, kv_put
from runtime.service import Service, cancel_and_wait
from runtime.settings import ClusterConfig, JanusSettings

from .compactor import Compactor
from ..core.fencing import EpochFence
from ..core.lifecycle import drain_deadline_unix_ms, drain_decision
from ..core.stream_log import StreamLog
from ..core.streaming import Emission, RequestTrack, emissions_for, failure, request_failed_notice
from .engine_loop import EngineLoop
from .heartbeat import build_heartbeat, read_stats
from ..lifecycle.commands import CommandBook
from ..lifecycle.controller import LifecycleController
from ..lifecycle.instance import ModelInstance
from ..lifecycle.parking import SteppedEngine
from .metrics import observe_heartbeat, observe_prefix_cache, observe_transition
from ..dataplane.move_flow import DecodeMoveFlow
from ..dataplane.pd_flow import PrefillDecodeFlow
from .process_env import configure_worker_process
from ..dataplane.resend import ResendServer

log = logging.getLogger("janus.worker")

HEARTBEAT_PERIOD_S = 0.5
STOP_DRAIN_TIMEOUT_S = 30.0
RECORD_REFRESH_S = 5.0  # the worker is the truth about its instances: it re-asserts their records this often


class WorkerService(Service):
    name = "worker"

    def __init__(self, settings: JanusSettings, cluster: ClusterConfig, *, worker_id: str | None = None,
                 device: str | None = None) -> None:
        super().__init__(settings, cluster)
        self.worker_id = worker_id or settings.instance
        self.device = device or cluster.workers.device  # its own one (`janus up` gives each worker one)
        self.pages = None  # worker.xtensor.XTensor, opened in start()
        self.transfer = None  # worker.dataplane.transfer.MooncakeTransfer, or None where it cannot run
        self.lifecycle = LifecycleController(self.worker_id, self, self._make_instance, None,
                                             min_drain_s=cluster.workers.min_drain_s)
        self.commands = CommandBook()
        self.fence = EpochFence()  # the newest reconciler epoch seen: older commands are refused
        self.pd = PrefillDecodeFlow(self)
        self.moves = DecodeMoveFlow(self)
        self._tracks: dict[str, RequestTrack] = {}
        self.stream_log = StreamLog()  # what was streamed, for gateways that lost some of it (resend)
        self.resends = ResendServer(self)
        self._outputs: asyncio.Queue = asyncio.Queue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.compactor: Compactor | None = None  # over the page pool, once it is open
        self._engine_loop = EngineLoop(self._from_engine_thread, self._engine_failed,
                                       between_steps=self._between_steps)
        self._stepped: dict[str, SteppedEngine] = {}
        self._kv = None
        self._tasks: list[asyncio.Task] = []
        self._seq = 0
        self._tracer = tracing.tracer("janus.worker")

    @property
    def residents(self) -> dict[str, ModelInstance]:
        """Instances on this worker that are not cold, by instance id."""
        return self.lifecycle.instances

    # --- start / stop ---
    async def start(self, bus: Bus) -> None:
        self._loop = asyncio.get_running_loop()
        setup = configure_worker_process(self.device, self.settings.log_level,
                                         uses_torch=self.cluster.workers.engine == "torch")
        log.info("%s: torch threads %s, Mooncake logs at %s", self.worker_id, setup.num_torch_threads or "default",
                 setup.mooncake_log_level)
        self._open_device()
        # created with the cluster's replicas if the worker is first: an R1 registry dies with its NATS node
        self._kv = await instances_bucket(bus.js, self.cluster)
        self._engine_loop.start()
        await bus.subscribe(subjects.worker_run(self.worker_id), RunAssignment, self._on_run)
        await bus.subscribe(subjects.CANCEL, CancelRequest, self._on_cancel, traced=False)
        await bus.subscribe(subjects.worker_cmd(self.worker_id), LifecycleCommand, self._on_command)
        await bus.serve(subjects.worker_resend(self.worker_id), ResendRequest, self.resends.answer)
        await bus.serve(subjects.worker_holds(self.worker_id), HoldsQuery, self.resends.holds)
        await bus.serve(subjects.worker_move(self.worker_id), MoveDecodes, self.moves.on_move)
        self._tasks.append(asyncio.create_task(self._publish_outputs()))
        # alive from the first moment: loading takes seconds, and a silent worker with records is a dead one
        self._tasks.append(asyncio.create_task(self._heartbeat_forever()))
        self._tasks.append(asyncio.create_task(self._refresh_records_forever()))
        for model in self._bootstrap_models():
            await self.activate(model, f"{self.worker_id}/{model}")

    def _open_device(self) -> None:
        from ..xtensor import XTensor, XTensorConfig

        workers = self.cluster.workers
        config = XTensorConfig(page_size_bytes=workers.page_size_bytes)
        self.pages = XTensor.open(self.device, workers.pool_bytes, config)
        self.compactor = Compactor(self.pages)
        try:
            from ..dataplane.transfer import MooncakeTransfer, TransferError, transfer_settings

            self.transfer = MooncakeTransfer.start(transfer_settings(self.settings.nats_url))
            region = self.pages.global_region
            self.transfer.register(region.base_address, region.num_bytes)  # first: peers find it as our base
        except (ImportError, TransferError) as exc:
            log.warning("%s: no transfer engine (%s): no fork from or P/D to this worker", self.worker_id, exc)
            self.transfer = None
        self.lifecycle.transfer = self.transfer

    def _bootstrap_models(self) -> list[str]:
        placement = self.cluster.workers.placement
        if self.worker_id in placement:
            return list(placement[self.worker_id])
        return [m.name for m in self.cluster.models]

    async def stop(self) -> None:
        """Drain: leave the registry (no new work), finish or hand back what is in flight, then release."""
        for inst in list(self.residents.values()):
            if inst.state == ModelState.ACTIVE and not inst.lock.locked():
                event = inst.lifecycle.transition(ModelState.DRAINING, now_unix_ms=self.now_unix_ms(),
                                                  reason="worker stopping", via="drain")
                await self.on_transition(inst, event)
        draining = [i for i in self.residents.values() if i.state == ModelState.DRAINING]
        await asyncio.gather(*(self.drain(inst, STOP_DRAIN_TIMEOUT_S) for inst in draining), return_exceptions=True)
        for inst in list(self.residents.values()):
            try:  # a lifecycle operation still copying or loading must end before its pages go away
                await asyncio.wait_for(inst.lock.acquire(), STOP_DRAIN_TIMEOUT_S)
            except asyncio.TimeoutError:
                log.warning("%s: %s still busy at stop", self.worker_id, inst.instance_id)
            await self._delete_record(inst)
        self._engine_loop.stop()
        try:  # cancelled until they end: a heartbeat loop that outlived its worker would beat on forever
            await cancel_and_wait(*self._tasks, what=f"{self.worker_id} stopping")
        except TimeoutError:
            log.exception("%s: background tasks still running at stop", self.worker_id)
        if self.transfer is not None:
            self.transfer.close()
        if self.pages is not None:
            self.pages.close()

    # --- instances and their lifecycle ---
    async def activate(self, model: str, instance_id: str, role: InstanceRole = InstanceRole.COLOCATED,
                       pool: Pool = Pool.STEADY) -> ModelInstance:
        """Bring an instance up (bootstrap placement); raises BusError when it cannot be."""
        if self.cluster.model(model) is None:
            raise BusError.of(ErrorCode.UNKNOWN_MODEL, f"model {model} is not in the cluster config")
        cmd = LifecycleCommand(command_id=f"bootstrap-{instance_id}", worker_id=self.worker_id, model=model,
                               instance_id=instance_id, action=LifecycleAction.ACTIVATE, role=role, pool=pool,
                               issued_unix_ms=self.now_unix_ms())
        reply = await self.commands.submit(cmd, self.lifecycle.execute)
        if not reply.ok:
            raise BusError(reply.error or ErrorInfo(code=ErrorCode.INTERNAL, message=reply.detail))
        log.info("%s: %s active", self.worker_id, instance_id)
        return self.residents[instance_id]

    def _make_instance(self, cmd: LifecycleCommand) -> ModelInstance:
        spec = self.cluster.model(cmd.model)
        if spec is None:
            raise ValueError(f"model {cmd.model} is not in the cluster config")
        return ModelInstance(self.worker_id, cmd.model, cmd.instance_id, cmd.role, cmd.pool,
                             model_dir(spec, self.settings.models_dir), self.pages, self._build_engine)

    def _build_engine(self, path: Path, owner: str, load_weights: bool = True):
        if self.cluster.workers.engine == "echo":
            from ..engine.echo import EchoEngine

            return EchoEngine()
        from ..engine.engine import EngineConfig, LLMEngine

        # the gateway validates against the same max_model_len (runtime.catalog), so they agree by construction
        config = EngineConfig(max_num_seqs=self.cluster.workers.max_num_seqs, max_model_len=max_model_len(path))
        return LLMEngine(path, device=self.device, config=config, kv_source=self.pages, weight_source=self.pages,
                         owner=owner, load_weights=load_weights)

    async def _on_command(self, cmd: LifecycleCommand, env: Envelope) -> None:
        """Request/reply on janus.worker.<worker>.cmd; each command runs in its own task (one at a time per
        instance) so a long load does not hold up the others, and a repeat gets the first one's answer."""
        refusal = self.fence.admit(cmd.epoch, cmd.issued_by)  # a deposed reconciler's command (fencing)
        if refusal is None and self.is_stopping and cmd.command_id not in self.commands:
            message = f"{self.worker_id} is stopping"
            refusal = ErrorInfo(code=ErrorCode.UNAVAILABLE, message=message, retryable=True)
        if refusal is not None:
            if refusal.code == ErrorCode.STALE_EPOCH:
                log.warning("%s: %s", self.worker_id, refusal.message)
            inst = self.residents.get(cmd.instance_id)
            if env.reply:
                await self.bus.publish(env.reply, LifecycleReply(
                    command_id=cmd.command_id, instance_id=cmd.instance_id, ok=False,
                    state=inst.state if inst else ModelState.COLD, detail=refusal.message, error=refusal),
                    propagate=False)
            return
        task = self.commands.submit(cmd, self.lifecycle.execute)
        if env.reply:
            asyncio.create_task(self._answer(task, cmd, env.reply))

    async def _answer(self, task: asyncio.Task, cmd: LifecycleCommand, reply_subject: str) -> None:
        try:
            reply = await asyncio.wait_for(asyncio.shield(task), cmd.deadline_ms / 1e3)
        except asyncio.TimeoutError:
            inst = self.residents.get(cmd.instance_id)
            message = f"not done within {cmd.deadline_ms:.0f} ms; still running"
            reply = LifecycleReply(command_id=cmd.command_id, instance_id=cmd.instance_id, ok=False,
                                   state=inst.state if inst else ModelState.COLD, detail=message,
                                   error=ErrorInfo(code=ErrorCode.TIMEOUT, message=message, retryable=True))
        await self.bus.publish(reply_subject, reply, propagate=False)

    # LifecycleHost: what the controller asks of the shell
    def now_unix_ms(self) -> float:
        return time.time() * 1e3

    async def on_transition(self, inst: ModelInstance, event: LifecycleEvent) -> None:
        log.info("%s: %s %s -> %s%s%s", self.worker_id, inst.instance_id, event.from_state.value,
                 event.to_state.value, f" ({event.reason})" if event.reason else "",
                 f"; {len(inst.in_flight)} in flight" if inst.in_flight else "")
        # the record first: leaving ACTIVE must stop admissions before anything else happens
        if event.to_state == ModelState.COLD:
            await self._delete_record(inst)
        else:
            await self._put_record(inst)
        observe_transition(event)
        with contextlib.suppress(Exception):  # an event lost is not a reason to stop the transition
            await self.bus.publish(subjects.LIFECYCLE_EVENT, event, propagate=False)

    async def refresh_record(self, inst: ModelInstance) -> None:
        """Write the record again as it is: someone else (a reconciler that thought us dead) may have changed it."""
        await self._put_record(inst)

    def start_serving(self, inst: ModelInstance) -> None:
        if self.compactor is not None:
            self.compactor.reset(inst.owner)  # its segments were just recorded and are advertised
        stepped = SteppedEngine(inst.engine)
        self._stepped[inst.instance_id] = stepped
        self._engine_loop.add(inst.instance_id, stepped)

    def _between_steps(self, instance_id: str, stepped: SteppedEngine) -> None:
        """Engine-loop thread, after each turn of an instance's engine: compact its pages (bounded)."""
        inst = self.residents.get(instance_id)
        if inst is not None and self.compactor is not None:
            stepped.between_steps(lambda engine: self.compactor.between_steps(inst, engine))

    def stop_serving(self, inst: ModelInstance) -> None:
        stepped = self._stepped.pop(inst.instance_id, None)
        if stepped is not None:
            stepped.park()
        self._engine_loop.remove(inst.instance_id)

    async def drain(self, inst: ModelInstance, min_drain_s: float) -> dict[str, float]:
        """Not ready in the registry already. Hand back what has no first token yet, let the rest finish (and the
        P/D reservations be handed over), fail what is still there at the deadline (`drain_deadline_unix_ms`: a
        streaming request runs until its client would have stopped waiting; reservations get `min_drain_s`)."""
        started = time.monotonic()
        decision = drain_decision({rid: t.first_token_unix_ms is not None for rid, t in inst.in_flight.items()})
        for rid in decision.hand_back_ids:
            track = inst.in_flight.get(rid)
            if track is None:
                continue
            if inst.engine is not None:
                inst.engine.abort(rid)
            await self._hand_back(track)
        self.wake_engines()
        now_unix_ms = self.now_unix_ms()
        deadline_unix_ms = drain_deadline_unix_ms(now_unix_ms, (t.started_unix_ms for t in inst.in_flight.values()),
                                                  request_timeout_s=self.cluster.gateway.request_timeout_s,
                                                  min_drain_s=min_drain_s)
        deadline = time.monotonic() + (deadline_unix_ms - now_unix_ms) / 1e3
        while (inst.in_flight or inst.reservations) and time.monotonic() < deadline:
            if inst.resume_requested.is_set():  # wanted again: what runs keeps running, nothing is failed
                return {"drain_ms": (time.monotonic() - started) * 1e3}
            await asyncio.sleep(0.02)
        for track in list(inst.in_flight.values()):
            if inst.engine is not None:
                inst.engine.abort(track.request_id)
            await self.send(track, [failure(track, ErrorInfo(
                code=ErrorCode.INSTANCE_FAILED, retryable=False,
                message=f"{inst.instance_id} was deactivated before the request finished"))])
        for rid in list(inst.reservations):
            self.pd.release_reservation(inst, rid)
        await self._settle(inst)
        return {"drain_ms": (time.monotonic() - started) * 1e3}

    async def _settle(self, inst: ModelInstance, timeout_s: float = 5.0) -> None:
        """Let the engine loop step out the aborts just queued, so no work is left when the engine is parked."""
        deadline = time.monotonic() + timeout_s
        while inst.engine is not None and inst.engine.has_unfinished() and time.monotonic() < deadline:
            self.wake_engines()
            await asyncio.sleep(0.01)

    async def _put_record(self, inst: ModelInstance) -> None:
        stats = inst.engine.stats() if inst.engine is not None else None
        record = InstanceRecord(instance_id=inst.instance_id, model=inst.model, worker_id=self.worker_id,
                                role=inst.role, pool=inst.pool_kind, state=inst.state, is_ready=inst.is_ready,
                                prefill_tokens_per_s=getattr(stats, "prefill_tokens_per_s", None),
                                max_num_seqs=self.cluster.workers.max_num_seqs, updated_unix_ms=self.now_unix_ms())
        await kv_put(self._kv, subjects.instance_key(inst.instance_id), record.model_dump_json().encode())

    async def _delete_record(self, inst: ModelInstance) -> None:
        with contextlib.suppress(Exception):
            await self._kv.delete(subjects.instance_key(inst.instance_id))

    # --- requests ---
    def instance_of(self, track: RequestTrack) -> ModelInstance | None:
        return self.residents.get(track.instance_id)

    def track(self, inst: ModelInstance, track: RequestTrack) -> None:
        self._tracks[track.request_id] = track
        inst.in_flight[track.request_id] = track
        self.stream_log.open(track.request_id, first_seq=track.next_seq)

    def wake_engines(self) -> None:
        self._engine_loop.wake()

    async def _on_run(self, run: RunAssignment, env: Envelope) -> None:
        req = run.request
        inst = self.residents.get(run.instance_id)
        if run.phase == "decode":
            await self.pd.serve_decode(run, env, inst)
            return
        track = RequestTrack(request_id=req.request_id, model=req.model, instance_id=run.instance_id,
                             reply_subject=req.reply_subject, num_prompt_tokens=req.num_prompt_tokens,
                             started_unix_ms=self.now_unix_ms(), want_logprobs=req.sampling.logprobs,
                             ttft_deadline_unix_ms=req.ttft_deadline_unix_ms, tpot_slo_ms=req.tpot_slo_ms)
        if inst is None or not inst.is_ready:
            # the registry said ready, we are not (any more): nothing reached the client yet, so the dispatcher
            # takes it back and tries another instance
            log.info("%s: %s is not ready; handing %s back", self.worker_id, run.instance_id, req.request_id)
            await self._hand_back(track)
            return
        track.span = self._tracer.start_span("worker generate", kind=SpanKind.INTERNAL)
        track.extra["request"] = req  # a running decode that moves takes its request along (move_flow.py)
        self.track(inst, track)
        if run.phase == "prefill":
            # asks the decode worker first: off this subscription, which must keep taking messages (maybe that
            # very reservation request, when the decode instance lives on this worker)
            asyncio.create_task(self._start(track, self.pd.start_prefill(run, inst, track)))
            return
        await self._start(track, self._add_full(inst, run))

    @staticmethod
    async def _add_full(inst: ModelInstance, run: RunAssignment) -> None:
        req = run.request
        inst.engine.add_request(req.request_id, list(req.prompt_token_ids), req.sampling)

    async def _start(self, track: RequestTrack, starting: Awaitable[None]) -> None:
        try:
            await starting
        except ValueError as exc:  # the engine refuses the input: a clear error, nothing was streamed
            await self.send(track, [failure(track, ErrorInfo(code=ErrorCode.INVALID_REQUEST, message=str(exc)))])
            # the dispatchers forget it (no re-dispatch: it would fail the same way anywhere)
            await self.bus.publish(subjects.PREFILL_DONE, request_failed_notice(
                track, worker_id=self.worker_id, now_unix_ms=self.now_unix_ms()), propagate=False)
            return
        self.wake_engines()

    async def _on_cancel(self, cancel: CancelRequest, env: Envelope) -> None:
        for inst in self.residents.values():
            if cancel.request_id in inst.reservations:
                self.pd.release_reservation(inst, cancel.request_id)
        track = self._tracks.get(cancel.request_id)
        if track is None:
            return
        track.is_cancelled = True
        inst = self.instance_of(track)
        if inst is not None and inst.engine is not None:
            inst.engine.abort(cancel.request_id)
            self.wake_engines()

    def _from_engine_thread(self, instance_id: str, outputs: list) -> None:
        self._loop.call_soon_threadsafe(self._outputs.put_nowait, (instance_id, outputs))

    def _engine_failed(self, instance_id: str, exc: BaseException) -> None:
        self._loop.call_soon_threadsafe(self._outputs.put_nowait, (instance_id, exc))

    async def _publish_outputs(self) -> None:
        while True:
            instance_id, outputs = await self._outputs.get()
            try:
                if isinstance(outputs, BaseException):
                    await self._fail_instance(instance_id, outputs)
                    continue
                now = self.now_unix_ms()
                for out in outputs:
                    track = self._tracks.get(out.request_id)
                    if track is None or track.is_finished:
                        continue
                    if getattr(out, "detached", None) is not None:  # out of its batch to move; all else was sent
                        self.moves.on_detached(track, out)
                        continue
                    if track.extra.get("phase") == "prefill" and out.token_ids:
                        await self.pd.on_prefill_output(track, out, now)
                        continue
                    emission = emissions_for(track, out, worker_id=self.worker_id, now_unix_ms=now)
                    await self.notify_dispatchers(emission)
                    await self.send(track, emission.to_client)
            except Exception:  # noqa: BLE001 - keep publishing for everyone else
                log.exception("%s: publishing outputs failed", self.worker_id)

    async def notify_dispatchers(self, emission: Emission) -> None:
        """What an emission tells the dispatchers: the prefill notice (EPDT correction) and, at the end, the
        request's on-time tokens (token-level attainment, for the dispatcher that sent it)."""
        if emission.prefill_done is not None:
            await self.bus.publish(subjects.PREFILL_DONE, emission.prefill_done, propagate=False)
        if emission.outcome is not None:
            await self.bus.publish(subjects.REQUEST_OUTCOME, emission.outcome, propagate=False)

    async def send(self, track: RequestTrack, events: list) -> None:
        # logged before it leaves: a resend asked the moment after must find it
        now_s = time.monotonic()
        self.stream_log.record(track.request_id, events, now_s)
        if track.is_finished:
            handed_to = track.extra.get("handed_to", "")
            if handed_to != self.worker_id:  # a decode instance here continues the same log
                self.stream_log.finish(track.request_id, now_s, handed_to_worker_id=handed_to)
        for event in events:
            await self.bus.publish(track.reply_subject, event, propagate=False)
        if track.is_finished:
            if self._tracks.get(track.request_id) is track:  # a local P/D decode track keeps its place
                del self._tracks[track.request_id]
            inst = self.instance_of(track)
            if inst is not None and inst.in_flight.get(track.request_id) is track:
                inst.in_flight.pop(track.request_id, None)
            if track.span is not None:
                track.span.set_attribute("janus.output_tokens", track.num_output_tokens)
                track.span.end()

    async def _hand_back(self, track: RequestTrack, failure_kind: str = "handed_back") -> None:
        """Before the first token a request can still move: tell the dispatchers (PrefillDone ok=False; with
        "instance_failed" it counts towards the poison rule, dispatcher/core/poison.py)."""
        track.is_finished = True
        self.stream_log.forget(track.request_id)  # it streams elsewhere: nothing here to resend
        done = PrefillDone(request_id=track.request_id, model=track.model, worker_id=self.worker_id,
                           instance_id=track.instance_id, num_prompt_tokens=track.num_prompt_tokens, prefill_ms=0.0,
                           first_token_unix_ms=self.now_unix_ms(), ok=False, failure=failure_kind)
        await self.bus.publish(subjects.PREFILL_DONE, done, propagate=False)
        await self.send(track, [])

    async def _fail_instance(self, instance_id: str, exc: BaseException) -> None:
        inst = self.residents.get(instance_id)
        if inst is None:
            return
        self._stepped.pop(instance_id, None)
        await self.lifecycle.engine_failed(inst, f"engine failed: {exc}")
        for track in list(inst.in_flight.values()):
            if track.first_token_unix_ms is None:
                await self._hand_back(track, "instance_failed")
                continue
            err = ErrorInfo(code=ErrorCode.INSTANCE_FAILED, message=f"engine failed after streaming began: {exc}")
            await self.send(track, [failure(track, err)])

    # --- telemetry ---
    def heartbeat(self) -> WorkerHeartbeat:
        self._seq += 1
        residents = dict(self.residents)
        stats = read_stats(residents)  # once per heartbeat: the heartbeat and the prefix cache series share them
        hb = build_heartbeat(self.worker_id, self._seq, self.now_unix_ms(), self.pages, residents,
                             self.transfer.session if self.transfer else "", self.is_stopping,
                             self.lifecycle.host_offers.offered(), stats)
        observe_heartbeat(hb)
        observe_prefix_cache(self.worker_id, [(residents[iid].model, st) for iid, st in stats.items()])
        return hb

    async def _heartbeat_forever(self) -> None:
        """Only local work and one core-NATS publish, each in its own `try`: nothing here waits on JetStream, so a
        JetStream leader election (a NATS node lost) cannot silence the worker and make dispatchers declare it dead.
        The registry records are refreshed by their own task (_refresh_records_forever)."""
        while True:
            try:
                for inst in list(self.residents.values()):
                    self.pd.expire_reservations(inst, time.monotonic())
                self.stream_log.expire(time.monotonic())
            except Exception:  # noqa: BLE001 - housekeeping failing must not stop the heartbeat
                log.warning("%s: expiring reservations or the stream log failed", self.worker_id, exc_info=True)
            try:
                await self.bus.publish(subjects.worker_telemetry(self.worker_id), self.heartbeat(), propagate=False)
            except Exception:  # noqa: BLE001 - a missed heartbeat is not fatal; the next one may go through
                log.warning("%s: heartbeat not sent", self.worker_id, exc_info=True)
            await asyncio.sleep(HEARTBEAT_PERIOD_S)

    async def _refresh_records_forever(self) -> None:
        """Re-assert every resident instance's registry record each RECORD_REFRESH_S. A KV put waits for JetStream's
        acknowledgement, which takes as long as a leader election (seconds) when a NATS node is lost: it waits here,
        apart from the heartbeats, and one instance's failure does not skip the others."""
        while True:
            await asyncio.sleep(RECORD_REFRESH_S)
            for inst in list(self.residents.values()):
                if inst.lock.locked():
                    continue  # a command is changing it: its transitions write the record
                try:
                    async with inst.lock:  # no transition may slip in between reading and writing it
                        if inst.state != ModelState.COLD:
                            await self._put_record(inst)
                except Exception:  # noqa: BLE001 - the next refresh may go through
                    log.warning("%s: registry record of %s not refreshed", self.worker_id, inst.instance_id,
                                exc_info=True)

    def health_detail(self) -> dict[str, str]:
        return {"worker_id": self.worker_id,
                "instances": ",".join(f"{i.instance_id}:{i.state.value}" for i in self.residents.values()),
                "transfer_session": self.transfer.session if self.transfer else ""}

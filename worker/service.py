"""The worker service: one per device. Holds the resident model instances and their engines, runs the
dispatcher's assignments, streams tokens straight to the gateway, heartbeats, and keeps its registry records true.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

from opentelemetry.trace import SpanKind

from contracts import (
    CancelRequest,
    DeviceInfo,
    ErrorCode,
    ErrorInfo,
    InstanceRecord,
    InstanceRole,
    InstanceStatus,
    ModelState,
    PageCounters,
    Pool,
    PrefillDone,
    RunAssignment,
    WorkerHeartbeat,
    subjects,
)
from runtime import tracing
from runtime.bus import Bus, BusError, Envelope
from runtime.catalog import max_model_len, model_dir
from runtime.jetstream import ensure_kv
from runtime.service import Service
from runtime.settings import ClusterConfig, JanusSettings

from .core.streaming import RequestTrack, emissions_for, failure
from .engine_loop import EngineLoop

log = logging.getLogger("janus.worker")

HEARTBEAT_PERIOD_S = 0.5


@dataclass
class Resident:
    """One model instance on this worker."""

    instance_id: str
    model: str
    role: InstanceRole
    pool: Pool
    state: ModelState
    engine: object | None = None
    in_flight: dict[str, RequestTrack] = field(default_factory=dict)

    @property
    def is_ready(self) -> bool:
        return self.state == ModelState.ACTIVE and self.engine is not None


class WorkerService(Service):
    name = "worker"

    def __init__(self, settings: JanusSettings, cluster: ClusterConfig, *, worker_id: str | None = None) -> None:
        super().__init__(settings, cluster)
        self.worker_id = worker_id or settings.instance
        self.device = cluster.workers.device
        self.residents: dict[str, Resident] = {}
        self._tracks: dict[str, RequestTrack] = {}
        self._outputs: asyncio.Queue = asyncio.Queue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._engine_loop = EngineLoop(self._from_engine_thread, self._engine_failed)
        self._kv = None
        self._tasks: list[asyncio.Task] = []
        self._seq = 0
        self._tracer = tracing.tracer("janus.worker")

    # --- start / stop ---
    async def start(self, bus: Bus) -> None:
        self._loop = asyncio.get_running_loop()
        self._kv = await ensure_kv(bus.js, subjects.INSTANCES_BUCKET)
        self._engine_loop.start()
        await bus.subscribe(subjects.worker_run(self.worker_id), RunAssignment, self._on_run)
        await bus.subscribe(subjects.CANCEL, CancelRequest, self._on_cancel, traced=False)
        self._tasks.append(asyncio.create_task(self._publish_outputs()))
        for model in self._bootstrap_models():
            await self.activate(model, f"{self.worker_id}/{model}")
        self._tasks.append(asyncio.create_task(self._heartbeat_forever()))

    def _bootstrap_models(self) -> list[str]:
        placement = self.cluster.workers.placement
        if self.worker_id in placement:
            return list(placement[self.worker_id])
        return [m.name for m in self.cluster.models]

    async def stop(self) -> None:
        """Drain: leave the registry (no new work), finish what is in flight, then release."""
        for res in self.residents.values():
            res.state = ModelState.DRAINING
            await self._put_record(res)
        deadline = time.monotonic() + 30.0
        while any(r.in_flight for r in self.residents.values()) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for res in list(self.residents.values()):
            for track in list(res.in_flight.values()):
                await self._send(track, [failure(track, ErrorInfo(code=ErrorCode.INSTANCE_FAILED,
                                                                  message="worker stopped", retryable=True))])
            await self._delete_record(res)
        self._engine_loop.stop()
        for task in self._tasks:
            task.cancel()

    # --- instances ---
    async def activate(self, model: str, instance_id: str, role: InstanceRole = InstanceRole.COLOCATED,
                       pool: Pool = Pool.STEADY) -> Resident:
        spec = self.cluster.model(model)
        if spec is None:
            raise BusError.of(ErrorCode.UNKNOWN_MODEL, f"model {model} is not in the cluster config")
        res = Resident(instance_id, model, role, pool, ModelState.LOADING)
        self.residents[instance_id] = res
        path = model_dir(spec, self.settings.models_dir)
        res.engine = await asyncio.to_thread(self._load_engine, path, instance_id)
        res.state = ModelState.ACTIVE
        self._engine_loop.add(instance_id, res.engine)
        await self._put_record(res)
        log.info("%s: %s active", self.worker_id, instance_id)
        return res

    def _load_engine(self, path: Path, instance_id: str):
        if self.cluster.workers.engine == "echo":
            from .echo_engine import EchoEngine

            return EchoEngine()
        from .engine.engine import EngineConfig, LLMEngine

        # the gateway validates against the same max_model_len (runtime.catalog), so they agree by construction
        config = EngineConfig(max_num_seqs=self.cluster.workers.max_num_seqs, max_model_len=max_model_len(path))
        return LLMEngine(path, device=self.device, config=config, owner=instance_id)

    async def _put_record(self, res: Resident) -> None:
        stats = res.engine.stats() if res.engine is not None else None
        record = InstanceRecord(instance_id=res.instance_id, model=res.model, worker_id=self.worker_id,
                                role=res.role, pool=res.pool, state=res.state, is_ready=res.is_ready,
                                prefill_tokens_per_s=getattr(stats, "prefill_tokens_per_s", None),
                                max_num_seqs=self.cluster.workers.max_num_seqs, updated_unix_ms=time.time() * 1e3)
        await self._kv.put(subjects.instance_key(res.instance_id), record.model_dump_json().encode())

    async def _delete_record(self, res: Resident) -> None:
        with contextlib.suppress(Exception):
            await self._kv.delete(subjects.instance_key(res.instance_id))

    # --- requests ---
    async def _on_run(self, run: RunAssignment, env: Envelope) -> None:
        req = run.request
        res = self.residents.get(run.instance_id)
        now = time.time() * 1e3
        track = RequestTrack(request_id=req.request_id, model=req.model, instance_id=run.instance_id,
                             reply_subject=req.reply_subject, num_prompt_tokens=req.num_prompt_tokens,
                             started_unix_ms=now, want_logprobs=req.sampling.logprobs)
        if res is None or not res.is_ready:
            # the registry said ready, we are not (any more): nothing reached the client yet, so the dispatcher
            # takes it back and tries another instance
            log.warning("%s: %s is not ready; handing %s back", self.worker_id, run.instance_id, req.request_id)
            await self._hand_back(track)
            return
        track.span = self._tracer.start_span("worker generate", kind=SpanKind.INTERNAL)
        self._tracks[req.request_id] = track
        res.in_flight[req.request_id] = track
        res.engine.add_request(req.request_id, list(req.prompt_token_ids), req.sampling)
        self._engine_loop.wake()

    async def _on_cancel(self, cancel: CancelRequest, env: Envelope) -> None:
        track = self._tracks.get(cancel.request_id)
        if track is None:
            return
        track.is_cancelled = True
        engine = self._engine_loop.get(track.instance_id)
        if engine is not None:
            engine.abort(cancel.request_id)
            self._engine_loop.wake()

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
                now = time.time() * 1e3
                for out in outputs:
                    track = self._tracks.get(out.request_id)
                    if track is None:
                        continue
                    emission = emissions_for(track, out, worker_id=self.worker_id, now_unix_ms=now)
                    if emission.prefill_done is not None:
                        await self.bus.publish(subjects.PREFILL_DONE, emission.prefill_done, propagate=False)
                    await self._send(track, emission.to_client)
            except Exception:  # noqa: BLE001 - keep publishing for everyone else
                log.exception("%s: publishing outputs failed", self.worker_id)

    async def _send(self, track: RequestTrack, events: list) -> None:
        for event in events:
            await self.bus.publish(track.reply_subject, event, propagate=False)
        if track.is_finished:
            self._tracks.pop(track.request_id, None)
            res = self.residents.get(track.instance_id)
            if res is not None:
                res.in_flight.pop(track.request_id, None)
            if track.span is not None:
                track.span.set_attribute("janus.output_tokens", track.num_output_tokens)
                track.span.end()

    async def _hand_back(self, track: RequestTrack) -> None:
        """Before the first token a request can still move: tell the dispatchers (PrefillDone ok=False)."""
        track.is_finished = True
        done = PrefillDone(request_id=track.request_id, model=track.model, worker_id=self.worker_id,
                           instance_id=track.instance_id, num_prompt_tokens=track.num_prompt_tokens, prefill_ms=0.0,
                           first_token_unix_ms=time.time() * 1e3, ok=False)
        await self.bus.publish(subjects.PREFILL_DONE, done, propagate=False)
        await self._send(track, [])

    async def _fail_instance(self, instance_id: str, exc: BaseException) -> None:
        res = self.residents.get(instance_id)
        if res is None:
            return
        res.state = ModelState.FAILED
        await self._put_record(res)
        for track in list(res.in_flight.values()):
            if track.first_token_unix_ms is None:
                await self._hand_back(track)
                continue
            err = ErrorInfo(code=ErrorCode.INSTANCE_FAILED, message=f"engine failed after streaming began: {exc}")
            await self._send(track, [failure(track, err)])

    # --- telemetry ---
    def heartbeat(self) -> WorkerHeartbeat:
        self._seq += 1
        statuses = []
        for res in self.residents.values():
            st = res.engine.stats() if res.engine is not None else None
            statuses.append(InstanceStatus(
                instance_id=res.instance_id, model=res.model, role=res.role, pool=res.pool, state=res.state,
                num_waiting=getattr(st, "num_waiting", 0), num_running=getattr(st, "num_running", 0),
                num_kv_blocks_used=getattr(st, "num_kv_blocks_used", 0),
                num_kv_blocks_free=getattr(st, "num_kv_blocks_free", 0),
                ttft_ms_p50=getattr(st, "ttft_ms_p50", None), tpot_ms_p50=getattr(st, "tpot_ms_p50", None),
                prefill_tokens_per_s=getattr(st, "prefill_tokens_per_s", None),
                decode_tokens_per_s=getattr(st, "decode_tokens_per_s", None)))
        pool_bytes = self.cluster.workers.pool_bytes
        page = self.cluster.workers.page_size_bytes
        pages = PageCounters(page_size_bytes=page, num_pages_total=pool_bytes // page,
                             num_pages_free=pool_bytes // page, fragmentation=0.0)
        return WorkerHeartbeat(worker_id=self.worker_id, seq=self._seq, sent_unix_ms=time.time() * 1e3,
                               device=DeviceInfo(kind="cpu", name=platform.processor() or platform.machine(),
                                                 hbm_bytes=pool_bytes),
                               pages=pages, instances=tuple(statuses), is_draining=self.is_stopping)

    async def _heartbeat_forever(self) -> None:
        while True:
            try:
                await self.bus.publish(subjects.worker_telemetry(self.worker_id), self.heartbeat(), propagate=False)
            except Exception:  # noqa: BLE001 - a missed heartbeat is not fatal; the next one may go through
                log.warning("%s: heartbeat not sent", self.worker_id, exc_info=True)
            await asyncio.sleep(HEARTBEAT_PERIOD_S)

    def health_detail(self) -> dict[str, str]:
        return {"worker_id": self.worker_id,
                "instances": ",".join(f"{r.instance_id}:{r.state.value}" for r in self.residents.values())}

"""The gateway service: HTTP in (uvicorn + the FastAPI app), requests out on the bus, token streams back.

Every accepted request reaches exactly one terminal state: the dispatcher acknowledges the submission (or refuses it
with a typed error), the worker ends the stream with done or error, and the gateway itself ends it with a timeout
error when nothing terminal came in time. A client that goes away cancels its work (janus.cancel).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import AsyncIterator

import uvicorn

from contracts import (
    STREAM_EVENT,
    CancelRequest,
    DispatcherHeartbeat,
    ErrorCode,
    ErrorInfo,
    GenerateRequest,
    RequestFailed,
    ResendReply,
    ResendRequest,
    SubmitAck,
    TokenChunk,
    subjects,
)
from runtime import tracing
from runtime.bus import Bus, BusError, Envelope
from runtime.catalog import max_model_len, model_dir
from runtime.cluster_view import ClusterView
from runtime.liveness import PeerLiveness
from runtime.service import Service
from runtime.settings import ClusterConfig, JanusSettings

from .app import Event, create_app
from .core.admission import ServedModel
from .core.limits import TenantLimiter
from .core.readiness import Readiness, StartupGate, readiness
from .metrics import IN_FLIGHT, observe_request
from .core.recovery import StreamRecovery, resend_due
from .core.stream import StreamAssembler
from .http_guard import guarded_h11

log = logging.getLogger("janus.gateway")

# a dispatcher silent this long is presumed dead: what it held before the first token is submitted again
DISPATCHER_TIMEOUT_S = 2.0
# how long a submission waits for some dispatcher to answer at all (a NATS restart takes ~0.3 s to reconnect)
SUBMIT_RETRY_S = 5.0
DISPATCHER_CHECK_PERIOD_S = 0.25
MAX_NUM_SUBMISSIONS = 3
_RESUBMIT = object()


@dataclass
class _Meter:
    """What one request looked like from the gateway, for its Prometheus series."""

    started_s: float  # submitted (monotonic s)
    arrived_s: float | None = None  # accepted by the HTTP app, before tokenising (monotonic s)
    first_token_s: float | None = None
    last_token_s: float | None = None
    ended_s: float | None = None  # the terminal event
    num_tokens: int = 0
    status: str = "lost"

    @classmethod
    def of(cls, request: GenerateRequest, now_s: float, now_unix_ms: float) -> "_Meter":
        # the arrival is stamped on the wall clock (one clock for every service): moved onto the monotonic one
        waited_s = max(0.0, (now_unix_ms - request.arrival_unix_ms) / 1e3)
        return cls(started_s=now_s, arrived_s=now_s - waited_s)

    def see(self, event: object, now_s: float) -> None:
        if isinstance(event, TokenChunk):
            if self.first_token_s is None:
                self.first_token_s = now_s
            self.last_token_s = now_s
            self.num_tokens += len(event.token_ids)
            return
        self.ended_s = now_s
        self.status = event.error.code.value if isinstance(event, RequestFailed) else "ok"

    def record(self, request: GenerateRequest, now_s: float) -> None:
        """`now_s`: the end of a request that ended without a terminal event (the client went away)."""
        ttft = None if self.first_token_s is None else self.first_token_s - self.started_s
        last = None if self.last_token_s is None else self.last_token_s - self.started_s
        arrived_s = self.started_s if self.arrived_s is None else self.arrived_s
        e2e = (now_s if self.ended_s is None else self.ended_s) - arrived_s
        observe_request(request.model, request.tenant, self.status, ttft_s=ttft, last_token_s=last,
                        num_tokens=self.num_tokens, num_prompt_tokens=request.num_prompt_tokens, e2e_s=e2e)


@dataclass
class _Pending:
    """One client request at the gateway, across its submissions."""

    request_id: str
    attempt_id: str = ""
    dispatcher_id: str = ""
    has_first_event: bool = False
    is_resubmitting: bool = False
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    assembler: StreamAssembler = field(default_factory=StreamAssembler)
    recovery: StreamRecovery = field(default_factory=StreamRecovery)


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the service base owns SIGTERM/SIGINT."""

    def install_signal_handlers(self) -> None:  # uvicorn < 0.29
        pass

    @contextlib.contextmanager
    def capture_signals(self):  # uvicorn >= 0.29
        yield


class GatewayService(Service):
    name = "gateway"

    def __init__(self, settings: JanusSettings, cluster: ClusterConfig, *, port: int | None = None,
                 host: str | None = None) -> None:
        super().__init__(settings, cluster)
        self.gateway_id = subjects.token(settings.instance)
        self.models: dict[str, ServedModel] = {}
        self.api_keys = dict(cluster.gateway.api_keys)
        self.max_request_bytes = cluster.gateway.max_request_bytes
        self.limiter = TenantLimiter(dict(cluster.gateway.tenants), cluster.gateway.default_tenant_limits)
        self.request_timeout_s = cluster.gateway.request_timeout_s
        self.host = host or cluster.gateway.host
        self.port = cluster.gateway.port if port is None else port
        self._pending: dict[str, _Pending] = {}
        self._dispatchers = PeerLiveness(timeout_s=DISPATCHER_TIMEOUT_S, check_period_s=DISPATCHER_CHECK_PERIOD_S)
        self._startup = StartupGate(())  # replaced in start(), once the served models are known
        self._server: _Server | None = None
        self._server_task: asyncio.Task | None = None
        self.listening = False  # true once the bound port is known (port=0 picks one at start)
        self._tracer = tracing.tracer("janus.gateway")
        self.view = ClusterView()
        self.app = create_app(self, body_timeout_s=cluster.gateway.body_timeout_s)

    # --- Backend (what the HTTP app needs) ---
    def reply_subject(self, request_id: str) -> str:
        return subjects.reply(self.gateway_id, request_id)

    def current_traceparent(self) -> str:
        return tracing.current_traceparent() or ""

    def start_request_span(self, name: str):
        return self._tracer.start_as_current_span(name)

    def status_snapshot(self) -> dict:
        return self.view.snapshot()

    async def submit(self, request: GenerateRequest) -> AsyncIterator[Event]:
        """Submit and yield the request's events, ending with exactly one terminal event.

        If the dispatcher holding the request falls silent before the first token, the request is submitted again
        (under a fresh attempt id, the old attempt cancelled), so a dispatcher crash loses nothing."""
        pending = _Pending(request_id=request.request_id)
        is_terminal = False
        attempt = request
        meter = _Meter.of(request, time.monotonic(), time.time() * 1e3)
        IN_FLIGHT.labels(request.model).inc()
        try:
            for submission in range(MAX_NUM_SUBMISSIONS):
                if submission:
                    attempt_id = f"{request.request_id}-s{submission}"
                    attempt = request.model_copy(update={"request_id": attempt_id,
                                                         "reply_subject": self.reply_subject(attempt_id)})
                self._pending[attempt.request_id] = pending
                pending.attempt_id = attempt.request_id
                pending.is_resubmitting = False
                try:
                    ack = await self._hand_to_a_dispatcher(attempt)
                except BusError as exc:
                    is_terminal = True
                    meter.status = exc.error.code.value
                    yield RequestFailed(request_id=request.request_id, seq=0, error=exc.error)
                    return
                if ack.status == "rejected":
                    is_terminal = True
                    err = ack.error or ErrorInfo(code=ErrorCode.OVERLOADED, message="the dispatcher refused it")
                    meter.status = err.code.value
                    yield RequestFailed(request_id=request.request_id, seq=0, error=err)
                    return
                pending.dispatcher_id = ack.dispatcher_id
                async for event in self._events_of(pending, request):
                    if event is _RESUBMIT:
                        break
                    if not isinstance(event, TokenChunk):
                        is_terminal = True
                    meter.see(event, time.monotonic())
                    yield event
                    if is_terminal:
                        return
                log.warning("dispatcher %s went silent holding %s: submitting again", pending.dispatcher_id,
                            request.request_id)
                self._pending.pop(attempt.request_id, None)
                await self._cancel(attempt.request_id)
            is_terminal = True
            meter.status = ErrorCode.UNAVAILABLE.value
            yield RequestFailed(request_id=request.request_id, seq=0, error=ErrorInfo(
                code=ErrorCode.UNAVAILABLE, retryable=True,
                message=f"dispatchers failed {MAX_NUM_SUBMISSIONS} times before the first token"))
        finally:
            self._pending.pop(attempt.request_id, None)
            IN_FLIGHT.labels(request.model).dec()
            if not is_terminal:
                meter.status = "cancelled"
                await self._cancel(attempt.request_id)  # the consumer stopped early: the client went away
            meter.record(request, time.monotonic())

    async def _events_of(self, pending: "_Pending", request: GenerateRequest) -> AsyncIterator[object]:
        deadline = time.monotonic() + self.request_timeout_s
        while True:
            remaining = deadline - time.monotonic()
            try:
                # not asyncio.wait_for: on Python 3.11 it swallows a cancellation that races an event already
                # queued (gh-86296), and a fast stream always has one, so a client's disconnect was lost
                async with asyncio.timeout(max(remaining, 0.001)):
                    event = await pending.queue.get()
            except TimeoutError:
                yield RequestFailed(request_id=request.request_id, seq=pending.assembler.next_seq, error=ErrorInfo(
                    code=ErrorCode.TIMEOUT, message=f"no answer within {self.request_timeout_s} s"))
                return
            if event is _RESUBMIT:
                if pending.has_first_event:
                    continue  # streaming already: the dispatcher no longer matters
                yield event
                return
            pending.has_first_event = True
            yield event

    async def _hand_to_a_dispatcher(self, attempt: GenerateRequest) -> SubmitAck:
        """Submit, retrying while no dispatcher answers at all (they are reconnecting after a NATS restart or a
        failover, or restarting): nobody received the request, so sending it again cannot duplicate it. A timeout
        is not retried: a dispatcher may hold the request."""
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + SUBMIT_RETRY_S
        pause_s = 0.05
        while True:
            try:
                return await self.bus.request(subjects.req(attempt.model), attempt, SubmitAck, timeout_s=5.0)
            except BusError as exc:
                no_responders = exc.error.code == ErrorCode.UNAVAILABLE and exc.error.retryable
                if not no_responders or loop.time() + pause_s > give_up_at:
                    raise
            await asyncio.sleep(pause_s)
            pause_s = min(0.5, 2 * pause_s)

    async def _cancel(self, request_id: str) -> None:
        if self.bus is not None and self.bus.nc.is_connected:
            with contextlib.suppress(Exception):
                await self.bus.publish(subjects.CANCEL, CancelRequest(request_id=request_id))

    async def _on_dispatcher_heartbeat(self, beat: DispatcherHeartbeat, env: Envelope) -> None:
        now_s = time.monotonic()
        self._dispatchers.heard(beat.dispatcher_id, now_s)
        self._startup.observe(now_s, beat.routable_models)

    async def _watchdog(self) -> None:
        """Every 0.25 s: resubmit what a silent dispatcher held; recover lost stream events from their worker."""
        while True:
            await asyncio.sleep(DISPATCHER_CHECK_PERIOD_S)
            now_s = time.monotonic()
            silent = self._dispatchers.check(now_s)
            for pending in list(self._pending.values()):
                if pending.assembler.is_terminal:
                    continue
                if (pending.dispatcher_id in silent and not pending.has_first_event
                        and not pending.is_resubmitting):
                    pending.is_resubmitting = True
                    pending.queue.put_nowait(_RESUBMIT)
                if resend_due(pending.recovery, now_s, gap_age_s=pending.assembler.gap_age_s(now_s)):
                    pending.recovery.start(now_s)
                    asyncio.create_task(self._recover(pending))

    async def _recover(self, pending: "_Pending") -> None:
        """Ask the worker that streamed the request for everything from the next expected event (a bus failover can
        drop messages in flight: NATS core is at-most-once). Ends the request only when the worker no longer
        knows it, or cannot be reached several times in a row."""
        attempt_id = pending.attempt_id
        ask = ResendRequest(request_id=attempt_id, from_seq=pending.assembler.next_seq)
        try:
            reply = await self.bus.request(subjects.worker_resend(pending.recovery.worker_id), ask, ResendReply,
                                           timeout_s=2.0)
        except BusError as exc:
            if pending.recovery.fail(time.monotonic()):
                self._end(pending, ErrorInfo(code=ErrorCode.UNAVAILABLE, retryable=True,
                                             message=f"the token stream broke off: {exc.error.message}"))
            return
        pending.recovery.succeed(time.monotonic())
        if pending.attempt_id != attempt_id:
            return
        if not reply.is_known:
            self._end(pending, ErrorInfo(code=ErrorCode.UNAVAILABLE, retryable=True,
                                         message="the token stream was lost (its worker no longer has it)"))
            return
        for event in reply.events:
            self._deliver(pending, event)

    def _end(self, pending: "_Pending", error: ErrorInfo) -> None:
        for ready in pending.assembler.push(RequestFailed(request_id=pending.attempt_id, seq=0, error=error)):
            pending.queue.put_nowait(ready)

    def _deliver(self, pending: "_Pending", event: Event) -> None:
        now_s = time.monotonic()
        if isinstance(event, TokenChunk) and event.worker_id:
            pending.recovery.worker_id = event.worker_id
        pending.recovery.last_event_s = now_s
        for ready in pending.assembler.push(event):
            pending.queue.put_nowait(ready)
        pending.assembler.note_time(now_s)

    async def _on_reply(self, event: Event, env: Envelope) -> None:
        pending = self._pending.get(event.request_id)
        if pending is None or pending.attempt_id != event.request_id:
            return  # late events of a request already ended (cancelled, timed out, or submitted again)
        self._deliver(pending, event)

    def start_metrics(self) -> None:
        """The gateway serves /metrics on its own HTTP port."""

    # --- lifecycle ---
    def load_models(self) -> None:
        from runtime.tokenizer import TextTokenizer

        for spec in self.cluster.models:
            path = model_dir(spec, self.settings.models_dir)
            self.models[spec.name] = ServedModel(
                name=spec.name, max_model_len=max_model_len(path), ttft_slo_ms=spec.ttft_slo_ms,
                tpot_slo_ms=spec.tpot_slo_ms, tokenizer=TextTokenizer.from_dir(path))

    async def start(self, bus: Bus) -> None:
        if not self.models:
            self.load_models()
        self._startup = StartupGate(self.models)
        await bus.subscribe(subjects.reply_wildcard(self.gateway_id), STREAM_EVENT, self._on_reply, traced=False)
        await bus.subscribe(subjects.DISPATCHER_TELEMETRY_WILDCARD, DispatcherHeartbeat,
                            self._on_dispatcher_heartbeat, traced=False)
        self._watchdog_task = asyncio.create_task(self._watchdog())
        await self.view.attach(bus)  # for the read-only status page
        gw = self.cluster.gateway
        # no access log: it would hold request lines and, behind proxies, keys; metrics and traces cover it
        config = uvicorn.Config(self.app, host=self.host, port=self.port, log_level="warning", lifespan="off",
                                timeout_graceful_shutdown=30, access_log=False,
                                http=guarded_h11(header_timeout_s=gw.header_timeout_s,
                                                 max_connections=gw.max_connections),
                                timeout_keep_alive=gw.idle_timeout_s,
                                ssl_certfile=str(gw.tls_certfile) if gw.tls_certfile else None,
                                ssl_keyfile=str(gw.tls_keyfile) if gw.tls_keyfile else None)
        self._server = _Server(config)
        self._server_task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._server_task.done():
                self._server_task.result()  # raises what stopped it (e.g. port in use)
                raise RuntimeError("the HTTP server stopped before it started")
            await asyncio.sleep(0.01)
        sock = self._server.servers[0].sockets[0]
        self.port = sock.getsockname()[1]
        self.metrics_url = f"{self.url}/metrics"
        self.listening = True
        log.info("gateway listening on %s", self.url)

    @property
    def url(self) -> str:
        scheme = "https" if self.cluster.gateway.tls_certfile else "http"
        return f"{scheme}://{self.host}:{self.port}"

    async def stop(self) -> None:
        """Stop accepting connections; streams in flight finish (uvicorn waits for them)."""
        if getattr(self, "_watchdog_task", None) is not None:
            self._watchdog_task.cancel()
        await self.view.detach()
        if self._server is not None:
            self._server.should_exit = True
        if self._server_task is not None:
            with contextlib.suppress(Exception):
                await self._server_task

    def health_detail(self) -> dict[str, str]:
        return {"url": self.url, "in_flight": str(len(self._pending))}

    def readiness(self) -> Readiness:
        """For /ready: from what the gateway tracks anyway (its connection, dispatcher heartbeats), no round trip."""
        return readiness(is_nats_connected=self.bus is not None and self.bus.nc.is_connected,
                         dispatcher_silent_s=self._dispatchers.least_silent_s(time.monotonic()),
                         dispatcher_timeout_s=DISPATCHER_TIMEOUT_S,
                         models_not_up=self._startup.waiting_for(time.monotonic()))

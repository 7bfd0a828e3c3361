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
from typing import AsyncIterator

import uvicorn

from contracts import (
    STREAM_EVENT,
    CancelRequest,
    ErrorCode,
    ErrorInfo,
    GenerateRequest,
    RequestFailed,
    SubmitAck,
    TokenChunk,
    subjects,
)
from runtime import tracing
from runtime.bus import Bus, BusError, Envelope
from runtime.catalog import max_model_len, model_dir
from runtime.service import Service
from runtime.settings import ClusterConfig, JanusSettings

from .app import Event, create_app
from .core.admission import ServedModel
from .core.stream import StreamAssembler

log = logging.getLogger("janus.gateway")


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
        self.request_timeout_s = cluster.gateway.request_timeout_s
        self.host = host or cluster.gateway.host
        self.port = cluster.gateway.port if port is None else port
        self._pending: dict[str, tuple[asyncio.Queue, StreamAssembler]] = {}
        self._server: _Server | None = None
        self._server_task: asyncio.Task | None = None
        self._tracer = tracing.tracer("janus.gateway")
        self.app = create_app(self)

    # --- Backend (what the HTTP app needs) ---
    def reply_subject(self, request_id: str) -> str:
        return subjects.reply(self.gateway_id, request_id)

    def current_traceparent(self) -> str:
        return tracing.current_traceparent() or ""

    def start_request_span(self, name: str):
        return self._tracer.start_as_current_span(name)

    async def submit(self, request: GenerateRequest) -> AsyncIterator[Event]:
        queue: asyncio.Queue = asyncio.Queue()
        assembler = StreamAssembler()
        self._pending[request.request_id] = (queue, assembler)
        is_terminal = False
        try:
            try:
                ack = await self.bus.request(subjects.req(request.model), request, SubmitAck, timeout_s=5.0)
            except BusError as exc:
                is_terminal = True
                yield RequestFailed(request_id=request.request_id, seq=0, error=exc.error)
                return
            if ack.status == "rejected":
                is_terminal = True
                yield RequestFailed(request_id=request.request_id, seq=0, error=ack.error or ErrorInfo(
                    code=ErrorCode.OVERLOADED, message="the dispatcher refused the request"))
                return
            deadline = time.monotonic() + self.request_timeout_s
            while True:
                remaining = deadline - time.monotonic()
                try:
                    event = await asyncio.wait_for(queue.get(), timeout=max(remaining, 0.001))
                except asyncio.TimeoutError:
                    is_terminal = True
                    yield RequestFailed(request_id=request.request_id, seq=assembler.next_seq, error=ErrorInfo(
                        code=ErrorCode.TIMEOUT, message=f"no answer within {self.request_timeout_s} s"))
                    return
                if not isinstance(event, TokenChunk):
                    is_terminal = True
                yield event
                if is_terminal:
                    return
        finally:
            self._pending.pop(request.request_id, None)
            if not is_terminal and self.bus is not None and self.bus.nc.is_connected:
                # the consumer stopped early: the client went away
                with contextlib.suppress(Exception):
                    await self.bus.publish(subjects.CANCEL, CancelRequest(request_id=request.request_id))

    async def _on_reply(self, event: Event, env: Envelope) -> None:
        pending = self._pending.get(event.request_id)
        if pending is None:
            return  # late events of a request already ended (cancelled or timed out)
        queue, assembler = pending
        for ready in assembler.push(event):
            queue.put_nowait(ready)

    # --- lifecycle ---
    def load_models(self) -> None:
        from worker.engine.tokenizer import TextTokenizer  # torch-free

        for spec in self.cluster.models:
            path = model_dir(spec, self.settings.models_dir)
            self.models[spec.name] = ServedModel(
                name=spec.name, max_model_len=max_model_len(path), ttft_slo_ms=spec.ttft_slo_ms,
                tpot_slo_ms=spec.tpot_slo_ms, tokenizer=TextTokenizer.from_dir(path))

    async def start(self, bus: Bus) -> None:
        if not self.models:
            self.load_models()
        await bus.subscribe(subjects.reply_wildcard(self.gateway_id), STREAM_EVENT, self._on_reply, traced=False)
        config = uvicorn.Config(self.app, host=self.host, port=self.port, log_level="warning", lifespan="off",
                                timeout_graceful_shutdown=30, access_log=False)
        self._server = _Server(config)
        self._server_task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._server_task.done():
                self._server_task.result()  # raises what stopped it (e.g. port in use)
                raise RuntimeError("the HTTP server stopped before it started")
            await asyncio.sleep(0.01)
        sock = self._server.servers[0].sockets[0]
        self.port = sock.getsockname()[1]
        log.info("gateway listening on %s", self.url)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def stop(self) -> None:
        """Stop accepting connections; streams in flight finish (uvicorn waits for them)."""
        if self._server is not None:
            self._server.should_exit = True
        if self._server_task is not None:
            with contextlib.suppress(Exception):
                await self._server_task

    def health_detail(self) -> dict[str, str]:
        return {"url": self.url, "in_flight": str(len(self._pending))}

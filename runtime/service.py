"""The service base: connect, start, answer health checks, stop gracefully on SIGTERM/SIGINT.

A service is thin: `start` subscribes and hands messages to its core, `stop` stops taking work and finishes what it
holds. `run_service` is the one way every process (docker-compose, `janus up`, tests) runs a service.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import ssl
import time
from abc import ABC, abstractmethod

from contracts import HealthReply, subjects

from .bus import Bus, Envelope
from .loop_lag import LoopLagMonitor
from .metrics import MetricsServer
from .settings import ClusterConfig, JanusSettings
from .tracing import install_log_trace_ids, setup_tracing

log = logging.getLogger("janus.service")

CLOSE_TIMEOUT_S = 60.0  # closing the connection: nats-py's drain_timeout (30 s), a flush (10 s), and a margin


class Service(ABC):
    """Subclasses set `name` and implement start/stop. `stopped` is set when the service wants to end on its own."""

    name: str = "service"
    stop_timeout_s: float = 180.0  # a stop() still running after this is stuck: abandoned, and reported

    def __init__(self, settings: JanusSettings, cluster: ClusterConfig) -> None:
        self.settings = settings
        self.cluster = cluster
        self.bus: Bus | None = None
        self.started_monotonic = time.monotonic()
        self.is_stopping = False
        self.stopped = asyncio.Event()
        self.metrics_url = ""
        self.loop_lag = LoopLagMonitor(self.name)

    @property
    def instance(self) -> str:
        return self.settings.instance

    @abstractmethod
    async def start(self, bus: Bus) -> None:
        """Subscribe and begin work. Must return promptly; long work runs in tasks."""

    async def stop(self) -> None:
        """Stop taking new work and finish what is in flight (the default holds nothing)."""

    def health_detail(self) -> dict[str, str]:
        return {}

    def health(self) -> HealthReply:
        status = "stopping" if self.is_stopping else "ok"
        detail = {**self.health_detail(), **({"metrics": self.metrics_url} if self.metrics_url else {}),
                  # how late the event loop has run at worst since start, and how often past 1 s (runtime/loop_lag.py)
                  "loop_max_lag_ms": f"{self.loop_lag.max_lag_s * 1e3:.0f}",
                  "loop_stalls": str(self.loop_lag.num_stalls)}
        return HealthReply(service=self.name, instance=self.instance, status=status,
                           uptime_s=time.monotonic() - self.started_monotonic, detail=detail)

    def start_metrics(self) -> None:
        """Serve /metrics for Prometheus (services with an HTTP server of their own override this)."""
        if self.settings.metrics_port is not None:
            server = MetricsServer(self.settings.metrics_host, self.settings.metrics_port)
            self._metrics_server = server
            self.metrics_url = server.url

    def stop_metrics(self) -> None:
        server = getattr(self, "_metrics_server", None)
        if server is not None:
            server.stop()

    async def _serve_health(self, bus: Bus) -> None:
        async def answer(_: object, env: Envelope) -> HealthReply:
            return self.health()

        await bus.serve(subjects.health(self.name, self.instance), None, answer)
        # broadcast health: no queue group, every service answers; callers gather replies on an inbox
        async def broadcast(_: object, env: Envelope) -> None:
            if env.reply:
                await bus.publish(env.reply, self.health(), propagate=False)

        await bus.subscribe(subjects.HEALTH_ALL, None, broadcast, traced=False)


def tls_context(settings: JanusSettings) -> ssl.SSLContext | None:
    """TLS to NATS when a CA is configured (mutual TLS with a client certificate and key)."""
    if settings.nats_tls_ca is None:
        return None
    ctx = ssl.create_default_context(cafile=str(settings.nats_tls_ca))
    if settings.nats_tls_cert is not None:
        ctx.load_cert_chain(str(settings.nats_tls_cert), str(settings.nats_tls_key) if settings.nats_tls_key else None)
    return ctx


def configure_logging(level: str) -> None:
    """Lines made while a request is handled carry its trace id (` trace=ID`, runtime/tracing.py)."""
    install_log_trace_ids()
    logging.basicConfig(level=getattr(logging, level, logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s%(trace)s: %(message)s")


def where_waiting(task: asyncio.Task) -> str:
    """The chain of coroutines a pending task is in, innermost last, and the future it waits on: what it waits for."""
    lines = []
    obj = task.get_coro()
    for _ in range(40):
        frame = getattr(obj, "cr_frame", None) or getattr(obj, "gi_frame", None)
        if frame is None:
            break
        lines.append(f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_qualname}")
        obj = getattr(obj, "cr_await", None) or getattr(obj, "gi_yieldfrom", None)
    waiter = getattr(task, "_fut_waiter", None)
    if waiter is not None:
        lines.append(f"waiting on {waiter!r}"[:300])
    return " -> ".join(lines) or repr(task)


async def finish_within(coro, timeout_s: float, what: str):
    """Await `coro` in this task for at most `timeout_s`; past that it is cancelled, and TimeoutError names `what` and
    where it waited (as asyncio.timeout does, with the where)."""
    task = asyncio.current_task()
    where: list[str] = []

    def expire() -> None:
        where.append(where_waiting(task))
        task.cancel()

    handle = asyncio.get_running_loop().call_later(timeout_s, expire)
    try:
        result = await coro
    except asyncio.CancelledError:
        if where and task.uncancel() == 0:  # our cancellation, and no one else's
            raise TimeoutError(f"{what} did not finish within {timeout_s:g} s; it waited at: {where[0]}") from None
        raise
    finally:
        handle.cancel()
    if where:  # cancelled, but it finished anyway (it swallowed the cancellation)
        task.uncancel()
    return result


async def cancel_and_wait(*tasks: asyncio.Task | None, timeout_s: float = 10.0, what: str = "") -> None:
    """Cancel the tasks and wait until they have ended, `timeout_s` at most (then TimeoutError names them and where
    they wait). `task.cancel(); await task` is not enough: on Python 3.11, asyncio.wait_for (in nats-py's request: a
    JetStream publish, a KV put) returns a result that arrived in the same loop turn and drops the cancellation, and
    the task goes on (a periodic loop: forever). So each is cancelled again until it ends."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    pending = {t for t in tasks if t is not None and not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        remaining = deadline - loop.time()
        if remaining <= 0:
            where = "; ".join(where_waiting(t) for t in pending)
            raise TimeoutError(f"{what or 'tasks'}: {len(pending)} task(s) still running {timeout_s:g} s after being "
                               f"cancelled: {where}")
        _, pending = await asyncio.wait(pending, timeout=min(0.1, remaining))


async def _connect_unless_stopped(service: Service) -> Bus | None:
    """The service's connection, or None when it was asked to stop first (a stop must not wait for NATS)."""
    settings = service.settings
    connecting = asyncio.ensure_future(Bus.connect(
        settings.nats_url, service.name, name=f"janus-{service.name}-{service.instance}", user=settings.nats_user,
        password=settings.nats_password, tls=tls_context(settings)))
    stopping = asyncio.ensure_future(service.stopped.wait())
    try:
        await asyncio.wait({connecting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        if not connecting.done():
            connecting.cancel()
    try:
        return await connecting
    except asyncio.CancelledError:
        if asyncio.current_task().cancelling():
            raise
        log.info("%s %s asked to stop while connecting to NATS", service.name, service.instance)
        return None


async def run_service(service: Service, *, install_signals: bool = True) -> None:
    """Run until SIGTERM/SIGINT (or the service sets `stopped`), then stop gracefully and drain the connection.

    Stopping is bounded: `service.stop()` gets `service.stop_timeout_s`, closing the connection CLOSE_TIMEOUT_S; past
    either, run_service raises TimeoutError naming what it waited for (after closing the connection anyway)."""
    setup_tracing(f"janus-{service.name}", instance=service.instance)
    bus = await _connect_unless_stopped(service)
    if bus is None:
        return
    service.bus = bus
    loop = asyncio.get_running_loop()
    if install_signals:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, service.stopped.set)
    lag_task = asyncio.create_task(service.loop_lag.run(), name=f"loop lag {service.name}")
    try:
        service.start_metrics()
        await service.start(bus)
        await service._serve_health(bus)  # healthy means started: `janus up` waits for this
        log.info("%s %s started", service.name, service.instance)
        await service.stopped.wait()
    finally:
        service.is_stopping = True
        log.info("%s %s stopping", service.name, service.instance)
        try:
            await finish_within(service.stop(), service.stop_timeout_s, f"{service.name} {service.instance}: stop()")
        finally:
            service.stop_metrics()
            await cancel_and_wait(lag_task, what=f"{service.name} loop lag monitor")
            await finish_within(bus.close(), CLOSE_TIMEOUT_S, f"{service.name} {service.instance}: closing NATS")
            if install_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)

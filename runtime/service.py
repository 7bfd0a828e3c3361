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
from .metrics import MetricsServer
from .settings import ClusterConfig, JanusSettings
from .tracing import setup_tracing

log = logging.getLogger("janus.service")


class Service(ABC):
    """Subclasses set `name` and implement start/stop. `stopped` is set when the service wants to end on its own."""

    name: str = "service"

    def __init__(self, settings: JanusSettings, cluster: ClusterConfig) -> None:
        self.settings = settings
        self.cluster = cluster
        self.bus: Bus | None = None
        self.started_monotonic = time.monotonic()
        self.is_stopping = False
        self.stopped = asyncio.Event()
        self.metrics_url = ""

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
        detail = {**self.health_detail(), **({"metrics": self.metrics_url} if self.metrics_url else {})}
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
    logging.basicConfig(level=getattr(logging, level, logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


async def run_service(service: Service, *, install_signals: bool = True) -> None:
    """Run until SIGTERM/SIGINT (or the service sets `stopped`), then stop gracefully and drain the connection."""
    settings = service.settings
    setup_tracing(f"janus-{service.name}")
    bus = await Bus.connect(settings.nats_url, service.name, name=f"janus-{service.name}-{service.instance}",
                            user=settings.nats_user, password=settings.nats_password, tls=tls_context(settings))
    service.bus = bus
    loop = asyncio.get_running_loop()
    if install_signals:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, service.stopped.set)
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
            await service.stop()
        finally:
            service.stop_metrics()
            await bus.close()
            if install_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)

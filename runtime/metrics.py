"""Prometheus metrics: one registry per process, every series named janus_<service>_*, served on /metrics.

The gateway serves /metrics on its own HTTP port; other services start a small HTTP listener on
JANUS_METRICS_PORT (0 picks a free port, reported in the service's health detail) so Prometheus scrapes every
process. Series are declared where they are used, through `counter` / `gauge` / `histogram` here, so a service
imported twice in one process (tests) does not register twice.
"""
from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer, _SilentHandler, make_server

REGISTRY = CollectorRegistry(auto_describe=True)
_lock = threading.Lock()
_made: dict[str, object] = {}

# latency buckets from 5 ms to 60 s: TTFT and request times of LLM serving
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
FAST_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


def _get(kind, name: str, doc: str, labels: tuple[str, ...], **kw):
    with _lock:
        metric = _made.get(name)
        if metric is None:
            metric = _made[name] = kind(name, doc, labels, registry=REGISTRY, **kw)
        return metric


def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
    return _get(Counter, name, doc, labels)


def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
    return _get(Gauge, name, doc, labels)


def histogram(name: str, doc: str, labels: tuple[str, ...] = (), buckets=LATENCY_BUCKETS_S) -> Histogram:
    return _get(Histogram, name, doc, labels, buckets=buckets)


STOP_POLL_S = 0.05


class MetricsServer:
    """/metrics over HTTP in a daemon thread (for services without an HTTP server of their own)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._server: WSGIServer = make_server(host, port, make_wsgi_app(REGISTRY), ThreadingWSGIServer,
                                                handler_class=_SilentHandler)
        self.host = host
        self.port = self._server.server_port
        # stop() waits for serve_forever to notice, up to one poll: the default 0.5 s held a stopping service's
        # event loop that long
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": STOP_POLL_S},
                                        name="janus-metrics", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

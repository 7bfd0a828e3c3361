"""Shared fixtures: a real nats-server for the session, buses on it, demo checkpoints, in-memory traces."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

# a hung or leaky test fails by itself, and what it left is stopped (tests/task_guard.py)
from tests.task_guard import (  # noqa: F401 - fixtures and hooks, registered by being here
    no_service_outlives_its_module,
    nothing_outlives_its_test,
    pytest_runtest_call,
    pytest_runtest_setup,
)

REPO_ROOT = Path(__file__).resolve().parent.parent


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory):
    from runtime.nats_server import EmbeddedNats

    server = EmbeddedNats(tmp_path_factory.mktemp("nats")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def nats_url(nats_server) -> str:
    return nats_server.url


@pytest.fixture
async def bus_factory(nats_url):
    """Open buses on the session's server; all are closed after the test."""
    from runtime.bus import Bus

    opened = []

    async def make(service: str = "test"):
        bus = await Bus.connect(nats_url, service)
        opened.append(bus)
        return bus

    yield make
    for bus in opened:
        await bus.close()


@pytest.fixture(scope="session")
def demo_models_dir(tmp_path_factory) -> Path:
    """Demo checkpoints, written once per session (or taken from JANUS_TEST_MODELS_DIR to reuse across runs)."""
    from worker.engine.demo import make_demo_models

    cached = os.environ.get("JANUS_TEST_MODELS_DIR")
    root = Path(cached) if cached else tmp_path_factory.mktemp("models")
    make_demo_models(root, ["demo-tiny", "demo-small"])
    return root


@pytest.fixture(scope="session")
def span_exporter():
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from runtime.tracing import setup_tracing

    exporter = InMemorySpanExporter()
    setup_tracing("janus-tests", exporter)
    return exporter

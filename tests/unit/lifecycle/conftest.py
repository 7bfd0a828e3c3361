"""Fixtures for the lifecycle tests: real CPU page pools (memfd), real engines on the tiny demo model, real Mooncake
transfer engines over TCP loopback. The worker shell is replaced by `RecordingHost`, which records what the
controller asks of it; the real shell over a real nats-server is what tests/bus/test_lifecycle_*.py drive."""
from __future__ import annotations

from pathlib import Path

import pytest
from lifecycle_fixtures import Worker

from tests.torch_threads import one_torch_thread  # noqa: F401 - an autouse fixture


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    from worker.engine.demo import make_demo_models

    return make_demo_models(tmp_path_factory.mktemp("lifecycle_models"), ["demo-tiny"])["demo-tiny"]


@pytest.fixture
def make_worker(tiny_dir):
    made: list[Worker] = []

    def make(worker_id: str = "w0", model_dir: Path | None = None, **kw) -> Worker:
        w = Worker(worker_id, model_dir or tiny_dir, **kw)
        made.append(w)
        return w

    yield make
    for w in made:
        w.close()


@pytest.fixture(scope="session")
def tiny_dir_without_checkpoint(tiny_dir, tmp_path_factory) -> Path:
    """The tiny model's folder minus its safetensors: an engine can be built there but never read weights."""
    import shutil

    folder = tmp_path_factory.mktemp("no_checkpoint") / tiny_dir.name
    shutil.copytree(tiny_dir, folder, ignore=shutil.ignore_patterns("*.safetensors", "*.safetensors.index.json"))
    return folder


@pytest.fixture(scope="session")
def small_dir(tiny_dir) -> Path:
    from worker.engine.demo import make_demo_models

    return make_demo_models(tiny_dir.parent, ["demo-small"])["demo-small"]

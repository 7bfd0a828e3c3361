"""Fixtures for the engine tests: demo checkpoints written once per session, one torch thread per test."""
from __future__ import annotations

import pytest

from tests.torch_threads import one_torch_thread  # noqa: F401 - an autouse fixture


@pytest.fixture(scope="session")
def demo_root(tmp_path_factory):
    return tmp_path_factory.mktemp("demo_models")


@pytest.fixture(scope="session")
def tiny_model_dir(demo_root):
    from worker.engine.demo import make_demo_models

    return make_demo_models(demo_root, ["demo-tiny"])["demo-tiny"]



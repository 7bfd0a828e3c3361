"""Fixtures for the engine tests: demo checkpoints written once per session, one torch thread per test."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def demo_root(tmp_path_factory):
    return tmp_path_factory.mktemp("demo_models")


@pytest.fixture(scope="session")
def tiny_model_dir(demo_root):
    from worker.engine.demo import make_demo_models

    return make_demo_models(demo_root, ["demo-tiny"])["demo-tiny"]


@pytest.fixture(autouse=True)
def _one_torch_thread():
    # The CI box has 2 cores shared with other jobs: OpenMP threads that spin-wait for a busy core make tiny
    # matmuls 100x slower, so every engine test runs single-threaded.
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)

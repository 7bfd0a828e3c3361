"""Small real CPU pools (memfd + mmap) for the xTensor tests: 64 KiB pages keep populate and hole punching cheap."""
from __future__ import annotations

from typing import Callable, Iterator

import pytest

from tests.torch_threads import one_torch_thread  # noqa: F401 - an autouse fixture
from worker.xtensor import XTensor

from .xtensor_fixtures import make_config


@pytest.fixture
def open_pool() -> Iterator[Callable[..., XTensor]]:
    """open_pool(num_pages, **config overrides) -> a CPU XTensor, closed after the test."""
    pools: list[XTensor] = []

    def _open(num_pages: int, **overrides) -> XTensor:
        config = make_config(**overrides)
        pool = XTensor.open("cpu", num_pages * config.page_size_bytes, config)
        pools.append(pool)
        return pool

    yield _open
    for pool in pools:
        pool.close()


@pytest.fixture(scope="session")
def demo_model_dirs(tmp_path_factory):
    """Two different random-weight Qwen2 checkpoints (worker/engine/demo.py), written once per session."""
    from worker.engine.demo import make_demo_models

    return make_demo_models(tmp_path_factory.mktemp("xtensor_demo_models"), ["demo-tiny", "demo-small"])

"""XTensor: one device's page pool, shared by the weights and KV caches of every model on the worker.

Implements both seams of worker/engine/memory.py (KVPageSource: kv_pages.py; WeightPageSource: weight_pages.py) for any
number of owners (engines), plus what the worker shell and the lifecycle layer need: heartbeat counters, the global
region a transfer engine registers (pool_base.py), sleep/wake of an owner (lifecycle.py), and compaction: pages
moved under live views so free pages stay in one run (compaction.py).

Placement: KV pages from the low end of the pool (lowest free page first), weight pages from the high end (a
best-fit contiguous run, else the longest runs there are). Every page also stays mapped in the global region at
base + page_id * page_size, so a peer can address it; an owner sees its pages through its own views, which are
reserved once and never move (so its tensors stay valid across KV churn, sleep and wake).
"""
from __future__ import annotations

from .backends import open_backend
from .compaction import CompactionMixin
from .config import XTensorConfig
from .kv_pages import KvPagesMixin
from .lifecycle import LifecycleMixin
from .pool_base import KV_CACHED, PoolExhaustedError, XTensorError, XTensorStats
from .weight_pages import WeightPagesMixin

__all__ = ["KV_CACHED", "PoolExhaustedError", "XTensor", "XTensorError", "XTensorStats"]


class XTensor(KvPagesMixin, WeightPagesMixin, LifecycleMixin, CompactionMixin):
    """The page pool of one device. Build with `XTensor.open(device, pool_bytes)`; close with `close()` (or use it
    as a context manager). Thread-safe; several engines share one instance, each under its own owner name."""

    @classmethod
    def open(cls, device: str, pool_bytes: int, config: XTensorConfig | None = None) -> "XTensor":
        """The pool of `device` ("cpu", "cuda:N", "npu:N") holding pool_bytes // page_size pages."""
        config = config or XTensorConfig()
        num_pages = pool_bytes // config.page_size_bytes
        if num_pages < 1:
            raise ValueError(f"pool_bytes={pool_bytes} holds no {config.page_size_bytes}-byte page")
        return cls(open_backend(device, num_pages, config.page_size_bytes), config)

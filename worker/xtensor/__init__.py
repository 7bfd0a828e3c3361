"""xTensor: one page pool per device for the weights and KV caches of every model on a worker.

    from worker.xtensor import XTensor
    pool = XTensor.open("cpu", pool_bytes=1 << 30)      # or "cuda:0", "npu:0"
    engine_a = LLMEngine(..., kv_source=pool, weight_source=pool)   # several engines share one pool
    pool.counters()                                     # contracts.worker.PageCounters for the heartbeat
    pool.sleep("model-a"); pool.wake("model-a")         # release / re-map pages, views stay valid
    pool.global_region                                  # what the Mooncake transfer engine registers

See docs/xtensor.md.
"""
from .backends import BackendError, BackendUnavailableError, best_available_device, parse_device
from .config import XTensorConfig
from .page_allocator import PageAllocator
from .pool import KV_CACHED, PoolExhaustedError, XTensor, XTensorError, XTensorStats
from .region import GlobalRegion

PagePool = XTensor  # the name the worker shell uses for "the device's page pool"

__all__ = ["BackendError", "BackendUnavailableError", "GlobalRegion", "KV_CACHED", "PageAllocator", "PagePool",
           "PoolExhaustedError", "XTensor", "XTensorConfig", "XTensorError", "XTensorStats", "best_available_device",
           "parse_device"]

"""The shared state of a device's page pool and the helpers its parts use (see pool.py for the whole).

One lock guards the bookkeeping: the allocator (free pages), the page table (who owns each page) and every owner's
views. Map/unmap calls that may be slow run outside the lock with their pages marked in flight; the few made under
it (on-demand mapping after a cache miss, taking back idle cached pages when the pool ran dry) are the fallbacks.
"""
from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING, Iterable, Sequence

from contracts.worker import PageCounters

from .backends import PageBackend, parse_device
from .config import XTensorConfig
from .kv_refill import KvRefillThread
from .page_allocator import PageAllocator, runs_of
from .page_table import KV, WEIGHTS, PageTable
from .region import GlobalRegion
from .views import KvView, Owner, OwnerState, mapping_runs, slot_runs

if TYPE_CHECKING:
    import torch

KV_CACHED = "kv_cached"  # heartbeat kind: mapped into a model's KV view, idle in its cache


class XTensorError(RuntimeError):
    """Misuse of the pool: unknown owner, wrong state, pages the owner does not hold."""


class PoolExhaustedError(XTensorError, MemoryError):
    """Not enough free pages (after taking back idle cached KV pages) for a weight load or a wake."""


@dataclasses.dataclass
class XTensorStats:
    num_kv_cache_hits: int = 0  # acquisitions served from the mapped cache: no driver call
    num_kv_cache_misses: int = 0  # acquisitions that had to map (or wait for a refill) on the request path
    num_kv_pages_refilled: int = 0
    num_kv_pages_trimmed: int = 0
    num_kv_pages_reclaimed: int = 0  # idle cached pages unmapped from one model because the pool ran dry
    num_pages_compacted: int = 0  # pages moved under their views to close holes (compaction.py)
    num_pages_copied: int = 0  # of those, pages whose contents were copied (in use by an engine, or weights)


class PoolBase:
    """State and helpers shared by the KV, weight and lifecycle parts of XTensor (no public seam of its own)."""

    def __init__(self, backend: PageBackend, config: XTensorConfig | None = None) -> None:
        config = config or XTensorConfig()
        if backend.page_size_bytes != config.page_size_bytes:
            raise ValueError(f"backend pages are {backend.page_size_bytes} B, config says {config.page_size_bytes} B")
        self.config = config
        self._backend = backend
        self._page_size = backend.page_size_bytes
        self._low, self._high = config.kv_low_watermark_pages, config.kv_high_watermark_pages
        self._is_populate, self._is_discard_on_free = config.is_populate, config.is_discard_on_free
        self._is_discard_on_kv_trim = config.is_discard_on_free and config.is_discard_on_kv_trim
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._allocator = PageAllocator(backend.num_pages)
        self._pages = PageTable(backend.num_pages)
        self._owners: dict[str, Owner] = {}
        self._stats = XTensorStats()
        self._refill: KvRefillThread | None = None
        self._is_closed = False
        self._num_pages_trimming = 0  # KV pages on their way back to the free pool (refill thread)
        self._num_waiting = 0  # threads in _wait_for_in_flight: skip notify_all on the hot path when none

    # ---- properties -------------------------------------------------------------------------------------------
    @property
    def device(self) -> str:
        return str(self._backend.device)

    @property
    def page_size_bytes(self) -> int:
        return self._page_size

    @property
    def num_pages(self) -> int:
        return self._backend.num_pages

    @property
    def backend(self) -> PageBackend:
        """The device backend (for benchmarks and diagnostics; map pages through the pool, not through this)."""
        return self._backend

    @property
    def global_region(self) -> GlobalRegion:
        return GlobalRegion(self._backend.global_base_address, self.num_pages * self._page_size, self._page_size)

    def global_view(self, offset_bytes: int, num_bytes: int) -> "torch.Tensor":
        """A zero-copy uint8 tensor over [offset, offset + num_bytes) of the global region."""
        if offset_bytes < 0 or num_bytes <= 0 or offset_bytes + num_bytes > self.num_pages * self._page_size:
            raise ValueError(f"[{offset_bytes}, {offset_bytes + num_bytes}) is outside the global region")
        return self._backend.tensor(self._backend.global_base_address + offset_bytes, num_bytes)

    # ---- counters and diagnostics -----------------------------------------------------------------------------
    def counters(self) -> PageCounters:
        """The heartbeat's page counters: kinds per owner are "weights", "kv" (held by the engine) and "kv_cached"
        (mapped, idle in the owner's cache, taken back when the pool runs dry)."""
        with self._lock:
            pages_by_model: dict[str, dict[str, int]] = {}
            for (owner, kind), count in self._pages.counts().items():
                pages_by_model.setdefault(owner, {})[kind] = count
            for name, record in self._owners.items():
                kinds = pages_by_model.setdefault(name, {})
                if record.kv is not None and KV in kinds:
                    num_in_use = len(record.kv.in_use_slots)
                    kinds[KV_CACHED] = kinds[KV] - num_in_use
                    kinds[KV] = num_in_use
            return PageCounters(
                page_size_bytes=self._page_size,
                num_pages_total=self.num_pages,
                num_pages_free=self._allocator.num_free,
                fragmentation=self._allocator.fragmentation(),
                pages_by_model=pages_by_model,
            )

    def stats(self) -> XTensorStats:
        with self._lock:
            return dataclasses.replace(self._stats)

    def owners(self) -> list[str]:
        with self._lock:
            return list(self._owners)

    def page_table_snapshot(self) -> list[tuple[str, str] | None]:
        """(owner, "weights" | "kv") or None for each physical page: for tests and debugging."""
        with self._lock:
            return self._pages.snapshot()

    def free_runs(self) -> list[tuple[int, int]]:
        with self._lock:
            return self._allocator.free_runs()

    # ---- teardown ---------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the refill thread, release every owner and the device pool. Tensors handed out become invalid."""
        if self._refill is not None:
            self._refill.stop()
        with self._lock:
            if self._is_closed:
                return
            names = list(self._owners)
        for name in names:
            self.remove_owner(name)
        with self._lock:
            self._is_closed = True
        self._backend.close()

    def __enter__(self) -> "PoolBase":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---- internals (callers hold the lock unless noted) -------------------------------------------------------
    def _reclaim_idle_kv(self, num_pages: int, exclude: str | None) -> int:
        """Unmap idle cached KV pages of other owners (most cached first, highest pages first) into the free pool.
        A driver call under the lock, but only when the pool has run dry."""
        num_reclaimed = 0
        while num_reclaimed < num_pages:
            candidates = [r for r in self._owners.values() if r.name != exclude and r.kv is not None
                          and r.kv.cached_slots and r.state is OwnerState.ACTIVE]
            if not candidates:
                break
            victim = max(candidates, key=lambda r: len(r.kv.cached_slots))
            kv = victim.kv
            count = min(num_pages - num_reclaimed, len(kv.cached_slots))
            slots = kv.cached_slots[:count]
            del kv.cached_slots[:count]
            self._unmap_slots(kv.base_address, slots)
            self._free_kv_slots(victim.name, kv, slots)
            num_reclaimed += count
        self._stats.num_kv_pages_reclaimed += num_reclaimed
        return num_reclaimed

    def _take_kv_slots(self, owner: str, kv: KvView, num_pages: int) -> tuple[list[int], list[int]]:
        """(slots, page ids), num_pages of each known to be free: the lowest free pages, owned by `owner` and recorded
        behind its lowest free slots, not mapped yet. `_free_kv_slots` gives them back."""
        page_ids = self._allocator.take_low(num_pages)
        self._pages.assign(page_ids, owner, KV)
        slots = kv.pop_free_slots(num_pages)
        slot_page = kv.slot_page
        for slot, page_id in zip(slots, page_ids):
            slot_page[slot] = page_id
        return slots, page_ids

    def _free_kv_slots(self, owner: str, kv: KvView, slots: list[int]) -> None:
        """Slots unmapped (or never mapped): their pages back to the free pool, the slots back to the owner's free
        heap. The page table still checks ownership and the allocator double frees, one page or many."""
        slot_page = kv.slot_page
        if len(slots) == 1:  # the usual trim: one page, no list and no run grouping
            page_id = slot_page[slots[0]]
            self._pages.unassign_one(page_id, owner, KV)
            self._allocator.free_run(page_id, 1)
        else:
            page_ids = [slot_page[slot] for slot in slots]
            self._pages.unassign(page_ids, owner, KV)
            self._allocator.free_pages(page_ids)
        kv.push_free_slots(slots)

    def _make_free(self, num_pages: int) -> bool:
        """Whether num_pages are free, after taking back idle cached KV pages and waiting for pages the refill
        thread is returning. For lifecycle operations (weights, wake), not the request path."""
        while self._allocator.num_free < num_pages:
            self._reclaim_idle_kv(num_pages - self._allocator.num_free, exclude=None)
            if self._allocator.num_free >= num_pages or not self._num_pages_trimming:
                break
            self._wait_for_in_flight()
        return self._allocator.num_free >= num_pages

    def _take_weight_pages(self, owner: str, num_pages: int) -> list[int]:
        if not self._make_free(num_pages):
            raise PoolExhaustedError(f"{owner!r} needs {num_pages} pages for weights; {self._allocator.num_free} of "
                                     f"{self.num_pages} are free")
        start = self._allocator.take_high_run(num_pages)
        runs = [(start, num_pages)] if start is not None else self._allocator.take_high_scattered(num_pages)
        page_ids = [page_id for run_start, count in runs for page_id in range(run_start, run_start + count)]
        self._pages.assign(page_ids, owner, WEIGHTS)
        return page_ids

    def _map_slots(self, base_address: int, slot_pages: Iterable[tuple[int, int]]) -> None:
        page = self._page_size
        pairs = list(slot_pages)
        if len(pairs) == 1:  # the common on-demand case: skip run grouping
            (slot, page_id), = pairs
            self._backend.map_pages(base_address + slot * page, page_id, 1, is_populate=self._is_populate)
            return
        for first_slot, first_page, count in mapping_runs(pairs):
            self._backend.map_pages(base_address + first_slot * page, first_page, count,
                                    is_populate=self._is_populate)

    def _unmap_slots(self, base_address: int, slots: Sequence[int]) -> None:
        if len(slots) == 1:  # the usual trim: skip run grouping
            self._backend.unmap_pages(base_address + slots[0] * self._page_size, 1)
            return
        for first_slot, count in slot_runs(slots):
            self._backend.unmap_pages(base_address + first_slot * self._page_size, count)

    def _discard(self, page_ids: list[int]) -> None:
        if self._is_discard_on_free and page_ids:
            for first_page, count in runs_of(sorted(page_ids)):
                self._backend.discard_pages(first_page, count)

    def _swap_down_idle_kv(self, max_moves: int) -> int:
        """Lock held: move idle cached KV pages down into holes. compaction.py provides it; a bare pool moves none."""
        return 0

    def _wait_for_in_flight(self, timeout_s: float | None = None) -> None:
        """Wait (lock held) until the refill thread commits some in-flight work."""
        self._num_waiting += 1
        try:
            self._cond.wait(timeout_s)
        finally:
            self._num_waiting -= 1

    def _require_owner(self, owner: str) -> Owner:
        record = self._owners.get(owner)
        if record is None:
            raise XTensorError(f"unknown owner {owner!r} on {self.device}")
        return record

    def _check_lifecycle_ready(self, record: Owner) -> None:
        if record.is_busy or record.state is not OwnerState.ACTIVE:
            state = "busy" if record.is_busy else record.state.value
            raise XTensorError(f"{record.name!r} is {state}; wait for it (or wake it) first")

    def _check_device(self, device: str) -> None:
        if parse_device(str(device)) != self._backend.device:
            raise ValueError(f"this pool serves {self.device}, not {device!r}")

    def _check_open(self) -> None:
        if self._is_closed:
            raise XTensorError("the pool is closed")

    def _start_refill_thread(self) -> None:
        with self._lock:
            if self._refill is not None or not self.config.is_background_refill or self._is_closed:
                return
            self._refill = KvRefillThread(self._kv_maintenance_pass, self.config.refill_poll_s)
            self._refill.start()

    def _wake_refill(self) -> None:
        if self._refill is not None:
            self._refill.wake()

"""The KV side of the pool (KVPageSource): per-owner views, the mapped-page cache, and its maintenance.

The request path (acquire/release) only moves slots between lists under the pool lock; maintenance (the refill
thread, or `run_kv_maintenance`) maps pages into caches below the low watermark and gives back idle pages above the
high one, outside the lock.
"""
from __future__ import annotations

from heapq import heappop
from typing import TYPE_CHECKING, Sequence

from .page_table import KV
from .pool_base import PoolBase, XTensorError
from .views import KvView, Owner, OwnerState

if TYPE_CHECKING:
    import torch


class KvPagesMixin(PoolBase):
    _IDLE_SWAPS_PER_PASS = 4  # idle cached pages moved down into holes per pass (compaction.py), a few at a time

    def reserve_kv(self, owner: str, max_num_pages: int, device: str) -> "torch.Tensor":
        """Reserve the owner's KV view (max_num_pages pages, none backed yet). Calling again with the same size
        returns the same tensor."""
        self._check_device(device)
        if max_num_pages <= 0:
            raise ValueError(f"max_num_pages must be > 0, got {max_num_pages}")
        with self._lock:
            self._check_open()
            record = self._owners.setdefault(owner, Owner(owner))
            if record.kv is not None:
                if record.kv.max_num_pages != max_num_pages:
                    raise XTensorError(f"{owner!r} already reserved {record.kv.max_num_pages} KV pages, "
                                       f"not {max_num_pages}")
                return record.kv.tensor
            base = self._backend.reserve(max_num_pages)
            record.kv = KvView(base, max_num_pages, self._backend.tensor(base, max_num_pages * self._page_size))
            tensor = record.kv.tensor
        self._start_refill_thread()
        self._wake_refill()  # fill the new cache up to its high watermark before the first request
        return tensor

    def acquire_kv_pages(self, owner: str, num_pages: int) -> list[int] | None:
        """Backed page indices of the owner's KV view, or None when they cannot all be had (nothing taken then).
        From the mapped cache when it holds enough (no driver call); else maps on the spot (counted as a miss)."""
        if num_pages <= 0:
            if num_pages == 0:
                return []
            raise ValueError(f"num_pages must be >= 0, got {num_pages}")
        with self._lock:
            record = self._owners.get(owner)
            if record is None or record.kv is None or record.state is not OwnerState.ACTIVE:
                self._active_kv(owner)  # raises the right error
            kv = record.kv
            cached = kv.cached_slots
            if num_pages <= len(cached):
                # The cache's tail holds the lowest physical pages: KV stays packed at the low end of the pool.
                if num_pages == 1:
                    slots = [cached.pop()]
                    kv.in_use_slots.add(slots[0])
                else:
                    slots = cached[-num_pages:]
                    del cached[-num_pages:]
                    slots.reverse()
                    kv.in_use_slots.update(slots)
                self._stats.num_kv_cache_hits += 1
                if len(cached) < self._low and self._refill is not None:
                    self._refill.wake()
                return slots
            if num_pages == 1 and not kv.num_refilling and kv.free_slots:
                slot = self._map_one_kv_page(owner, kv)
                if slot is not None:
                    return [slot]
            return self._acquire_kv_mapping(owner, kv, num_pages)

    def release_kv_pages(self, owner: str, page_indices: Sequence[int]) -> None:
        """Back to the owner's mapped cache; beyond its high watermark the refill thread returns them to the pool,
        where any model may take them (and a model short of pages takes idle cached ones at once)."""
        with self._lock:
            record = self._require_owner(owner)
            kv = record.kv
            if kv is None:
                raise XTensorError(f"{owner!r} has no KV reservation")
            slots = list(page_indices)
            if len(set(slots)) != len(slots):
                raise ValueError(f"page indices listed twice: {sorted(slots)}")
            if record.state is OwnerState.ACTIVE:
                held = kv.in_use_slots
            elif record.state is OwnerState.ASLEEP:
                held = kv.slept_in_use_slots
            else:
                raise XTensorError(f"{owner!r} is {record.state.value}: its KV pages cannot change meanwhile")
            not_held = [slot for slot in slots if slot not in held]
            if not_held:
                raise XTensorError(f"{owner!r} does not hold KV pages {not_held}")
            if record.state is not OwnerState.ACTIVE:
                held.difference_update(slots)  # asleep: forget them, so wake does not map them again
                return
            held.difference_update(slots)
            for slot in slots:
                kv.cache_insert(slot)
            if len(kv.cached_slots) > self._high and self._refill is not None:
                self._refill.wake()

    def kv_page_global_offset(self, owner: str, page_index: int) -> int:
        with self._lock:
            kv = self._active_kv(owner)
            if page_index not in kv.in_use_slots:
                raise XTensorError(f"{owner!r} does not hold KV page {page_index}")
            return kv.slot_page[page_index] * self._page_size

    # ---- cache maintenance ------------------------------------------------------------------------------------
    def run_kv_maintenance(self) -> None:
        """Bring every owner's mapped KV cache within its watermarks now, and wait for the refill thread's in-flight
        work. What the thread does on its own; the simulator and deterministic tests call it directly."""
        while True:
            while self._kv_maintenance_pass():
                pass
            with self._lock:
                if not any(r.kv is not None and r.kv.num_in_flight for r in self._owners.values()):
                    return
                self._wait_for_in_flight(0.1)

    def _kv_maintenance_pass(self) -> bool:
        """One pass over every owner (the refill thread's work). Under the lock: each owner's cache is planned
        against the watermarks and the pages planned are marked in flight, and idle cached pages move down into
        holes; outside it, the maps and unmaps, each committed under the lock again. True when it did any work.

        The watermark rule: above the high watermark, the excess idle pages go back (the highest pages first);
        below the low one (counting pages being mapped), pages are mapped up to the high one, as far as the owner's
        unmapped slots and the pool's free pages allow. A refill never steals from other models: two caches would
        chase each other."""
        refills: list[tuple[str, KvView, list[tuple[int, int]]]] = []
        trims: list[tuple[str, KvView, list[int]]] = []
        with self._lock:
            if self._is_closed:
                return False
            low, high = self._low, self._high
            has_idle_cache = False  # whether an owner not planned below holds idle pages swap-down could move
            for name, record in self._owners.items():
                kv = record.kv
                if kv is None or record.state is not OwnerState.ACTIVE:
                    continue
                num_cached = len(kv.cached_slots)
                if num_cached > high:
                    trims.append((name, kv, self._start_trim(kv, num_cached - high)))
                    continue
                num_coming = num_cached + kv.num_refilling
                if num_coming < low:
                    num_map = min(high - num_coming, len(kv.free_slots), self._allocator.num_free)
                    if num_map:
                        refills.append((name, kv, self._start_refill(name, kv, num_map)))
                        continue
                if num_cached:
                    has_idle_cache = True
            # Swap-down moves only idle pages of owners with nothing in flight, and the owners planned above are in
            # flight now: when no other owner holds idle pages (one model trimming or refilling, say), it has nothing
            # it could move, and is not called.
            num_swapped = self._swap_down_idle_kv(self._IDLE_SWAPS_PER_PASS) if has_idle_cache else 0
        for name, kv, pairs in refills:
            self._finish_refill(name, kv, pairs)
        for name, kv, slots in trims:
            self._finish_trim(name, kv, slots)
        return bool(refills or trims or num_swapped)

    def _start_refill(self, owner: str, kv: KvView, num_pages: int) -> list[tuple[int, int]]:
        """Lock held: take the lowest free pages and free slots for a refill, in flight until `_finish_refill`."""
        slots, page_ids = self._take_kv_slots(owner, kv, num_pages)
        kv.num_refilling += num_pages
        return list(zip(slots, page_ids))

    def _start_trim(self, kv: KvView, num_pages: int) -> list[int]:
        """Lock held: take the idle cached slots on the highest pages out of the cache, in flight until
        `_finish_trim` gives their pages back (the highest go back, so KV stays packed at the low end)."""
        cached = kv.cached_slots
        slots = cached[:num_pages]
        del cached[:num_pages]
        kv.num_trimming += num_pages
        self._num_pages_trimming += num_pages
        return slots

    def _finish_refill(self, owner: str, kv: KvView, pairs: list[tuple[int, int]]) -> None:
        # Populating maps cost real time per page (zeroing, page tables): hand each page to the cache as soon as it
        # is mapped, so a request waiting on an empty cache waits for one page, not for the whole refill.
        chunks = [[pair] for pair in pairs] if self._is_populate else [pairs]
        for index, chunk in enumerate(chunks):
            try:
                self._map_slots(kv.base_address, chunk)
            except BaseException:
                rest = [slot for later in chunks[index:] for slot, _ in later]
                with self._lock:
                    kv.num_refilling -= len(rest)
                    self._free_kv_slots(owner, kv, rest)
                    self._cond.notify_all()
                raise
            with self._lock:
                kv.num_refilling -= len(chunk)
                kv.cache_insert_many(slot for slot, _ in chunk)
                self._stats.num_kv_pages_refilled += len(chunk)
                if self._num_waiting:
                    self._cond.notify_all()

    def _finish_trim(self, owner: str, kv: KvView, slots: list[int]) -> None:
        """Unmap trimmed slots outside the lock, then give their pages back to the pool (or, if the unmap failed,
        the slots back to the cache). In flight: no other thread touches these slots meanwhile."""
        num_slots = len(slots)
        try:
            self._unmap_slots(kv.base_address, slots)
            if self._is_discard_on_kv_trim:
                self._discard([kv.slot_page[slot] for slot in slots])
        except BaseException:
            with self._lock:
                kv.num_trimming -= num_slots
                self._num_pages_trimming -= num_slots
                for slot in slots:
                    kv.cache_insert(slot)
                self._cond.notify_all()
            raise
        with self._lock:
            kv.num_trimming -= num_slots
            self._num_pages_trimming -= num_slots
            self._free_kv_slots(owner, kv, slots)
            self._stats.num_kv_pages_trimmed += num_slots
            if self._num_waiting:
                self._cond.notify_all()

    # ---- internals (callers hold the lock) --------------------------------------------------------------------
    def _map_one_kv_page(self, owner: str, kv: KvView) -> int | None:
        """A cache miss for one page with a free slot at hand: the leanest on-demand map. None (nothing taken) when
        the pool has no free page: the general path reclaims or waits."""
        page_id = self._allocator.take_lowest()
        if page_id is None:
            return None
        self._pages.assign_one(page_id, owner, KV)
        slot = heappop(kv.free_slots)
        kv.slot_page[slot] = page_id
        try:
            self._backend.map_pages(kv.base_address + slot * self._page_size, page_id, 1,
                                    is_populate=self._is_populate)
        except BaseException:
            self._free_kv_slots(owner, kv, [slot])
            raise
        kv.in_use_slots.add(slot)
        self._stats.num_kv_cache_misses += 1
        if self._refill is not None:
            self._refill.wake()
        return slot

    def _acquire_kv_mapping(self, owner: str, kv: KvView, num_pages: int) -> list[int] | None:
        while True:
            cached = kv.cached_slots
            if num_pages <= len(cached):  # a refill landed while we waited
                slots = cached[-num_pages:]
                del cached[-num_pages:]
                kv.in_use_slots.update(slots)
                self._stats.num_kv_cache_misses += 1
                self._wake_refill()
                return slots[::-1]
            num_new = num_pages - len(cached)
            if self._allocator.num_free < num_new:
                self._reclaim_idle_kv(num_new - self._allocator.num_free, exclude=owner)
            is_short = num_new > len(kv.free_slots) or self._allocator.num_free < num_new
            if not is_short:
                break
            # Pages (and this owner's slots) in flight on the refill thread come back within one map/unmap call:
            # wait for them rather than answer None, which would make the engine preempt a request for nothing.
            if not (kv.num_in_flight or self._num_pages_trimming):
                return None
            self._wait_for_in_flight()
            kv = self._active_kv(owner)
        slots, page_ids = self._take_kv_slots(owner, kv, num_new)
        try:
            if num_new == 1:  # the usual miss: one backend call, no run grouping
                self._backend.map_pages(kv.base_address + slots[0] * self._page_size, page_ids[0], 1,
                                        is_populate=self._is_populate)
            else:
                self._map_slots(kv.base_address, zip(slots, page_ids))
        except BaseException:
            self._free_kv_slots(owner, kv, slots)
            raise
        if cached:
            slots = cached[::-1] + slots
            cached.clear()
        kv.in_use_slots.update(slots)
        self._stats.num_kv_cache_misses += 1
        if self._refill is not None:
            self._refill.wake()
        return slots

    def _active_kv(self, owner: str) -> KvView:
        record = self._owners.get(owner)
        if record is None or record.kv is None:
            raise XTensorError(f"{owner!r} has no KV reservation: call reserve_kv first")
        if record.state is not OwnerState.ACTIVE:
            raise XTensorError(f"{owner!r} is {record.state.value}: wake it before using its KV pages")
        return record.kv

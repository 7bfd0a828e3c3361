"""Sleep and wake of an owner at the memory level, and its removal.

Sleep releases every page of the owner (weights and KV, contents lost) and keeps its views reserved, so the tensors
its engine holds stay valid objects; wake maps fresh pages under the same views (all or nothing). The lifecycle layer
above copies weights back in (host copy or a peer's pages) and verifies them.
"""
from __future__ import annotations

import heapq

from .page_table import KV, WEIGHTS
from .pool_base import PoolBase, PoolExhaustedError, XTensorError
from .views import Owner, OwnerState


class LifecycleMixin(PoolBase):
    def sleep(self, owner: str) -> None:
        """Release all the owner's weight and KV pages (contents are lost) but keep its views reserved: the engine's
        tensors stay valid objects, and touching them faults until `wake`. KV pages the engine held are remembered
        and backed again on wake, so its block tables stay true."""
        with self._lock:
            record = self._require_owner(owner)
            if record.state is OwnerState.ASLEEP:
                return
            self._check_lifecycle_ready(record)
            record.state = OwnerState.SLEEPING  # from here on the request path refuses this owner
            kv_slots: list[int] = []
            kv = record.kv
            if kv is not None:
                while kv.num_in_flight:
                    self._wait_for_in_flight()
                kv_slots = [*kv.in_use_slots, *kv.cached_slots]
                kv.slept_in_use_slots = set(kv.in_use_slots)
                kv.in_use_slots.clear()
                kv.cached_slots.clear()
            kv_pages = [kv.slot_page[slot] for slot in kv_slots] if kv is not None else []
            weights = record.weights
            weight_pages = list(weights.slot_page) if weights is not None and weights.slot_page is not None else []
        # A driver failure below propagates and leaves the owner SLEEPING with its pages still accounted to it.
        if kv is not None and kv_slots:
            self._unmap_slots(kv.base_address, kv_slots)
        if weight_pages:
            self._unmap_slots(weights.base_address, range(len(weight_pages)))
        self._discard(kv_pages + weight_pages)
        with self._lock:
            if kv_slots:
                self._free_kv_slots(owner, kv, kv_slots)
            if weight_pages:
                self._pages.unassign(weight_pages, owner, WEIGHTS)
                self._allocator.free_pages(weight_pages)
                weights.slot_page = None
            record.state = OwnerState.ASLEEP

    def wake(self, owner: str) -> None:
        """Map fresh pages under the owner's views again: its weights (contents undefined: the lifecycle layer copies
        them in) and the KV pages its engine held when it went to sleep. All or nothing: PoolExhaustedError leaves it
        asleep."""
        with self._lock:
            record = self._require_owner(owner)
            if record.state is OwnerState.ACTIVE:
                return
            if record.state is not OwnerState.ASLEEP or record.is_busy:
                raise XTensorError(f"{owner!r} is {record.state.value}; wake needs it asleep")
            record.state = OwnerState.WAKING  # claimed: a second wake, or a sleep, is refused meanwhile
            weights = record.weights if record.weights is not None and record.weights.is_kept_on_wake else None
            num_weight_pages = -(-weights.num_bytes // self._page_size) if weights is not None else 0
            kv = record.kv
            kv_slots = sorted(kv.slept_in_use_slots) if kv is not None else []
            num_needed = num_weight_pages + len(kv_slots)
            if not self._make_free(num_needed):
                record.state = OwnerState.ASLEEP
                raise PoolExhaustedError(f"waking {owner!r} needs {num_needed} pages; {self._allocator.num_free} of "
                                         f"{self.num_pages} are free")
            weight_pages = self._take_weight_pages(owner, num_weight_pages) if num_weight_pages else []
            kv_pages = self._allocator.take_low(len(kv_slots)) or []
            if kv_slots:
                self._pages.assign(kv_pages, owner, KV)
                for slot, page_id in zip(kv_slots, kv_pages):
                    kv.slot_page[slot] = page_id
                taken = set(kv_slots)
                kv.free_slots = [slot for slot in kv.free_slots if slot not in taken]
                heapq.heapify(kv.free_slots)
        try:
            if weight_pages:
                self._map_slots(weights.base_address, enumerate(weight_pages))
            if kv_slots:
                self._map_slots(kv.base_address, zip(kv_slots, kv_pages))
        except BaseException:
            with self._lock:
                self._give_back_after_failed_wake(record, weight_pages, kv_slots, kv_pages)
            raise
        with self._lock:
            if weight_pages:
                weights.slot_page = weight_pages
            for slot in kv_slots:
                if slot in kv.slept_in_use_slots:
                    kv.in_use_slots.add(slot)
                else:  # released while it slept
                    kv.cache_insert(slot)
            if kv is not None:
                kv.slept_in_use_slots = set()
            record.state = OwnerState.ACTIVE
        self._wake_refill()

    def is_asleep(self, owner: str) -> bool:
        with self._lock:
            return self._require_owner(owner).state is OwnerState.ASLEEP

    def remove_owner(self, owner: str) -> None:
        """Release everything the owner holds, views included. Its tensors must not be used afterwards."""
        with self._lock:
            record = self._require_owner(owner)
            if record.is_busy or record.state in (OwnerState.SLEEPING, OwnerState.WAKING, OwnerState.COMPACTING):
                raise XTensorError(f"{owner!r} is busy ({record.state.value}); remove it when the operation ends")
            record.state = OwnerState.SLEEPING
            kv = record.kv
            kv_slots: list[int] = []
            if kv is not None:
                while kv.num_in_flight:
                    self._wait_for_in_flight()
                kv_slots = [*kv.in_use_slots, *kv.cached_slots]
            weights = record.weights
            weight_pages = list(weights.slot_page) if weights is not None and weights.slot_page is not None else []
            kv_pages = [kv.slot_page[slot] for slot in kv_slots] if kv is not None else []
        if kv_slots:
            self._unmap_slots(kv.base_address, kv_slots)
        if weight_pages:
            self._unmap_slots(weights.base_address, range(len(weight_pages)))
        self._discard(kv_pages + weight_pages)
        with self._lock:
            self._pages.unassign(kv_pages, owner, KV)
            self._pages.unassign(weight_pages, owner, WEIGHTS)
            self._allocator.free_pages(kv_pages + weight_pages)
            del self._owners[owner]
        for base, num_pages in record.retired_bases:
            self._backend.free_reservation(base, num_pages)
        if weights is not None:
            self._backend.free_reservation(weights.base_address, weights.num_pages)
        if kv is not None:
            self._backend.free_reservation(kv.base_address, kv.max_num_pages)

    def _give_back_after_failed_wake(self, record: Owner, weight_pages: list[int], kv_slots: list[int],
                                     kv_pages: list[int]) -> None:
        for view_base, slots in ((record.weights.base_address if weight_pages else 0, range(len(weight_pages))),
                                 (record.kv.base_address if kv_slots else 0, kv_slots)):
            try:
                if slots:
                    self._unmap_slots(view_base, slots)
            except Exception:  # some never got mapped; unmapping them is what failed
                pass
        if weight_pages:
            self._pages.unassign(weight_pages, record.name, WEIGHTS)
            self._allocator.free_pages(weight_pages)
        if kv_slots:
            self._free_kv_slots(record.name, record.kv, kv_slots)
        record.state = OwnerState.ASLEEP

"""The weight side of the pool (WeightPageSource): a best-fit run from the high end, else the longest free runs,
mapped behind one contiguous view per owner; segments by global offset for forks and checksums."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .page_table import WEIGHTS
from .pool_base import PoolBase, XTensorError
from .views import Owner, OwnerState, WeightView, mapping_runs

if TYPE_CHECKING:
    import torch


class WeightPagesMixin(PoolBase):
    def allocate_weights(self, owner: str, num_bytes: int, device: str) -> "torch.Tensor":
        """A contiguous view of num_bytes over the owner's weight pages (a best-fit run from the high end of the pool,
        else the longest free runs). Raises PoolExhaustedError when the pool cannot hold them."""
        self._check_device(device)
        if num_bytes <= 0:
            raise ValueError(f"num_bytes must be > 0, got {num_bytes}")
        num_pages = -(-num_bytes // self._page_size)
        with self._lock:
            self._check_open()
            record = self._owners.setdefault(owner, Owner(owner))
            self._check_lifecycle_ready(record)
            if record.weights is not None and record.weights.slot_page is not None:
                raise XTensorError(f"{owner!r} already holds weights; release_weights first")
            record.is_busy = True  # claimed before _take_weight_pages, which may wait (lock released) for pages
            try:
                page_ids = self._take_weight_pages(owner, num_pages)
            except BaseException:
                record.is_busy = False
                raise
            view = record.weights
        try:
            if view is None or view.num_pages != num_pages:
                # A resized reload gets a new range; the old one stays reserved (PROT_NONE) until remove_owner, so a
                # stale tensor over it faults instead of reading someone else's pages.
                base = self._backend.reserve(num_pages)
                view = WeightView(base, num_pages, num_bytes, self._backend.tensor(base, num_pages * self._page_size))
            self._map_slots(view.base_address, enumerate(page_ids))
        except BaseException:
            with self._lock:
                self._pages.unassign(page_ids, owner, WEIGHTS)
                self._allocator.free_pages(page_ids)
                record.is_busy = False
            raise
        with self._lock:
            if record.weights is not None and record.weights is not view:
                record.retired_bases.append((record.weights.base_address, record.weights.num_pages))
            view.num_bytes, view.slot_page, view.is_kept_on_wake = num_bytes, page_ids, True
            record.weights = view
            record.is_busy = False
        return view.tensor[:num_bytes]

    def release_weights(self, owner: str) -> None:
        """Unmap the owner's weight pages and return them to the pool. The view stays reserved (touching it faults);
        a sleeping owner's weights are simply not restored on wake."""
        with self._lock:
            record = self._require_owner(owner)
            weights = record.weights
            if weights is None:
                return
            if record.state is OwnerState.ASLEEP:
                weights.is_kept_on_wake = False
                return
            self._check_lifecycle_ready(record)
            if weights.slot_page is None:
                return
            page_ids = weights.slot_page
            record.is_busy = True
        try:
            self._unmap_slots(weights.base_address, range(len(page_ids)))
        except BaseException:
            with self._lock:
                record.is_busy = False  # the pages stay the owner's: they may still be mapped
            raise
        self._discard(page_ids)
        with self._lock:
            self._pages.unassign(page_ids, owner, WEIGHTS)
            self._allocator.free_pages(page_ids)
            weights.slot_page, weights.is_kept_on_wake = None, False
            record.is_busy = False

    def weight_segments(self, owner: str) -> list[tuple[int, int]]:
        """(global offset, num bytes) of each contiguous run of the owner's weight pages, in the order of its view:
        concatenated they are bytes [0, num_bytes) of the tensor allocate_weights returned. [] while asleep."""
        with self._lock:
            weights = self._require_owner(owner).weights
            if weights is None or weights.slot_page is None:
                return []
            segments: list[tuple[int, int]] = []
            for _, first_page, count in mapping_runs(enumerate(weights.slot_page)):
                segments.append((first_page * self._page_size, count * self._page_size))
            surplus = len(weights.slot_page) * self._page_size - weights.num_bytes
            offset, size = segments[-1]
            segments[-1] = (offset, size - surplus)
            return segments

"""Compaction: move pages under live views so the free pages of the pool stay in one run.

Random frees leave holes: KV pages freed below the top of the KV zone, weight regions released between others.
xTensor can close them without the engine noticing, because an engine only ever sees its views: a page's contents
are copied to a free page through the global region and the view's slot is remapped onto the copy; addresses do not
change. KV pages move down into the lowest free pages, weight runs slide up into the free pages right above them (a
whole run at a time, so the weights stay contiguous), and free space gathers between the two zones.

Two entry points:
- `compact(owner, max_moves)` moves pages the owner's engine may be using, so the caller guarantees that engine is
  not running (call it from the engine's thread between steps), and that no peer is reading or writing those pages
  by global offset meanwhile (fork, P/D). The pool only moves that owner's pages.
- `_swap_down_idle_kv` (run by the refill thread's passes) moves idle cached KV pages: nobody reads them, so no
  copy and no pause is needed.
"""
from __future__ import annotations

from .page_table import KV, WEIGHTS
from .pool_base import PoolBase, XTensorError
from .views import KvView, Owner, OwnerState


class CompactionMixin(PoolBase):
    def compact(self, owner: str, max_moves: int = 16, *, is_kv: bool = True, is_weights: bool = True) -> int:
        """Move up to max_moves of the owner's pages towards its end of the pool (contents copied, views remapped,
        view addresses unchanged). Returns the number of pages moved.

        The caller guarantees, for the duration of the call: the owner's engine is not running (between its
        steps); with `is_kv`, no peer writes into the owner's KV pages (P/D transfer in flight) and no global offset
        of them handed out is still to be used; with `is_weights`, no peer is pulling the owner's weight pages
        (fork), and the owner's advertised weight segments are re-read afterwards when weights moved (their global
        offsets change; the bytes do not)."""
        if max_moves <= 0:
            return 0
        with self._lock:
            record = self._require_owner(owner)
            self._check_lifecycle_ready(record)
            record.state = OwnerState.COMPACTING  # the refill thread and the request path keep off this owner
            kv = record.kv
            if kv is not None:
                while kv.num_in_flight:
                    self._wait_for_in_flight()
        num_moved = 0
        try:
            if kv is not None and is_kv:
                num_moved += self._compact_kv(record, kv, max_moves)
            if is_weights and record.weights is not None and record.weights.slot_page is not None:
                num_moved += self._compact_weights(record, max_moves - num_moved)
        finally:
            with self._lock:
                record.state = OwnerState.ACTIVE
                self._stats.num_pages_compacted += num_moved
        return num_moved

    def _compact_kv(self, record: Owner, kv: KvView, max_moves: int) -> int:
        with self._lock:
            lowest_free = self._allocator.lowest_free()
            if lowest_free is None or max(kv.slot_page) < lowest_free:
                return 0  # nothing of this owner sits above a hole: the usual answer, found in C
            mapped = sorted(((page, slot) for slot, page in enumerate(kv.slot_page) if page > lowest_free),
                            reverse=True)
        num_moved = 0
        for src_page, slot in mapped:
            if num_moved >= max_moves:
                break
            with self._lock:
                dst_page = self._allocator.lowest_free()
                if dst_page is None or dst_page > src_page:
                    break
                self._allocator.take_specific(dst_page)
                self._pages.assign_one(dst_page, record.name, KV)
                is_idle = slot not in kv.in_use_slots
            self._move_page(kv.base_address + slot * self._page_size, src_page, dst_page, is_copy=not is_idle)
            with self._lock:
                kv.slot_page[slot] = dst_page
                self._pages.unassign_one(src_page, record.name, KV)
                self._allocator.free_run(src_page, 1)
                if is_idle:
                    kv.cached_slots.sort(key=lambda s: -kv.slot_page[s])
                else:
                    self._stats.num_pages_copied += 1
            num_moved += 1
        return num_moved

    def _compact_weights(self, record: Owner, max_moves: int) -> int:
        """Slide the owner's weight runs up into the free run right above each, top page first (like memmove:
        every destination is free or was just vacated). A run longer than the budget slides its top part now and
        the rest on later calls; meanwhile it is two segments, contiguous again once the slide completes."""
        weights = record.weights
        num_moved = 0
        slot = 0
        while slot < len(weights.slot_page) and num_moved < max_moves:
            first_page = weights.slot_page[slot]
            run_len = 1
            while slot + run_len < len(weights.slot_page) and weights.slot_page[slot + run_len] == first_page + run_len:
                run_len += 1
            with self._lock:
                # The run's own page below its end is taken, so a free page at its end starts a free run.
                gap = self._allocator.free_run_length_at(first_page + run_len)
            num_sliding = min(run_len, max_moves - num_moved) if gap else 0
            for offset in reversed(range(run_len - num_sliding, run_len)):
                src_page, dst_page = first_page + offset, first_page + offset + gap
                with self._lock:
                    self._allocator.take_specific(dst_page)
                    self._pages.assign_one(dst_page, record.name, WEIGHTS)
                self._move_page(weights.base_address + (slot + offset) * self._page_size, src_page, dst_page,
                                is_copy=True)
                with self._lock:
                    weights.slot_page[slot + offset] = dst_page
                    self._pages.unassign_one(src_page, record.name, WEIGHTS)
                    self._allocator.free_run(src_page, 1)
                    self._stats.num_pages_copied += 1
            num_moved += num_sliding
            slot += run_len
        return num_moved

    def _move_page(self, view_address: int, src_page: int, dst_page: int, *, is_copy: bool) -> None:
        try:
            if is_copy:
                self._backend.copy_pages(dst_page, src_page, 1)
            self._backend.remap_pages(view_address, dst_page, 1)
        except BaseException as exc:
            raise XTensorError(f"moving page {src_page} -> {dst_page} failed; the pool is inconsistent") from exc

    def _swap_down_idle_kv(self, max_moves: int) -> int:
        """Lock held. Move idle cached KV pages that sit above the lowest free page down into it: no copy (they hold
        nothing) and no pause (the engine does not hold them)."""
        num_moved = 0
        for record in self._owners.values():
            kv = record.kv
            if kv is None or record.state is not OwnerState.ACTIVE or kv.num_in_flight:
                continue
            while kv.cached_slots and num_moved < max_moves:
                slot = kv.cached_slots[0]  # the highest cached page
                src_page = kv.slot_page[slot]
                dst_page = self._allocator.lowest_free()
                if dst_page is None or dst_page > src_page:
                    break
                self._allocator.take_specific(dst_page)
                self._pages.assign_one(dst_page, record.name, KV)
                self._backend.remap_pages(kv.base_address + slot * self._page_size, dst_page, 1)
                kv.slot_page[slot] = dst_page
                self._pages.unassign_one(src_page, record.name, KV)
                self._allocator.free_run(src_page, 1)
                kv.cached_slots.sort(key=lambda s: -kv.slot_page[s])
                num_moved += 1
        self._stats.num_pages_compacted += num_moved
        return num_moved

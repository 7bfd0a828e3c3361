"""Free-page bookkeeping for one device pool: which page ids are free, and which ones a request should take.

Pure policy (no I/O, no torch): the pool calls it under its lock, the simulator can drive it on its own.

Placement, after the paper: KV cache and activations take the *lowest* free pages; weights take a contiguous run
from the *high* end (best fit: the shortest free run that is long enough, the highest such run on ties). Growing the
two kinds towards each other keeps the free pages in one run in the middle, which is what a later weight load needs.
"""
from __future__ import annotations

import bisect
from typing import Iterable


class PageAllocatorError(ValueError):
    """A free of a page that is already free, or a page id outside the pool."""


class PageAllocator:
    """Free runs of page ids 0..num_pages-1, kept sorted and merged."""

    def __init__(self, num_pages: int) -> None:
        if num_pages <= 0:
            raise ValueError(f"a pool needs at least one page, got num_pages={num_pages}")
        self.num_pages = num_pages
        self._run_starts: list[int] = [0]  # sorted starts of the free runs
        self._run_len_by_start: dict[int, int] = {0: num_pages}
        self._num_free = num_pages

    # ---- reading -------------------------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return self._num_free

    def free_runs(self) -> list[tuple[int, int]]:
        """(start page id, num pages) of every free run, lowest first."""
        return [(start, self._run_len_by_start[start]) for start in self._run_starts]

    def largest_free_run(self) -> int:
        return max(self._run_len_by_start.values(), default=0)

    def fragmentation(self) -> float:
        """Free pages outside the largest free run / free pages (0 when nothing is free)."""
        if self._num_free == 0:
            return 0.0
        return 1.0 - self.largest_free_run() / self._num_free

    def is_free(self, page_id: int) -> bool:
        index = bisect.bisect_right(self._run_starts, page_id) - 1
        if index < 0:
            return False
        start = self._run_starts[index]
        return page_id < start + self._run_len_by_start[start]

    # ---- taking --------------------------------------------------------------------------------------------------
    def take_low(self, num_pages: int) -> list[int] | None:
        """The `num_pages` lowest free page ids (KV placement), or None (nothing taken) when fewer are free."""
        if num_pages < 0:
            raise ValueError(f"num_pages must be >= 0, got {num_pages}")
        if num_pages > self._num_free:
            return None
        page_ids: list[int] = []
        starts, lengths = self._run_starts, self._run_len_by_start
        remaining = num_pages
        while remaining:
            start = starts[0]
            length = lengths.pop(start)
            taken = min(length, remaining)
            page_ids.extend(range(start, start + taken))
            remaining -= taken
            if taken == length:
                del starts[0]
            else:
                starts[0] = start + taken
                lengths[start + taken] = length - taken
        self._num_free -= num_pages
        return page_ids

    def take_lowest(self) -> int | None:
        """`take_low(1)[0]` without building lists: the on-demand KV path takes one page at a time."""
        starts = self._run_starts
        if not starts:
            return None
        start = starts[0]
        length = self._run_len_by_start.pop(start)
        if length == 1:
            del starts[0]
        else:
            starts[0] = start + 1
            self._run_len_by_start[start + 1] = length - 1
        self._num_free -= 1
        return start

    def take_high_run(self, num_pages: int) -> int | None:
        """Best fit for weights: the top `num_pages` of the shortest free run that holds them (the highest such run
        on ties). Returns the first page id of the taken run, or None when no single run is long enough."""
        if num_pages <= 0:
            raise ValueError(f"num_pages must be > 0, got {num_pages}")
        best_start, best_len = -1, 0
        for start, length in self._run_len_by_start.items():
            is_better = best_start < 0 or length < best_len or (length == best_len and start > best_start)
            if length >= num_pages and is_better:
                best_start, best_len = start, length
        if best_start < 0:
            return None
        taken_start = best_start + best_len - num_pages
        self._shrink_run_from_top(best_start, num_pages)
        return taken_start

    def take_high_scattered(self, num_pages: int) -> list[tuple[int, int]] | None:
        """Fallback for weights when no run is long enough: whole runs, longest first (highest on ties), the last one
        cut from its top. Returns (start, num pages) runs sorted by start, or None (nothing taken) when too few are
        free. Longest-first keeps the number of segments, and so of remote reads on a fork, small."""
        if num_pages <= 0:
            raise ValueError(f"num_pages must be > 0, got {num_pages}")
        if num_pages > self._num_free:
            return None
        by_size = sorted(self._run_len_by_start.items(), key=lambda run: (run[1], run[0]), reverse=True)
        taken: list[tuple[int, int]] = []
        remaining = num_pages
        for start, length in by_size:
            count = min(length, remaining)
            taken.append((start + length - count, count))
            self._shrink_run_from_top(start, count)
            remaining -= count
            if not remaining:
                break
        return sorted(taken)

    def take_specific(self, page_id: int) -> None:
        """Take one given free page (used to swap a cached page for a lower free one)."""
        index = bisect.bisect_right(self._run_starts, page_id) - 1
        start = self._run_starts[index] if index >= 0 else -1
        if index < 0 or page_id >= start + self._run_len_by_start[start]:
            raise PageAllocatorError(f"page {page_id} is not free")
        length = self._run_len_by_start.pop(start)
        del self._run_starts[index]
        if page_id > start:
            self._insert_run(start, page_id - start)
        if page_id + 1 < start + length:
            self._insert_run(page_id + 1, start + length - page_id - 1)
        self._num_free -= 1

    def free_run_length_at(self, start: int) -> int:
        """Length of the free run that starts exactly at `start` (0 when none does)."""
        return self._run_len_by_start.get(start, 0)

    def lowest_free(self) -> int | None:
        return self._run_starts[0] if self._run_starts else None

    # ---- freeing -------------------------------------------------------------------------------------------------
    def free_run(self, start: int, num_pages: int) -> None:
        """Give back pages [start, start + num_pages); merges with the neighbouring free runs."""
        if num_pages <= 0:
            raise ValueError(f"num_pages must be > 0, got {num_pages}")
        end = start + num_pages
        if start < 0 or end > self.num_pages:
            raise PageAllocatorError(f"pages [{start}, {end}) are outside the pool of {self.num_pages} pages")
        starts, lengths = self._run_starts, self._run_len_by_start
        index = bisect.bisect_right(starts, start)
        if index > 0:
            prev_start = starts[index - 1]
            prev_end = prev_start + lengths[prev_start]
            if prev_end > start:
                raise PageAllocatorError(f"double free: pages [{start}, {end}) overlap free run at {prev_start}")
        else:
            prev_end = -1
        if index < len(starts) and starts[index] < end:
            raise PageAllocatorError(f"double free: pages [{start}, {end}) overlap free run at {starts[index]}")
        merge_next = index < len(starts) and starts[index] == end
        if index > 0 and prev_end == start:
            prev_start = starts[index - 1]
            lengths[prev_start] += num_pages
            if merge_next:
                lengths[prev_start] += lengths.pop(end)
                del starts[index]
        elif merge_next:
            lengths[start] = num_pages + lengths.pop(end)
            starts[index] = start
        else:
            starts.insert(index, start)
            lengths[start] = num_pages
        self._num_free += num_pages

    def free_pages(self, page_ids: Iterable[int]) -> None:
        """Give back any set of pages; consecutive ids are freed as one run. Validates before changing anything."""
        runs = runs_of(sorted(page_ids))
        if len(runs) == 1:  # free_run checks the one run itself, before changing anything
            self.free_run(*runs[0])
            return
        for start, length in runs:
            for page_id in (start, start + length - 1):
                if not 0 <= page_id < self.num_pages:
                    raise PageAllocatorError(f"page {page_id} is outside the pool of {self.num_pages} pages")
        for start, length in runs:
            for page_id in range(start, start + length):
                if self.is_free(page_id):
                    raise PageAllocatorError(f"double free of page {page_id}")
        for start, length in runs:
            self.free_run(start, length)

    # ---- internals -----------------------------------------------------------------------------------------------
    def _shrink_run_from_top(self, start: int, count: int) -> None:
        length = self._run_len_by_start[start]
        if count == length:
            del self._run_len_by_start[start]
            del self._run_starts[bisect.bisect_left(self._run_starts, start)]
        else:
            self._run_len_by_start[start] = length - count
        self._num_free -= count

    def _insert_run(self, start: int, length: int) -> None:
        bisect.insort(self._run_starts, start)
        self._run_len_by_start[start] = length


def runs_of(sorted_ids: Iterable[int]) -> list[tuple[int, int]]:
    """Group sorted ids into (start, length) runs of consecutive ids; a repeated id raises."""
    runs: list[tuple[int, int]] = []
    start = prev = None
    for page_id in sorted_ids:
        if prev is not None and page_id == prev:
            raise PageAllocatorError(f"page {page_id} listed twice")
        if prev is not None and page_id == prev + 1:
            prev = page_id
            continue
        if start is not None:
            runs.append((start, prev - start + 1))
        start = prev = page_id
    if start is not None:
        runs.append((start, prev - start + 1))
    return runs

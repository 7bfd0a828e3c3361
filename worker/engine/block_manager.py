"""KV blocks carved out of pages, and the one owner of each request's block table: the scheduler, the engine and
the n-samples fork change a sequence's `block_ids` only through `grow`, `release` and `fork` (as vLLM v1 gives one
KV cache manager the tables); `allocate`, `share` and `free` work on bare id lists (P/D reservations, the padding
block).

A block id is `page_index * blocks_per_page + slot`: blocks never straddle pages, because two pages adjacent in
the engine's reserved range need not be adjacent in the device's global region (a remote peer writes a block by
one global offset). Pages come from the page source on demand and go back to it once empty (beyond a small cache),
so other models on the device can take the memory. Torch-free.
"""
from __future__ import annotations

import heapq
from typing import Callable, Protocol, Sequence


class HasBlockTable(Protocol):
    block_ids: list[int]  # the request's KV blocks, in token order


class BlockManager:
    def __init__(
        self,
        *,
        block_size: int,
        blocks_per_page: int,
        max_num_pages: int,
        acquire_pages: Callable[[int], list[int] | None],
        release_pages: Callable[[list[int]], None],
        num_free_pages_cached: int = 1,
    ) -> None:
        if block_size < 1 or blocks_per_page < 1 or max_num_pages < 1:
            raise ValueError("block_size, blocks_per_page and max_num_pages must be >= 1")
        self.block_size = block_size
        self.blocks_per_page = blocks_per_page
        self.max_num_pages = max_num_pages
        self._acquire_pages = acquire_pages
        self._release_pages = release_pages
        self._num_free_pages_cached = num_free_pages_cached
        self._free_heap: list[int] = []  # lowest ids first: keeps live blocks on few pages, so pages empty out
        self._free_set: set[int] = set()  # the truth; heap entries not in it are stale
        self._num_used_by_page: dict[int, int] = {}  # held pages only
        self._num_extra_holders: dict[int, int] = {}  # shared blocks (n > 1): holders beyond the first

    # ---- queries -------------------------------------------------------------------------------------------
    @property
    def num_held_pages(self) -> int:
        return len(self._num_used_by_page)

    @property
    def num_used_blocks(self) -> int:
        return self.num_held_pages * self.blocks_per_page - len(self._free_set)

    @property
    def num_free_blocks(self) -> int:
        """Free blocks in held pages plus the blocks of pages this engine may still take (when the page source is
        shared, those may be in use by other models: an upper bound)."""
        return len(self._free_set) + (self.max_num_pages - self.num_held_pages) * self.blocks_per_page

    @property
    def max_num_blocks(self) -> int:
        return self.max_num_pages * self.blocks_per_page

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def page_of(self, block_id: int) -> tuple[int, int]:
        """(page index, slot within the page) of a block."""
        return divmod(block_id, self.blocks_per_page)

    # ---- allocation ----------------------------------------------------------------------------------------
    def allocate(self, block_ids: Sequence[int], num_tokens: int) -> list[int] | None:
        """New blocks so that `block_ids` plus them hold `num_tokens` tokens, or None (nothing taken) when the
        pages cannot be had. The caller appends the returned ids to its own list."""
        num_needed = self.num_blocks_for(num_tokens) - len(block_ids)
        if num_needed <= 0:
            return []
        shortfall = num_needed - len(self._free_set)
        if shortfall > 0:
            num_pages = -(-shortfall // self.blocks_per_page)
            if self.num_held_pages + num_pages > self.max_num_pages:
                return None
            pages = self._acquire_pages(num_pages)
            if pages is None:
                return None
            for page in pages:
                self._add_page(page)
        new_ids = [self._pop_free() for _ in range(num_needed)]
        for block_id in new_ids:
            self._num_used_by_page[block_id // self.blocks_per_page] += 1
        return new_ids

    def share(self, block_ids: Sequence[int]) -> list[int]:
        """One more holder for each block (the n samples of one prompt hold its full KV blocks together); a block
        goes back only when its last holder frees it. Returns the ids, for the new holder's list."""
        for block_id in block_ids:
            if not self.is_allocated(block_id):
                raise ValueError(f"block {block_id} is not allocated")
            self._num_extra_holders[block_id] = self._num_extra_holders.get(block_id, 0) + 1
        return list(block_ids)

    # ---- a request's block table --------------------------------------------------------------------------------
    def grow(self, seq: HasBlockTable, num_tokens: int) -> bool:
        """Blocks for the first `num_tokens` tokens of `seq`, appended to its table; False, taking nothing, when
        there are not enough."""
        new_blocks = self.allocate(seq.block_ids, num_tokens)
        if new_blocks is None:
            return False
        seq.block_ids.extend(new_blocks)
        return True

    def release(self, seq: HasBlockTable) -> None:
        """Give back every block of `seq` (a shared one only once its last holder lets go); its table is empty."""
        if seq.block_ids:
            self.free(seq.block_ids)
            seq.block_ids = []

    def fork(self, parent: HasBlockTable, child: HasBlockTable, num_tokens: int,
             copy_block: Callable[[int, int], None]) -> bool:
        """`child` holds the first `num_tokens` of `parent`'s KV: the full blocks shared, a partial last block copied
        (`copy_block(src, dst)`), as the n samples of one prompt do. False, holding nothing, when no block is free
        for the copy."""
        num_full = num_tokens // self.block_size
        blocks = self.share(parent.block_ids[:num_full])
        partial = self.allocate(blocks, num_tokens) if num_tokens % self.block_size else []
        if partial is None:
            self.free(blocks)
            return False
        if partial:
            copy_block(parent.block_ids[num_full], partial[0])
        child.block_ids = blocks + partial
        return True

    def num_holders(self, block_id: int) -> int:
        return 1 + self._num_extra_holders.get(block_id, 0) if self.is_allocated(block_id) else 0

    def free(self, block_ids: Sequence[int]) -> None:
        empty_pages = []
        for block_id in block_ids:
            page = block_id // self.blocks_per_page
            if page not in self._num_used_by_page or block_id in self._free_set:
                raise ValueError(f"block {block_id} is not allocated")
            extra = self._num_extra_holders.get(block_id, 0)
            if extra:  # another holder keeps it
                if extra == 1:
                    del self._num_extra_holders[block_id]
                else:
                    self._num_extra_holders[block_id] = extra - 1
                continue
            self._free_set.add(block_id)
            heapq.heappush(self._free_heap, block_id)
            self._num_used_by_page[page] -= 1
            if self._num_used_by_page[page] == 0:
                empty_pages.append(page)
        if empty_pages:
            self._return_empty_pages()

    def is_allocated(self, block_id: int) -> bool:
        return block_id // self.blocks_per_page in self._num_used_by_page and block_id not in self._free_set

    # ---- internals -----------------------------------------------------------------------------------------
    def _add_page(self, page: int) -> None:
        if page in self._num_used_by_page or not 0 <= page < self.max_num_pages:
            raise ValueError(f"page source returned page {page}, which is held already or out of range")
        self._num_used_by_page[page] = 0
        first = page * self.blocks_per_page
        for block_id in range(first, first + self.blocks_per_page):
            self._free_set.add(block_id)
            heapq.heappush(self._free_heap, block_id)

    def _pop_free(self) -> int:
        while True:
            block_id = heapq.heappop(self._free_heap)
            if block_id in self._free_set:
                self._free_set.discard(block_id)
                return block_id

    def _return_empty_pages(self) -> None:
        empty = sorted((p for p, n in self._num_used_by_page.items() if n == 0), reverse=True)
        to_release = empty[: max(0, len(empty) - self._num_free_pages_cached)]  # highest pages go back first
        if not to_release:
            return
        for page in to_release:
            del self._num_used_by_page[page]
            first = page * self.blocks_per_page
            self._free_set.difference_update(range(first, first + self.blocks_per_page))
        self._release_pages(to_release)
        if len(self._free_heap) > 4 * max(len(self._free_set), 64):  # drop stale entries now and then
            self._free_heap = sorted(self._free_set)

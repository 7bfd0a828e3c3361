"""KV blocks carved out of pages, and the one owner of each request's block table: the scheduler, the engine and
the n-samples fork change a sequence's `block_ids` only through `grow`, `release` and `fork` (as vLLM v1 gives one
KV cache manager the tables); `allocate`, `share` and `free` work on bare id lists (P/D reservations, the padding
block).

A block id is `page_index * blocks_per_page + slot`: blocks never straddle pages, because two pages adjacent in
the engine's reserved range need not be adjacent in the device's global region (a remote peer writes a block by
one global offset). Pages come from the page source on demand and go back to it once empty (beyond a small cache),
so other models on the device can take the memory. Torch-free.

Automatic prefix caching (vLLM v1's design): a full block of a request's tokens is keyed by a hash chained on its
parent block's key and its token ids (nothing else changes a block's KV in this engine: one model, one set of
weights, no LoRA or multimodal inputs; `drop_cached_blocks` clears the cache when the weights change or the pages
slept, see `LLMEngine.drop_prefix_cache`). Once a block's KV is computed the engine registers it
(`cache_computed_blocks`); when its last holder lets go, a registered block becomes *cached*: free for page
accounting but keeping its contents and key, in an LRU. A new request takes the cached blocks of its longest
cached prefix (`take_cached_prefix`) and computes only the rest. Allocation uses plain free blocks first, then
evicts the least recently used cached block, and only then asks the page source for pages. A page whose blocks
are all free or cached counts as empty, so pages go back to the page source exactly as without caching (their
cached blocks are evicted then): caching never keeps memory from other models.
"""
from __future__ import annotations

import hashlib
import heapq
from array import array
from collections import OrderedDict
from typing import Callable, Protocol, Sequence

_ROOT_HASH = b""  # the parent key of a request's first block


def hash_block_tokens(parent_hash: bytes, token_ids: Sequence[int]) -> bytes:
    """The cache key of a full block: its tokens and, through the parent's key, every token before them. SHA-256,
    as vLLM uses, so that two different prefixes never share a key in practice (a collision would serve wrong KV)."""
    return hashlib.sha256(parent_hash + array("q", token_ids).tobytes()).digest()


class HasBlockTable(Protocol):
    block_ids: list[int]  # the request's KV blocks, in token order


class CacheableSequence(HasBlockTable, Protocol):
    token_ids: list[int]
    num_computed_tokens: int  # KV exists for this many of token_ids
    block_hashes: list[bytes]  # keys of its full token blocks so far (tokens never change, so neither do keys)
    num_registered_blocks: int  # leading blocks of block_ids already offered to the cache


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
        enable_prefix_caching: bool = False,
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
        self.enable_prefix_caching = enable_prefix_caching
        self._block_of_hash: dict[bytes, int] = {}  # registered blocks, held or cached
        self._hash_of_block: dict[int, bytes] = {}
        self._cached: OrderedDict[int, None] = OrderedDict()  # unheld registered blocks, least recently used first
        self.num_prefix_cache_queries = 0  # tokens of admitted requests looked up (vLLM: prefix_cache_queries)
        self.num_prefix_cache_hits = 0  # of those, tokens found cached (vLLM: prefix_cache_hits)

    # ---- queries -------------------------------------------------------------------------------------------
    @property
    def num_held_pages(self) -> int:
        return len(self._num_used_by_page)

    @property
    def num_used_blocks(self) -> int:
        return self.num_held_pages * self.blocks_per_page - len(self._free_set) - len(self._cached)

    @property
    def num_free_blocks(self) -> int:
        """Free and cached blocks in held pages plus the blocks of pages this engine may still take (when the page
        source is shared, those may be in use by other models: an upper bound)."""
        return self._num_takeable_blocks + (self.max_num_pages - self.num_held_pages) * self.blocks_per_page

    @property
    def num_cached_blocks(self) -> int:
        """Blocks no request holds that keep their KV for a later request with the same prefix."""
        return len(self._cached)

    @property
    def _num_takeable_blocks(self) -> int:
        return len(self._free_set) + len(self._cached)

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
        shortfall = num_needed - self._num_takeable_blocks
        if shortfall > 0:
            num_pages = -(-shortfall // self.blocks_per_page)
            if self.num_held_pages + num_pages > self.max_num_pages:
                return None
            pages = self._acquire_pages(num_pages)
            if pages is None:
                return None
            for page in pages:
                self._add_page(page)
        new_ids = [self._pop_free() if self._free_set else self._evict_least_recent() for _ in range(num_needed)]
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
        """Give back every block of `seq` (a shared one only once its last holder lets go); its table is empty.
        Freed in reverse, so that a prefix's tail blocks are evicted before its head (vLLM's order)."""
        if seq.block_ids:
            self.free(seq.block_ids[::-1])
            seq.block_ids = []
        if getattr(seq, "num_registered_blocks", 0):
            seq.num_registered_blocks = 0

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

    # ---- prefix caching ------------------------------------------------------------------------------------
    def take_cached_prefix(self, seq: CacheableSequence) -> int:
        """For a request with no blocks yet: hold the cached blocks of its longest cached prefix, appended to its
        table, and return how many tokens they cover (0 when caching is off). The last token is never a hit, so
        that it is computed and gives logits to sample (and no shared block is ever written)."""
        if not self.enable_prefix_caching or seq.block_ids:
            return 0
        num_lookup_blocks = (len(seq.token_ids) - 1) // self.block_size
        hits = []
        for block_hash in self._block_hashes(seq, num_lookup_blocks):
            block_id = self._block_of_hash.get(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        for block_id in hits:
            self._hold_registered(block_id)
        seq.block_ids.extend(hits)
        seq.num_registered_blocks = len(hits)
        return len(hits) * self.block_size

    def record_prefix_query(self, num_tokens: int, num_hit_tokens: int) -> None:
        """Count one admitted request's lookup (the scheduler calls it once the request is in)."""
        if self.enable_prefix_caching:
            self.num_prefix_cache_queries += num_tokens
            self.num_prefix_cache_hits += num_hit_tokens

    def cache_computed_blocks(self, seq: CacheableSequence) -> None:
        """Register the full blocks of `seq` whose KV is now computed, so that later requests can share them. A key
        that another block already holds is left to that block (the same KV computed twice)."""
        if not self.enable_prefix_caching:
            return
        num_full = min(seq.num_computed_tokens // self.block_size, len(seq.block_ids))
        if num_full <= seq.num_registered_blocks:
            return
        hashes = self._block_hashes(seq, num_full)
        for index in range(seq.num_registered_blocks, num_full):
            block_id, block_hash = seq.block_ids[index], hashes[index]
            if block_hash not in self._block_of_hash and block_id not in self._hash_of_block:
                self._block_of_hash[block_hash] = block_id
                self._hash_of_block[block_id] = block_hash
        seq.num_registered_blocks = num_full

    def drop_cached_blocks(self) -> None:
        """Forget every key (the KV no longer matches, e.g. new weights): cached blocks become plain free blocks."""
        for block_id in list(self._cached):
            self._forget(block_id)
            self._free_set.add(block_id)
            heapq.heappush(self._free_heap, block_id)
        self._cached.clear()
        self._block_of_hash.clear()
        self._hash_of_block.clear()

    def _block_hashes(self, seq: CacheableSequence, num_blocks: int) -> list[bytes]:
        """The keys of the first `num_blocks` full blocks of `seq`'s tokens, computed once per sequence."""
        hashes, bs = seq.block_hashes, self.block_size
        while len(hashes) < num_blocks:
            start = len(hashes) * bs
            hashes.append(hash_block_tokens(hashes[-1] if hashes else _ROOT_HASH, seq.token_ids[start:start + bs]))
        return hashes[:num_blocks]

    def _hold_registered(self, block_id: int) -> None:
        """One more holder of a registered block: a cached one leaves the LRU and counts as used again."""
        if block_id in self._cached:
            del self._cached[block_id]
            self._num_used_by_page[block_id // self.blocks_per_page] += 1
        else:
            self._num_extra_holders[block_id] = self._num_extra_holders.get(block_id, 0) + 1

    def _evict_least_recent(self) -> int:
        block_id, _ = self._cached.popitem(last=False)
        self._forget(block_id)
        return block_id

    def _forget(self, block_id: int) -> None:
        block_hash = self._hash_of_block.pop(block_id, None)
        if block_hash is not None:
            del self._block_of_hash[block_hash]

    def num_holders(self, block_id: int) -> int:
        return 1 + self._num_extra_holders.get(block_id, 0) if self.is_allocated(block_id) else 0

    def free(self, block_ids: Sequence[int]) -> None:
        empty_pages = []
        for block_id in block_ids:
            page = block_id // self.blocks_per_page
            if not self.is_allocated(block_id):
                raise ValueError(f"block {block_id} is not allocated")
            extra = self._num_extra_holders.get(block_id, 0)
            if extra:  # another holder keeps it
                if extra == 1:
                    del self._num_extra_holders[block_id]
                else:
                    self._num_extra_holders[block_id] = extra - 1
                continue
            if block_id in self._hash_of_block:
                self._cached[block_id] = None  # the most recently used end
            else:
                self._free_set.add(block_id)
                heapq.heappush(self._free_heap, block_id)
            self._num_used_by_page[page] -= 1
            if self._num_used_by_page[page] == 0:
                empty_pages.append(page)
        if empty_pages:
            self._return_empty_pages()

    def is_allocated(self, block_id: int) -> bool:
        return (block_id // self.blocks_per_page in self._num_used_by_page and block_id not in self._free_set
                and block_id not in self._cached)

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
            for block_id in range(first, first + self.blocks_per_page):
                if block_id in self._cached:  # its page leaves: the KV goes with it
                    del self._cached[block_id]
                    self._forget(block_id)
        self._release_pages(to_release)
        if len(self._free_heap) > 4 * max(len(self._free_set), 64):  # drop stale entries now and then
            self._free_heap = sorted(self._free_set)

"""BlockManager: blocks carved from pages taken on demand and returned once empty."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.engine.block_manager import BlockManager


class PagePool:
    """A deterministic page pool (the real one is xTensor or PlainKVPageSource; this is the same contract)."""

    def __init__(self, num_pages: int) -> None:
        self.free = list(range(num_pages))
        self.held: set[int] = set()
        self.num_acquire_calls = 0

    def acquire(self, n: int) -> list[int] | None:
        self.num_acquire_calls += 1
        if n > len(self.free):
            return None
        pages, self.free = self.free[:n], self.free[n:]
        self.held.update(pages)
        return pages

    def release(self, pages: list[int]) -> None:
        assert set(pages) <= self.held
        self.held.difference_update(pages)
        self.free.extend(pages)


def _manager(pool: PagePool, *, max_pages=4, bpp=4, block_size=8, cached=1) -> BlockManager:
    return BlockManager(block_size=block_size, blocks_per_page=bpp, max_num_pages=max_pages,
                        acquire_pages=pool.acquire, release_pages=pool.release, num_free_pages_cached=cached)


def test_allocates_enough_blocks_for_tokens_and_grows_incrementally():
    pool = PagePool(8)
    bm = _manager(pool)
    blocks = bm.allocate([], 17)  # 17 tokens / 8 per block -> 3 blocks
    assert blocks == [0, 1, 2] and bm.num_used_blocks == 3
    assert bm.allocate(blocks, 24) == []  # still fits 3 blocks
    more = bm.allocate(blocks, 25)
    assert more == [3] and pool.held == {0}
    blocks += more
    assert bm.allocate(blocks, 33) == [4] and pool.held == {0, 1}  # a second page on demand
    assert bm.page_of(4) == (1, 0)


def test_refuses_without_taking_anything():
    pool = PagePool(2)
    bm = _manager(pool, max_pages=4)
    assert bm.allocate([], 8 * 12) is None  # needs 3 pages, the pool has 2
    assert pool.held == set() and bm.num_used_blocks == 0
    bm2 = _manager(PagePool(8), max_pages=2)
    assert bm2.allocate([], 8 * 9) is None  # beyond the engine's own reservation
    assert bm2.num_free_blocks == 8


class Table:
    def __init__(self) -> None:
        self.block_ids: list[int] = []


def test_a_request_table_grows_forks_and_is_released_only_through_the_manager():
    bm = _manager(PagePool(8), max_pages=2, bpp=4, block_size=8)  # 8 blocks in all
    parent, child, starved = Table(), Table(), Table()
    assert bm.grow(parent, 20) and parent.block_ids == [0, 1, 2]
    copies: list[tuple[int, int]] = []
    assert bm.fork(parent, child, 20, lambda src, dst: copies.append((src, dst)))
    assert child.block_ids == [0, 1, 3] and copies == [(2, 3)], "two full blocks shared, the partial one copied"
    assert bm.num_holders(0) == 2 and bm.num_holders(2) == 1
    assert not bm.grow(starved, 8 * 5) and starved.block_ids == [], "4 blocks free: 5 refused, nothing taken"
    assert bm.grow(starved, 8 * 4) and not bm.fork(parent, Table(), 20, lambda src, dst: None)
    assert bm.num_holders(0) == 2, "a refused fork let go of the blocks it had shared"
    for table in (parent, starved, child):
        bm.release(table)
        assert table.block_ids == []
    assert bm.num_used_blocks == 0


def test_empty_pages_go_back_to_the_pool_beyond_the_cache():
    pool = PagePool(8)
    bm = _manager(pool, cached=1)
    a = bm.allocate([], 8 * 4)  # page 0
    b = bm.allocate([], 8 * 4)  # page 1
    c = bm.allocate([], 8 * 4)  # page 2
    assert pool.held == {0, 1, 2}
    bm.free(c)
    assert pool.held == {0, 1, 2}  # one empty page is kept
    bm.free(b)
    assert pool.held == {0, 1}  # the higher empty page goes back
    bm.free(a)
    assert pool.held == {1} or pool.held == {0}
    assert bm.num_used_blocks == 0


def test_lowest_blocks_first_and_double_free_is_an_error():
    bm = _manager(PagePool(8))
    a = bm.allocate([], 8 * 6)
    bm.free(a[:2])
    assert bm.allocate([], 8) == [a[0]]
    with pytest.raises(ValueError):
        bm.free([a[1], a[1]])
    assert bm.is_allocated(a[2]) and not bm.is_allocated(a[1])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 40)), min_size=1, max_size=60))
def test_invariants_hold_under_random_allocate_and_free(ops):
    pool = PagePool(5)
    bm = _manager(pool, max_pages=5, bpp=3, block_size=4, cached=1)
    live: list[list[int]] = []
    for is_alloc, num_tokens in ops:
        if is_alloc or not live:
            blocks = bm.allocate([], num_tokens)
            if blocks is not None:
                assert len(blocks) == -(-num_tokens // 4)
                live.append(blocks)
        else:
            bm.free(live.pop(num_tokens % len(live)))
        owned = [b for blocks in live for b in blocks]
        assert len(owned) == len(set(owned)) == bm.num_used_blocks
        assert all(b // 3 in pool.held for b in owned)  # every live block sits in a page we hold
        assert bm.num_held_pages == len(pool.held) <= 5
        empty_pages = pool.held - {b // 3 for b in owned}
        assert len(empty_pages) <= 1  # at most the cached empty page

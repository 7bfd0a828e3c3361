"""Compaction: pages move under live views (contents copied, addresses unchanged) so free pages form one run."""
from __future__ import annotations

import torch

from worker.xtensor import KV_CACHED


def fill_pages(view: torch.Tensor, page: int, slots, seed: int) -> dict[int, torch.Tensor]:
    expected = {}
    for slot in slots:
        data = torch.randint(0, 256, (page,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed + slot))
        view[slot * page:(slot + 1) * page] = data
        expected[slot] = data
    return expected


def test_kv_pages_move_down_into_holes_with_their_contents(open_pool):
    pool = open_pool(32, kv_low_watermark_pages=0, kv_high_watermark_pages=0)
    page = pool.page_size_bytes
    kv_a = pool.reserve_kv("a", 16, "cpu")
    pool.reserve_kv("b", 16, "cpu")
    a_slots, b_slots = [], []
    for _ in range(8):  # interleaved: a, b, a, b ... from the low end
        a_slots += pool.acquire_kv_pages("a", 1)
        b_slots += pool.acquire_kv_pages("b", 1)
    expected = fill_pages(kv_a, page, a_slots, seed=1)
    pool.release_kv_pages("b", b_slots)
    pool.run_kv_maintenance()  # watermarks 0: b's pages go back, leaving 8 holes among a's pages
    assert pool.counters().fragmentation > 0.2
    ptr = kv_a.data_ptr()

    moved = pool.compact("a", max_moves=100)

    assert moved > 0 and pool.stats().num_pages_compacted == moved == pool.stats().num_pages_copied
    assert pool.counters().fragmentation == 0.0
    assert sorted(pool.kv_page_global_offset("a", s) // page for s in a_slots) == list(range(8))
    assert kv_a.data_ptr() == ptr
    for slot, data in expected.items():
        assert torch.equal(kv_a[slot * page:(slot + 1) * page], data)  # through the view
        offset = pool.kv_page_global_offset("a", slot)
        assert torch.equal(pool.global_view(offset, page), data)  # and where a peer would read it
    assert pool.acquire_kv_pages("a", 1) is not None  # the hot path serves the owner again


def test_a_weight_run_slides_up_into_the_hole_a_released_model_left(open_pool):
    pool = open_pool(32)
    page = pool.page_size_bytes
    pool.allocate_weights("top", 4 * page, "cpu")
    pool.allocate_weights("middle", 6 * page, "cpu")
    low = pool.allocate_weights("low", 5 * page + 7, "cpu")
    expected = torch.randint(0, 256, (low.numel(),), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    low.copy_(expected)
    pool.release_weights("middle")
    assert len(pool.free_runs()) == 2 and pool.counters().fragmentation > 0

    assert pool.compact("low", max_moves=3) == 3  # the top half of the run slides up now...
    assert len(pool.weight_segments("low")) == 2 and torch.equal(low, expected)
    assert pool.compact("low", max_moves=6) == 3  # ...the rest on the next call

    assert pool.free_runs() == [(0, 22)] and pool.counters().fragmentation == 0.0
    assert pool.weight_segments("low") == [(22 * page, 5 * page + 7)]
    assert torch.equal(low, expected)
    offset, size = pool.weight_segments("low")[0]
    assert torch.equal(pool.global_view(offset, size), expected)


def test_idle_cached_pages_move_down_in_the_background_pass(open_pool):
    pool = open_pool(32, kv_low_watermark_pages=1, kv_high_watermark_pages=4)
    page = pool.page_size_bytes
    pool.reserve_kv("a", 16, "cpu")
    pool.reserve_kv("b", 16, "cpu")
    held_b = pool.acquire_kv_pages("b", 6)  # pages 0..5
    pool.run_kv_maintenance()
    held_a = pool.acquire_kv_pages("a", 2)
    pool.release_kv_pages("b", held_b)  # b's cache: 6 pages (+ its refill), above the high watermark of 4
    pool.run_kv_maintenance()  # trims b's highest pages, then moves a's idle cache down into what is free
    counters = pool.counters()
    assert counters.pages_by_model["a"][KV_CACHED] >= 1
    assert counters.fragmentation == 0.0  # every owned KV page sits below the one free run
    owned = [i for i, entry in enumerate(pool.page_table_snapshot()) if entry is not None]
    assert owned == list(range(len(owned)))
    assert pool.stats().num_pages_compacted > 0
    assert len(held_a) == 2 and page > 0


def test_compact_refuses_an_owner_that_is_asleep(open_pool):
    import pytest

    from worker.xtensor import XTensorError

    pool = open_pool(8)
    pool.allocate_weights("a", pool.page_size_bytes, "cpu")
    pool.sleep("a")
    with pytest.raises(XTensorError, match="asleep"):
        pool.compact("a")


def test_compaction_can_be_limited_to_kv_or_to_weights(open_pool):
    pool = open_pool(32, kv_low_watermark_pages=0, kv_high_watermark_pages=0)
    page = pool.page_size_bytes
    pool.allocate_weights("top", 2 * page, "cpu")
    pool.allocate_weights("gone", 3 * page, "cpu")
    pool.allocate_weights("a", 2 * page, "cpu")
    pool.reserve_kv("a", 8, "cpu")
    pool.reserve_kv("b", 8, "cpu")
    pool.acquire_kv_pages("b", 1)
    pool.acquire_kv_pages("a", 1)
    pool.release_kv_pages("b", [0])
    pool.release_weights("gone")
    pool.run_kv_maintenance()
    segments = pool.weight_segments("a")
    assert pool.compact("a", 10, is_weights=False) == 1  # only a's KV page went down
    assert pool.weight_segments("a") == segments  # advertised weight offsets untouched
    assert pool.compact("a", 10, is_kv=False) == 2
    assert pool.weight_segments("a") != segments and pool.counters().fragmentation == 0.0

"""Weights (best fit from the high end, scattered fallback, segments) and sleep/wake of an owner."""
from __future__ import annotations

import pytest
import torch

from worker.xtensor import PoolExhaustedError, XTensorError


def read_segments(pool, owner):
    return torch.cat([pool.global_view(offset, size) for offset, size in pool.weight_segments(owner)])


def test_weights_take_a_best_fit_run_from_the_high_end(open_pool):
    pool = open_pool(16)
    page = pool.page_size_bytes
    view = pool.allocate_weights("a", 3 * page + 10, "cpu")
    assert view.numel() == 3 * page + 10
    assert pool.weight_segments("a") == [(12 * page, 3 * page + 10)]  # pages 12..15: the top of the pool
    pool.allocate_weights("b", 2 * page, "cpu")
    assert pool.weight_segments("b") == [(10 * page, 2 * page)]
    kinds = pool.counters().pages_by_model
    assert kinds["a"] == {"weights": 4} and kinds["b"] == {"weights": 2}


def test_weights_fall_back_to_scattered_pages_behind_one_contiguous_view(open_pool):
    pool = open_pool(12)
    page = pool.page_size_bytes
    pool.reserve_kv("kv", 12, "cpu")
    held = pool.acquire_kv_pages("kv", 12)
    by_page = {pool.kv_page_global_offset("kv", s) // page: s for s in held}
    pool.release_kv_pages("kv", [by_page[p] for p in (1, 2, 5, 6, 7, 10)])
    pool.run_kv_maintenance()  # above the high watermark (4): pages 10 and 7 go back to the pool
    # 6 pages: the 4 idle cached KV pages are taken back too, and no free run is that long.
    view = pool.allocate_weights("w", 5 * page + 3, "cpu")
    segments = pool.weight_segments("w")
    assert len(segments) > 1 and sum(size for _, size in segments) == view.numel()
    view.copy_(torch.arange(view.numel(), dtype=torch.int64).remainder(253).to(torch.uint8))
    assert torch.equal(read_segments(pool, "w"), view)  # segments in view order, concatenated = the view
    table = pool.page_table_snapshot()
    for offset, size in segments:
        for page_id in range(offset // page, -(-(offset + size) // page)):
            assert table[page_id] == ("w", "weights")


def test_weights_larger_than_the_pool_raise_and_take_nothing(open_pool):
    pool = open_pool(8)
    pool.allocate_weights("a", 5 * pool.page_size_bytes, "cpu")
    with pytest.raises(PoolExhaustedError, match="needs 4 pages"):
        pool.allocate_weights("b", 4 * pool.page_size_bytes, "cpu")
    assert pool.counters().num_pages_free == 3
    with pytest.raises(XTensorError, match="already holds weights"):
        pool.allocate_weights("a", 1, "cpu")


def test_release_weights_returns_pages_and_a_reload_reuses_the_view(open_pool):
    pool = open_pool(8)
    page = pool.page_size_bytes
    first = pool.allocate_weights("a", 3 * page, "cpu")
    first.fill_(7)
    resident = pool.backend.resident_bytes()
    pool.release_weights("a")
    assert pool.counters().num_pages_free == 8 and pool.weight_segments("a") == []
    assert pool.backend.resident_bytes() <= resident - 3 * page
    second = pool.allocate_weights("a", 3 * page, "cpu")
    assert second.data_ptr() == first.data_ptr()
    assert int(second.sum()) == 0  # fresh pages: the hole punched on release reads as zeros


def test_sleep_releases_everything_and_wake_remaps_under_the_same_views(open_pool):
    pool = open_pool(16, kv_low_watermark_pages=1, kv_high_watermark_pages=2)
    page = pool.page_size_bytes
    weights = pool.allocate_weights("a", 4 * page, "cpu")
    kv = pool.reserve_kv("a", 8, "cpu")
    held = pool.acquire_kv_pages("a", 3)
    pool.run_kv_maintenance()
    weights.fill_(3)
    resident = pool.backend.resident_bytes()
    assert resident >= 4 * page

    pool.sleep("a")
    assert pool.is_asleep("a")
    counters = pool.counters()
    assert counters.num_pages_free == 16 and sum(counters.pages_by_model["a"].values()) == 0
    assert pool.backend.resident_bytes() == 0  # memory really came back
    with pytest.raises(XTensorError, match="asleep"):
        pool.acquire_kv_pages("a", 1)
    other = pool.allocate_weights("b", 9 * page, "cpu")  # another model uses the memory meanwhile
    other.fill_(9)

    pool.wake("a")
    assert not pool.is_asleep("a")
    assert pool.counters().pages_by_model["a"]["weights"] == 4
    assert pool.counters().pages_by_model["a"]["kv"] == 3
    weights.fill_(4)  # same tensor objects, re-backed
    for slot in held:
        kv[slot * page: (slot + 1) * page] = slot + 1
        offset = pool.kv_page_global_offset("a", slot)
        assert bool((pool.global_view(offset, page) == slot + 1).all())
    assert torch.equal(read_segments(pool, "a"), weights)
    assert bool((other == 9).all())  # b's pages were not touched
    pool.release_kv_pages("a", held)


def test_wake_is_all_or_nothing_when_the_pool_is_full(open_pool):
    pool = open_pool(8)
    pool.allocate_weights("a", 4 * pool.page_size_bytes, "cpu")
    pool.sleep("a")
    pool.allocate_weights("b", 6 * pool.page_size_bytes, "cpu")
    with pytest.raises(PoolExhaustedError, match="waking 'a' needs 4 pages"):
        pool.wake("a")
    assert pool.is_asleep("a") and pool.counters().num_pages_free == 2
    pool.release_weights("b")
    pool.wake("a")
    assert pool.counters().pages_by_model["a"] == {"weights": 4}


def test_released_while_asleep_is_not_restored(open_pool):
    pool = open_pool(8)
    pool.allocate_weights("a", 2 * pool.page_size_bytes, "cpu")
    pool.reserve_kv("a", 4, "cpu")
    held = pool.acquire_kv_pages("a", 2)
    pool.sleep("a")
    pool.release_kv_pages("a", held[:1])
    pool.release_weights("a")
    pool.wake("a")
    kinds = pool.counters().pages_by_model["a"]
    assert kinds.get("weights", 0) == 0 and kinds["kv"] == 1


def test_remove_owner_frees_everything(open_pool):
    pool = open_pool(8)
    pool.allocate_weights("a", 2 * pool.page_size_bytes, "cpu")
    pool.reserve_kv("a", 4, "cpu")
    pool.acquire_kv_pages("a", 3)
    pool.remove_owner("a")
    assert pool.owners() == [] and pool.counters().num_pages_free == 8
    with pytest.raises(XTensorError, match="unknown owner"):
        pool.weight_segments("a")


def test_global_region_describes_the_pool(open_pool):
    pool = open_pool(8)
    region = pool.global_region
    assert region.num_bytes == 8 * pool.page_size_bytes and region.num_pages == 8
    assert region.base_address == pool.global_view(0, 1).data_ptr()
    assert region.page_id_at(region.page_offset_bytes(5) + 17) == 5
    with pytest.raises(ValueError):
        region.page_offset_bytes(8)
    with pytest.raises(ValueError):
        pool.global_view(region.num_bytes - 1, 2)

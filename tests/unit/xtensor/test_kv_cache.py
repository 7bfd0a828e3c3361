"""The per-model mapped KV cache: watermarks, the background refill thread, sharing pages between models."""
from __future__ import annotations

import time

import pytest

from worker.xtensor import KV_CACHED, XTensorError


def kinds(pool, owner):
    return pool.counters().pages_by_model.get(owner, {})


def wait_until(predicate, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()


def test_cache_fills_to_high_watermark_and_serves_without_mapping(open_pool):
    pool = open_pool(32, kv_low_watermark_pages=2, kv_high_watermark_pages=4)
    pool.reserve_kv("a", 16, "cpu")
    pool.run_kv_maintenance()
    assert kinds(pool, "a") == {"kv": 0, KV_CACHED: 4}
    slots = [pool.acquire_kv_pages("a", 1)[0] for _ in range(2)]
    assert pool.stats().num_kv_cache_hits == 2 and pool.stats().num_kv_cache_misses == 0
    assert kinds(pool, "a") == {"kv": 2, KV_CACHED: 2}
    # KV is taken from the low end of the pool: the pages handed out are the lowest ones.
    assert sorted(pool.kv_page_global_offset("a", s) // pool.page_size_bytes for s in slots) == [0, 1]
    pool.acquire_kv_pages("a", 1)  # cache at 1 < low watermark 2
    pool.run_kv_maintenance()
    assert kinds(pool, "a") == {"kv": 3, KV_CACHED: 4}


def test_a_request_larger_than_the_cache_maps_on_the_spot_and_counts_a_miss(open_pool):
    pool = open_pool(32, kv_low_watermark_pages=1, kv_high_watermark_pages=2)
    pool.reserve_kv("a", 16, "cpu")
    pool.run_kv_maintenance()
    slots = pool.acquire_kv_pages("a", 5)
    assert len(set(slots)) == 5
    assert pool.stats().num_kv_cache_misses == 1
    assert kinds(pool, "a") == {"kv": 5, KV_CACHED: 0}


def test_released_pages_beyond_high_watermark_go_back_to_the_pool(open_pool):
    pool = open_pool(32, kv_low_watermark_pages=1, kv_high_watermark_pages=3, is_discard_on_kv_trim=True)
    kv = pool.reserve_kv("a", 16, "cpu")
    slots = pool.acquire_kv_pages("a", 10)
    for slot in slots:
        kv[slot * pool.page_size_bytes] = 1  # touch: memory is resident now
    resident_before = pool.backend.resident_bytes()
    pool.release_kv_pages("a", slots)
    assert kinds(pool, "a") == {"kv": 0, KV_CACHED: 10}  # release itself calls no driver
    pool.run_kv_maintenance()
    assert kinds(pool, "a") == {"kv": 0, KV_CACHED: 3}
    assert pool.counters().num_pages_free == 29
    assert pool.backend.resident_bytes() <= resident_before - 7 * pool.page_size_bytes  # holes punched
    # The highest physical pages went back; the cache keeps the lowest, so KV stays packed at the low end.
    assert pool.free_runs() == [(3, 29)]


def test_background_thread_refills_without_being_asked(open_pool):
    pool = open_pool(32, kv_low_watermark_pages=2, kv_high_watermark_pages=5, is_background_refill=True,
                     refill_poll_s=0.01)
    pool.reserve_kv("a", 16, "cpu")
    assert wait_until(lambda: kinds(pool, "a").get(KV_CACHED) == 5)
    pool.acquire_kv_pages("a", 4)  # cache 1 < low: the hot path wakes the thread
    assert wait_until(lambda: kinds(pool, "a") == {"kv": 4, KV_CACHED: 5})
    hits, misses = pool.stats().num_kv_cache_hits, pool.stats().num_kv_cache_misses
    assert (hits, misses) == (1, 0)


def test_a_model_short_of_pages_takes_idle_cached_pages_of_another(open_pool):
    pool = open_pool(8, kv_low_watermark_pages=2, kv_high_watermark_pages=4)
    kv_a = pool.reserve_kv("a", 8, "cpu")
    kv_b = pool.reserve_kv("b", 8, "cpu")
    a_slots = pool.acquire_kv_pages("a", 4)
    pool.release_kv_pages("a", a_slots)  # A holds 4 idle cached pages
    pool.run_kv_maintenance()  # B's cache takes the other 4
    assert kinds(pool, "a")[KV_CACHED] == 4 and kinds(pool, "b")[KV_CACHED] == 4
    assert pool.counters().num_pages_free == 0
    b_slots = pool.acquire_kv_pages("b", 7)  # 4 cached + 3 taken back from A's idle cache
    assert b_slots is not None and len(b_slots) == 7
    assert pool.stats().num_kv_pages_reclaimed == 3
    assert kinds(pool, "a") == {"kv": 0, KV_CACHED: 1}
    for slot in b_slots:
        kv_b[slot * pool.page_size_bytes] = 5
    assert kv_a.data_ptr() != kv_b.data_ptr()


def test_none_when_the_pool_cannot_supply_and_nothing_is_taken(open_pool):
    pool = open_pool(6, kv_low_watermark_pages=0, kv_high_watermark_pages=0)
    pool.reserve_kv("a", 8, "cpu")
    pool.reserve_kv("b", 8, "cpu")
    assert len(pool.acquire_kv_pages("a", 4)) == 4
    before = pool.counters()
    assert pool.acquire_kv_pages("b", 3) is None
    assert pool.counters() == before
    assert pool.acquire_kv_pages("a", 5) is None  # beyond a's reserved view as well


def test_kv_misuse_raises_clear_errors(open_pool):
    pool = open_pool(8)
    with pytest.raises(XTensorError, match="reserve_kv"):
        pool.acquire_kv_pages("nobody", 1)
    pool.reserve_kv("a", 4, "cpu")
    with pytest.raises(XTensorError, match="already reserved"):
        pool.reserve_kv("a", 5, "cpu")
    with pytest.raises(ValueError, match="serves cpu"):
        pool.reserve_kv("b", 4, "cuda:0")
    slots = pool.acquire_kv_pages("a", 2)
    with pytest.raises(XTensorError, match="does not hold"):
        pool.release_kv_pages("a", [3] if 3 not in slots else [0 if 0 not in slots else 1])
    with pytest.raises(ValueError, match="twice"):
        pool.release_kv_pages("a", [slots[0], slots[0]])
    with pytest.raises(XTensorError, match="does not hold"):
        pool.kv_page_global_offset("a", next(s for s in range(4) if s not in slots))

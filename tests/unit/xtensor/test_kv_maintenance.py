"""The maintenance pass's lean paths (single-page trim and map, swap-down only when an idle cache can move) against
a plain model of the watermark rule, on a real CPU pool: random takes and releases of two models, a pass at a time."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.xtensor import KV_CACHED, XTensor, XTensorError
from worker.xtensor.page_table import PageOwnershipError

from .xtensor_fixtures import TEST_PAGE_BYTES, make_config

OWNERS = ("a", "b")  # reserved in this order: the order a pass visits them
NUM_POOL_PAGES = 24
MAX_KV_PAGES = 10


def kv_counts(pool) -> dict[str, tuple[int, int]]:
    """owner -> (pages held by the engine, idle cached pages)."""
    by_model = pool.counters().pages_by_model
    return {o: (by_model.get(o, {}).get("kv", 0), by_model.get(o, {}).get(KV_CACHED, 0)) for o in OWNERS}


def expected_after_pass(counts: dict[str, tuple[int, int]], num_free: int, low: int, high: int) -> dict[str, int]:
    """The watermark rule, written out plainly: each owner's cached pages after one pass (nothing in flight)."""
    cached_after = {}
    for owner in OWNERS:
        held, cached = counts[owner]
        if cached > high:
            cached_after[owner] = high
        elif cached < low:
            num_map = min(high - cached, MAX_KV_PAGES - held - cached, num_free)
            num_free -= num_map
            cached_after[owner] = cached + num_map
        else:
            cached_after[owner] = cached
    return cached_after


def assert_no_idle_page_above_a_hole(pool) -> None:
    """Once maintenance settles (a pass found nothing to do), swap-down has nothing left to move."""
    lowest_free = pool._allocator.lowest_free()
    if lowest_free is None:
        return
    for owner in OWNERS:
        kv = pool._owners[owner].kv
        pages = [kv.slot_page[slot] for slot in kv.cached_slots]
        assert all(page < lowest_free for page in pages), f"{owner}'s idle pages {pages} sit above free {lowest_free}"


op = st.one_of(
    st.tuples(st.just("acquire"), st.sampled_from(OWNERS), st.integers(1, 4)),
    st.tuples(st.just("release"), st.sampled_from(OWNERS), st.integers(1, 4)),
    st.tuples(st.just("pass"), st.just(""), st.just(0)),
    st.tuples(st.just("settle"), st.just(""), st.just(0)),
)


@settings(max_examples=60, deadline=None)
@given(low=st.integers(0, 3), extra=st.integers(0, 3), ops=st.lists(op, min_size=1, max_size=40))
def test_each_pass_applies_the_watermark_rule_and_settles_with_no_idle_page_above_a_hole(low, extra, ops):
    high = low + extra
    config = make_config(kv_low_watermark_pages=low, kv_high_watermark_pages=high, is_populate=False,
                         is_discard_on_free=False)
    with XTensor.open("cpu", NUM_POOL_PAGES * TEST_PAGE_BYTES, config) as pool:
        held: dict[str, list[int]] = {owner: [] for owner in OWNERS}
        for owner in OWNERS:
            pool.reserve_kv(owner, MAX_KV_PAGES, "cpu")
        for kind, owner, n in ops:
            if kind == "acquire":
                slots = pool.acquire_kv_pages(owner, n)
                if slots is not None:
                    assert not set(slots) & set(held[owner])
                    held[owner] += slots
            elif kind == "release" and held[owner]:
                chosen, held[owner] = held[owner][:n], held[owner][n:]
                pool.release_kv_pages(owner, chosen)
            elif kind == "pass":
                before = kv_counts(pool)
                expected = expected_after_pass(before, pool.counters().num_pages_free, low, high)
                pool._kv_maintenance_pass()
                after = kv_counts(pool)
                assert {o: after[o][1] for o in OWNERS} == expected
                assert {o: after[o][0] for o in OWNERS} == {o: before[o][0] for o in OWNERS}
            elif kind == "settle":
                pool.run_kv_maintenance()
                assert not pool._kv_maintenance_pass()
                assert_no_idle_page_above_a_hole(pool)
            assert_pages_owned_once(pool, held)


def assert_pages_owned_once(pool, held: dict[str, list[int]]) -> None:
    table = pool.page_table_snapshot()
    counts = kv_counts(pool)
    assert sum(entry is None for entry in table) == pool.counters().num_pages_free
    for owner in OWNERS:
        assert sum(entry == (owner, "kv") for entry in table) == sum(counts[owner])
        pages = [pool.kv_page_global_offset(owner, slot) // pool.page_size_bytes for slot in held[owner]]
        assert len(set(pages)) == len(pages) and all(table[page] == (owner, "kv") for page in pages)


def test_a_pass_that_trims_one_model_still_moves_another_models_idle_page_down(open_pool):
    pool = open_pool(16, kv_low_watermark_pages=0, kv_high_watermark_pages=1)
    for owner in ("a", "b", "c"):
        pool.reserve_kv(owner, 8, "cpu")
    c_slots = pool.acquire_kv_pages("c", 2)  # pages 0, 1
    b_slots = pool.acquire_kv_pages("b", 1)  # page 2
    a_slots = pool.acquire_kv_pages("a", 2)  # pages 3, 4
    pool.release_kv_pages("c", c_slots)
    pool.release_kv_pages("b", b_slots)  # b: one idle page (its high watermark): never planned below
    pool._kv_maintenance_pass()  # c trims page 1: a hole below b's idle page 2
    pool.acquire_kv_pages("c", 1)  # c's last idle page goes to its engine: b alone holds idle pages
    assert pool.free_runs()[0] == (1, 1) and kv_counts(pool)["b"] == (0, 1)
    pool.release_kv_pages("a", a_slots)  # a: 2 idle pages, over its high watermark

    assert pool._kv_maintenance_pass()  # a trims page 4; in the same pass b's idle page moves down into the hole

    b_kv = pool._owners["b"].kv
    assert [b_kv.slot_page[slot] for slot in b_kv.cached_slots] == [1]
    assert pool.stats().num_pages_compacted == 1 and pool.stats().num_kv_pages_trimmed == 2
    assert pool.page_table_snapshot()[1:5] == [("b", "kv"), None, ("a", "kv"), None]


def test_a_single_page_trim_gives_the_page_back_once(open_pool):
    pool = open_pool(8, kv_low_watermark_pages=0, kv_high_watermark_pages=0)
    pool.reserve_kv("a", 4, "cpu")
    (slot,) = pool.acquire_kv_pages("a", 1)
    kv = pool._owners["a"].kv
    page_id = kv.slot_page[slot]
    pool.release_kv_pages("a", [slot])
    assert pool._kv_maintenance_pass()
    assert pool.page_table_snapshot()[page_id] is None and pool.counters().num_pages_free == 8
    assert pool.stats().num_kv_pages_trimmed == 1 and slot in kv.free_slots
    # Giving the same page back a second time is refused, and changes nothing.
    kv.slot_page[slot] = page_id
    before = (pool.counters(), pool.free_runs(), sorted(kv.free_slots))
    with pool._lock, pytest.raises(PageOwnershipError):
        pool._free_kv_slots("a", kv, [slot])
    kv.slot_page[slot] = -1
    assert (pool.counters(), pool.free_runs(), sorted(kv.free_slots)) == before


def test_a_single_page_miss_on_a_dry_pool_takes_another_models_idle_page(open_pool):
    pool = open_pool(4, kv_low_watermark_pages=0, kv_high_watermark_pages=4)
    pool.reserve_kv("a", 4, "cpu")
    pool.reserve_kv("b", 4, "cpu")
    pool.release_kv_pages("b", pool.acquire_kv_pages("b", 4))  # b's cache holds the whole pool
    assert pool.counters().num_pages_free == 0
    (slot,) = pool.acquire_kv_pages("a", 1)  # the one-page fast path finds no free page: the general path reclaims
    assert pool.stats().num_kv_pages_reclaimed == 1
    assert kv_counts(pool) == {"a": (1, 0), "b": (0, 3)}
    assert pool.page_table_snapshot()[pool.kv_page_global_offset("a", slot) // pool.page_size_bytes] == ("a", "kv")


def test_a_failed_single_page_map_leaves_the_pool_as_it_was(open_pool):
    pool = open_pool(8, kv_low_watermark_pages=0, kv_high_watermark_pages=0)
    pool.reserve_kv("a", 4, "cpu")
    before = (pool.counters(), pool.free_runs(), sorted(pool._owners["a"].kv.free_slots))

    def failing_map(*args, **kwargs):
        raise XTensorError("driver says no")

    pool.backend.map_pages = failing_map
    with pytest.raises(XTensorError, match="driver says no"):
        pool.acquire_kv_pages("a", 1)
    assert (pool.counters(), pool.free_runs(), sorted(pool._owners["a"].kv.free_slots)) == before

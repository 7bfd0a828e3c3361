"""The placement policy against a brute-force model over a plain set of free page ids."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.xtensor.page_allocator import PageAllocator, PageAllocatorError, runs_of


def free_runs_of(free: set[int]) -> list[tuple[int, int]]:
    return runs_of(sorted(free))


def test_kv_takes_lowest_and_weights_take_top_of_best_fit_run():
    allocator = PageAllocator(20)
    assert allocator.take_low(3) == [0, 1, 2]
    assert allocator.take_high_run(4) == 16  # one run [3, 20): its top 4 pages
    allocator.free_run(1, 1)  # hole of 1 at page 1
    allocator.take_specific(10)  # splits [3, 16) into [3, 10) and [11, 16)
    assert allocator.free_runs() == [(1, 1), (3, 7), (11, 5)]
    assert allocator.take_high_run(5) == 11  # exact fit [11, 16) beats the larger [3, 10)
    assert allocator.take_high_run(1) == 1  # best fit: the 1-page hole
    assert allocator.take_low(2) == [3, 4]


def test_scattered_fallback_uses_longest_runs_first():
    allocator = PageAllocator(12)
    taken = allocator.take_low(12)
    allocator.free_pages([1, 2, 5, 6, 7, 10])
    assert allocator.take_high_run(4) is None
    runs = allocator.take_high_scattered(4)
    assert runs == [(2, 1), (5, 3)]  # the 3-run whole, then the top of the next longest (the 2-run, higher of ties)
    assert allocator.num_free == 2 and allocator.free_runs() == [(1, 1), (10, 1)]
    assert taken == list(range(12))


def test_fragmentation_is_free_pages_outside_largest_run_over_free_pages():
    allocator = PageAllocator(10)
    allocator.take_low(10)
    assert allocator.fragmentation() == 0.0
    allocator.free_pages([0, 4, 5, 6])
    assert allocator.fragmentation() == pytest.approx(1 / 4)


def test_bad_frees_raise_without_changing_anything():
    allocator = PageAllocator(8)
    allocator.take_low(4)
    with pytest.raises(PageAllocatorError):
        allocator.free_pages([2, 5])  # 5 is free already
    assert allocator.num_free == 4 and not allocator.is_free(2)
    with pytest.raises(PageAllocatorError):
        allocator.free_run(7, 3)  # past the end
    with pytest.raises(PageAllocatorError):
        allocator.free_pages([1, 1])
    assert allocator.take_low(5) is None and allocator.num_free == 4


operations = st.lists(
    st.tuples(st.sampled_from(["low", "run", "scattered", "free"]), st.integers(1, 9), st.integers(0, 10**6)),
    max_size=60)


@settings(max_examples=150, deadline=None)
@given(num_pages=st.integers(1, 48), ops=operations)
def test_allocator_matches_brute_force_model(num_pages, ops):
    allocator = PageAllocator(num_pages)
    free = set(range(num_pages))
    for kind, count, seed in ops:
        if kind == "low":
            got = allocator.take_low(count)
            if count > len(free):
                assert got is None
            else:
                assert got == sorted(free)[:count]
                free -= set(got)
        elif kind == "run":
            got = allocator.take_high_run(count)
            fitting = [(length, start) for start, length in free_runs_of(free) if length >= count]
            if not fitting:
                assert got is None
            else:
                best_len = min(length for length, _ in fitting)
                best_start = max(start for length, start in fitting if length == best_len)
                assert got == best_start + best_len - count
                free -= set(range(got, got + count))
        elif kind == "scattered":
            got = allocator.take_high_scattered(count)
            if count > len(free):
                assert got is None
            else:
                pages = {p for start, n in got for p in range(start, start + n)}
                assert len(pages) == count and pages <= free
                free -= pages
        else:
            owned = sorted(set(range(num_pages)) - free)
            if owned:
                chosen = {owned[(seed + i * 7919) % len(owned)] for i in range(count)}
                allocator.free_pages(chosen)
                free |= chosen
        assert allocator.num_free == len(free)
        assert allocator.free_runs() == free_runs_of(free)
        expected_frag = 0.0 if not free else 1 - max(n for _, n in free_runs_of(free)) / len(free)
        assert allocator.fragmentation() == pytest.approx(expected_frag)

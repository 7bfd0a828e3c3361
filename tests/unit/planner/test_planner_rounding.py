"""Largest-remainder rounding is exact; scaling to the budget never exceeds it and keeps one per busy model."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.core.rounding import largest_remainder, scale_to_budget


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=1e4, allow_nan=False), min_size=1, max_size=30),
       st.integers(min_value=0, max_value=500))
def test_largest_remainder_is_exact(weights, total):
    if sum(weights) <= 0 and total > 0:
        with pytest.raises(ValueError):
            largest_remainder(weights, total)
        return
    seats = largest_remainder(weights, total)
    assert sum(seats) == total
    wsum = sum(weights)
    for w, s in zip(weights, seats):
        quota = w * total / wsum if wsum > 0 else 0.0
        assert math.floor(quota - 1e-6) <= s <= math.ceil(quota + 1e-6)


def test_largest_remainder_hand_case():
    # Quotas 4.2, 2.5, 1.9, 1.4 of 10: floors 4,2,1,1 = 8; the two largest remainders (0.9, 0.5) get the rest.
    assert largest_remainder([42, 25, 19, 14], 10) == [4, 3, 2, 1]


def test_scale_down_hand_case():
    # 12 devices wanted, 6 left: halves, and the 1-instance model keeps its one.
    assert scale_to_budget({"a": 6, "b": 5, "c": 1}, 6) == {"a": 3, "b": 2, "c": 1}
    assert scale_to_budget({"a": 2, "b": 1}, 10) == {"a": 2, "b": 1}


def test_too_small_a_budget_serves_the_highest_priority_models():
    out = scale_to_budget({"a": 3, "b": 5, "c": 2}, 2, priority={"a": 100.0, "b": 1.0, "c": 50.0})
    assert out == {"a": 1, "b": 0, "c": 1}


desired_maps = st.dictionaries(st.text("abcdef", min_size=1, max_size=3), st.integers(min_value=0, max_value=64),
                               min_size=0, max_size=20)


@settings(max_examples=200, deadline=None)
@given(desired_maps, st.integers(min_value=0, max_value=300))
def test_scaling_never_exceeds_the_budget(desired, budget):
    out = scale_to_budget(desired, budget)
    assert set(out) == set(desired)
    assert sum(out.values()) <= budget or sum(out.values()) == sum(desired.values()) <= budget
    assert sum(out.values()) == min(budget, sum(desired.values()))
    for m in desired:
        assert 0 <= out[m] <= desired[m]
    busy = [m for m in desired if desired[m] > 0]
    if budget >= len(busy):
        assert all(out[m] >= 1 for m in busy)
    else:
        assert sum(1 for m in busy if out[m] == 1) == budget


@settings(max_examples=150, deadline=None)
@given(desired_maps, st.integers(min_value=0, max_value=300))
def test_scaling_is_proportional(desired, budget):
    out = scale_to_budget(desired, budget)
    total = sum(desired.values())
    busy = [m for m in desired if desired[m] > 0]
    if total <= budget or budget < len(busy):
        return
    for a in busy:
        # Monotone in demand: wanting more never yields less.
        for b in busy:
            if desired[a] > desired[b]:
                assert out[a] >= out[b]
            elif desired[a] == desired[b]:
                assert abs(out[a] - out[b]) <= 1
        # Nobody above the floor of one gets more than the ceiling of a plain proportional share (the floor held
        # for small models only takes from the others).
        if out[a] > 1:
            assert out[a] <= math.ceil(desired[a] * budget / total - 1e-9)


def test_bad_input_is_refused():
    with pytest.raises(ValueError):
        scale_to_budget({"a": 1}, -1)
    with pytest.raises(ValueError):
        scale_to_budget({"a": -1}, 3)
    with pytest.raises(ValueError):
        largest_remainder([1.0, -2.0], 3)


def test_floors_are_served_before_padding():
    # a: 10 wanted, 8 of them padding for its queue; b: 6 wanted, all measured load. 10 devices left.
    # Plain proportional: a 6, b 4 (b short of its measured load).
    # Tiered: b's 6 and a's 2 first, then a gets the 2 left.
    assert scale_to_budget({"a": 10, "b": 6}, 10) == {"a": 6, "b": 4}
    assert scale_to_budget({"a": 10, "b": 6}, 10, floor={"a": 2, "b": 6}) == {"a": 4, "b": 6}
    # floors that alone overrun the budget are scaled down as plain counts would be
    assert scale_to_budget({"a": 10, "b": 6}, 4, floor={"a": 2, "b": 6}) == scale_to_budget({"a": 2, "b": 6}, 4)


@settings(max_examples=300, deadline=None)
@given(desired_maps, st.integers(min_value=0, max_value=300), st.booleans(), st.data())
def test_tiered_scaling_never_exceeds_the_budget_and_keeps_each_tier_that_fits(desired, budget, has_first, data):
    """Two tiers (floors, then the rest) or three (a first tier below the floors)."""
    floor = {m: data.draw(st.integers(min_value=0, max_value=n)) for m, n in desired.items()}
    first = {m: data.draw(st.integers(min_value=0, max_value=n)) for m, n in floor.items()} if has_first else None
    out = scale_to_budget(desired, budget, floor=floor, first=first)
    assert set(out) == set(desired)
    assert sum(out.values()) == min(budget, sum(desired.values()))
    for m in desired:
        assert 0 <= out[m] <= desired[m]
    if first is not None and sum(first.values()) <= budget:
        assert all(out[m] >= first[m] for m in desired)
    if sum(floor.values()) <= budget:
        assert all(out[m] >= floor[m] for m in desired)


def test_a_first_tier_is_served_before_the_floors():
    # a: 10 wanted, 6 of them its measured load, but its count is the saturation rule's: only 1 in the first tier.
    # b: 6 wanted, all measured load and reachable. 8 devices left.
    # Floors only: 6 + 6 overrun 8, scaled down to a 4, b 4. With b's floor first: b 6, a what is left.
    assert scale_to_budget({"a": 10, "b": 6}, 8, floor={"a": 6, "b": 6}) == {"a": 4, "b": 4}
    assert scale_to_budget({"a": 10, "b": 6}, 8, floor={"a": 6, "b": 6}, first={"a": 1, "b": 6}) == {"a": 2, "b": 6}
    # the first tier alone overrunning the budget is scaled down as plain counts would be
    assert scale_to_budget({"a": 10, "b": 6}, 5, floor={"a": 6, "b": 6}, first={"a": 1, "b": 6}) == \
        scale_to_budget({"a": 1, "b": 6}, 5)
    # a first tier above the floor is held to it
    assert scale_to_budget({"a": 10, "b": 6}, 8, floor={"a": 6, "b": 2}, first={"a": 1, "b": 6}) == \
        scale_to_budget({"a": 10, "b": 6}, 8, floor={"a": 6, "b": 2}, first={"a": 1, "b": 2})

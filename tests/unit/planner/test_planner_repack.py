"""Departures (local repack past the damage threshold only), needs that grow, and consolidation under a budget."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.core.consolidation import consolidate
from planner.core.packing import Packing, counter_ids, phi
from planner.core.repack import depart, refit


def _bins(*contents: dict[str, tuple[float, float, float]]) -> Packing:
    p = Packing()
    for i, needs in enumerate(contents):
        p.open_bin(f"w{i}")
        for m, v in needs.items():
            p.put(m, v, f"w{i}")
    return p


def _two_bins() -> Packing:
    # w0: x and y complement each other (leftovers 0.4 each, Phi 0). When y leaves, w0's leftovers are
    # (0.5, 0.9, 0.9): Phi = 0.1067. w1 has room for x.
    return _bins({"x": (0.5, 0.1, 0.1), "y": (0.1, 0.5, 0.5)}, {"z": (0.3, 0.3, 0.3)})


DAMAGE = phi((0.5, 0.9, 0.9))


def test_departure_damage_is_phi_of_the_leftovers():
    out = depart(_two_bins(), "y", damage_threshold=1.0)
    assert out.damage == pytest.approx(DAMAGE)


@pytest.mark.parametrize("threshold", [DAMAGE + 0.01, DAMAGE, 0.5])
def test_no_repack_below_or_at_the_threshold(threshold):
    p = _two_bins()
    out = depart(p, "y", damage_threshold=threshold)
    assert not out.is_repacked
    assert out.moves == (("y", "w0", None),)
    assert p.assignment() == {"w0": ["x"], "w1": ["z"]}


@pytest.mark.parametrize("threshold", [DAMAGE - 0.01, 0.0])
def test_repack_when_the_threshold_is_passed(threshold):
    p = _two_bins()
    out = depart(p, "y", damage_threshold=threshold)
    assert out.is_repacked
    # x fits beside z, so the damaged device is emptied and released.
    assert out.moves == (("y", "w0", None), ("x", "w0", "w1"))
    assert out.closed_bin_ids == ("w0",)
    assert p.assignment() == {"w1": ["z", "x"]}


def test_repack_rebalances_when_the_bin_cannot_be_emptied():
    # x (0.8 HBM) fits nowhere else, so w0 is refilled instead: u (compute/bandwidth heavy, light on HBM) moves in
    # from w1 because that lowers both bins' Phi.
    p = _bins({"x": (0.8, 0.1, 0.1), "y": (0.1, 0.6, 0.6)}, {"u": (0.1, 0.6, 0.6), "v": (0.7, 0.1, 0.1)})
    out = depart(p, "y", damage_threshold=0.05)
    assert out.is_repacked
    assert ("u", "w1", "w0") in out.moves
    assert p.bin("w0").potential < out.damage


def test_an_emptied_bin_is_closed_without_repack():
    p = _bins({"x": (0.5, 0.5, 0.5)}, {"z": (0.3, 0.3, 0.3)})
    out = depart(p, "x", damage_threshold=0.0)
    assert out.closed_bin_ids == ("w0",) and not out.is_repacked
    assert p.num_bins == 1


def test_refit_sheds_models_from_a_bin_that_overflows():
    p = _bins({"a": (0.4, 0.4, 0.2), "b": (0.4, 0.4, 0.2)}, {"c": (0.2, 0.2, 0.2)})
    moves = refit(p, {"a": (0.4, 0.7, 0.2), "b": (0.4, 0.4, 0.2), "c": (0.2, 0.2, 0.2)}, counter_ids("n"))
    assert moves == [("a", "w0", "w1")]
    for b in p:
        assert all(u <= 1 + 1e-9 for u in b.used)


def test_consolidation_frees_bins_within_the_budget():
    p = _bins({"a": (0.3, 0.3, 0.3)}, {"b": (0.3, 0.3, 0.3)}, {"c": (0.3, 0.3, 0.3)})
    none = consolidate(p, 0, counter_ids("n"))
    assert none.method == "none" and none.num_bins_after == 3
    one = consolidate(p, 1, counter_ids("n"))
    assert len(one.moves) == 1 and one.num_bins_after == 2
    two = consolidate(p, 2, counter_ids("n"))
    assert len(two.moves) == 2 and two.num_bins_after == 1
    assert p.num_bins == 3, "consolidate does not mutate its input"


vec = st.tuples(*(st.integers(min_value=1, max_value=500).map(lambda x: x / 1000) for _ in range(3)))


@settings(max_examples=40, deadline=None)
@given(st.lists(vec, min_size=2, max_size=12), st.integers(min_value=0, max_value=6), st.randoms())
def test_consolidation_respects_budget_and_capacity(vecs, budget, rnd):
    # A deliberately poor packing: each model in a random bin among many, as after a day of arrivals.
    p = Packing()
    for i, v in enumerate(vecs):
        fitting = [b.bin_id for b in p if all(u + x <= 1 for u, x in zip(b.used, v))]
        bid = rnd.choice(fitting + [f"w{i}"])
        if bid == f"w{i}":
            p.open_bin(bid)
        p.put(f"m{i}", v, bid)
    out = consolidate(p, budget, counter_ids("n"))
    assert len(out.moves) <= budget
    assert out.num_bins_after <= p.num_bins
    assert sorted(out.packing.models()) == sorted(p.models())
    for b in out.packing:
        assert all(u <= 1 + 1e-9 for u in b.used)
    # The moves are exactly the models whose device changed.
    changed = {m for m in p.models() if p.bin_of(m) != out.packing.bin_of(m)}
    assert {m for m, _, _ in out.moves} == changed


"""Phi, the placement rule, whole-set packing, and the exact MILP on small hand-made and random cases."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.core.exact import solve_exact
from planner.core.greedy import lower_bound, pack_ffd, pack_phi, pack_phi_order
from planner.core.packing import Packing, best_phi_bin, counter_ids, phi, place_phi


def _bins(*contents: dict[str, tuple[float, float, float]]) -> Packing:
    p = Packing()
    for i, needs in enumerate(contents):
        p.open_bin(f"w{i}")
        for m, v in needs.items():
            p.put(m, v, f"w{i}")
    return p


def test_phi_is_the_squared_distance_from_the_mean():
    assert phi((1.0, 1.0, 1.0)) == 0.0
    assert phi((0.4, 0.4, 0.4)) == pytest.approx(0.0)
    assert phi((1.0, 0.0, 0.0)) == pytest.approx(2 / 3)
    assert phi((0.5, 0.2, 0.2)) == pytest.approx(0.2**2 + 2 * 0.1**2)


def test_new_model_lands_where_phi_grows_least():
    # w0 used compute and has HBM to spare, w1 the reverse: an HBM-hungry, compute-light model evens out w0's
    # leftovers and unbalances w1's, so it goes to w0.
    p = _bins({"a": (0.1, 0.6, 0.3)}, {"b": (0.6, 0.1, 0.3)})
    new = (0.5, 0.05, 0.2)
    deltas = {b.bin_id: b.delta_phi(new) for b in p}
    assert deltas["w0"] < deltas["w1"]
    assert best_phi_bin(p, new) == "w0"
    assert place_phi(p, "c", new, counter_ids("x")) == "w0"
    assert p.num_bins == 2


def test_least_phi_growth_is_skipped_when_it_does_not_fit_in_every_dimension():
    # w0 would be the better-balanced choice but its bandwidth is full; w1 takes it.
    p = _bins({"a": (0.1, 0.6, 0.95)}, {"b": (0.6, 0.1, 0.3)})
    new = (0.3, 0.05, 0.1)
    assert p.bin("w0").delta_phi(new) < p.bin("w1").delta_phi(new)
    assert best_phi_bin(p, new) == "w1"


def test_a_bin_is_opened_only_when_none_fits():
    p = _bins({"a": (0.7, 0.2, 0.2)}, {"b": (0.2, 0.7, 0.2)})
    assert place_phi(p, "c", (0.25, 0.25, 0.25), counter_ids("x")) in {"w0", "w1"}
    assert p.num_bins == 2
    assert place_phi(p, "d", (0.5, 0.5, 0.1), counter_ids("x")) == "x0"
    assert p.num_bins == 3


def test_bad_needs_are_refused_with_a_clear_error():
    with pytest.raises(ValueError, match="exceeds one device"):
        pack_phi({"big": (1.2, 0.1, 0.1)})
    with pytest.raises(ValueError, match="non-negative"):
        pack_phi({"neg": (-0.1, 0.1, 0.1)})
    with pytest.raises(ValueError, match="3 dimensions"):
        pack_phi({"short": (0.1, 0.1)})  # type: ignore[dict-item]


def test_complementary_models_share_a_device():
    # Two compute-heavy and two bandwidth-heavy models: Phi pairs unlike shapes, 2 devices, which is optimal.
    needs = {"c1": (0.3, 0.7, 0.2), "c2": (0.3, 0.7, 0.2), "b1": (0.3, 0.2, 0.7), "b2": (0.3, 0.2, 0.7)}
    packing = pack_phi_order(needs)
    assert packing.num_bins == 2
    for b in packing:
        assert {m[0] for m in b.needs} == {"c", "b"}


vec = st.tuples(*(st.integers(min_value=0, max_value=600).map(lambda x: x / 1000) for _ in range(3)))
instances = st.dictionaries(st.text("abcdefgh", min_size=1, max_size=4), vec, min_size=1, max_size=12)


def _check_valid(needs, packing: Packing) -> None:
    assert sorted(packing.models()) == sorted(needs)
    for b in packing:
        assert b.needs, "no empty bins"
        for d in range(3):
            assert sum(v[d] for v in b.needs.values()) <= 1 + 1e-9


@settings(max_examples=60, deadline=None)
@given(instances)
def test_every_packing_is_valid_and_no_better_than_the_lower_bound(needs):
    for packing in (pack_phi(needs, num_random_starts=4), pack_ffd(needs), pack_phi_order(needs)):
        _check_valid(needs, packing)
        assert packing.num_bins >= lower_bound(needs)


@settings(max_examples=25, deadline=None)
@given(instances)
def test_the_exact_solver_is_valid_and_never_beaten(needs):
    exact = solve_exact(needs, time_limit_s=5.0)
    _check_valid(needs, exact.packing)
    assert exact.is_optimal
    assert lower_bound(needs) <= exact.num_bins <= pack_phi(needs, num_random_starts=4).num_bins


def test_exact_finds_the_optimum_where_first_fit_decreasing_does_not():
    # 1-D in disguise (the other two dimensions are tiny). Sizes 0.5 0.4 0.3 0.3 0.25 0.25: FFD puts
    # 0.5+0.4, then 0.3+0.3+0.25, then 0.25 -> 3 bins; the optimum is 0.5+0.25+0.25 and 0.4+0.3+0.3 -> 2 bins.
    sizes = {"a": 0.5, "b": 0.4, "c": 0.3, "d": 0.3, "e": 0.25, "f": 0.25}
    needs = {m: (s, 0.01, 0.01) for m, s in sizes.items()}
    assert pack_ffd(needs).num_bins == 3
    exact = solve_exact(needs)
    assert exact.is_optimal and exact.num_bins == 2
    assert pack_phi(needs).num_bins == 2

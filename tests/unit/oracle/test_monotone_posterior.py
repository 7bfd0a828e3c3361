"""Monotone correction and the numpy GP posterior (torch-free parts)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.core.monotone import conservative_bound, isotonic_mean, midpoint_mean, monotone_attainment
from oracle.core.posterior import GPPosterior



@settings(max_examples=60, deadline=None)
@given(y=st.lists(st.floats(-5, 5, allow_nan=False), min_size=1, max_size=30))
def test_midpoint_mean_is_non_decreasing_and_keeps_monotone_input(y):
    y = np.array(y)
    fixed = midpoint_mean(y)
    assert np.all(np.diff(fixed) >= -1e-12)
    assert np.all((fixed >= y.min() - 1e-12) & (fixed <= y.max() + 1e-12))
    ordered = np.sort(y)
    np.testing.assert_allclose(midpoint_mean(ordered), ordered)


def test_midpoint_mean_works_row_by_row():
    rows = np.array([[0.2, 0.1, 0.5], [0.9, 0.3, 0.4]])
    np.testing.assert_allclose(midpoint_mean(rows), np.stack([midpoint_mean(r) for r in rows]))


@settings(max_examples=60, deadline=None)
@given(y=st.lists(st.floats(-5, 5, allow_nan=False), min_size=1, max_size=30), seed=st.integers(0, 99))
def test_isotonic_mean_is_non_decreasing_keeps_monotone_input_and_the_weighted_average(y, seed):
    y = np.array(y)
    std = np.random.default_rng(seed).uniform(0.0, 0.3, len(y))
    fixed = isotonic_mean(y, std)
    assert np.all(np.diff(fixed) >= -1e-9)
    assert np.all((fixed >= y.min() - 1e-9) & (fixed <= y.max() + 1e-9))
    weights = 1.0 / np.maximum(std, 1e-4) ** 2
    # a least-squares fit onto a cone containing the constants keeps the weighted mean
    assert float(np.sum(weights * fixed)) == pytest.approx(float(np.sum(weights * y)), rel=1e-6, abs=1e-6)
    ordered = np.sort(y)
    np.testing.assert_allclose(isotonic_mean(ordered, std), ordered, atol=1e-12)


def test_isotonic_mean_works_row_by_row():
    rows, stds = np.array([[0.2, 0.1, 0.5], [0.9, 0.3, 0.4]]), np.array([[0.1, 0.2, 0.1], [0.01, 0.1, 0.1]])
    np.testing.assert_allclose(isotonic_mean(rows, stds), np.stack([isotonic_mean(r, s) for r, s in zip(rows, stds)]))


def _dip_past_the_sure_counts() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The shape a refitted 32B GP gave on the headline (docs/bench/sim.md run 57): a knee at 16-32 replicas, sure of
    0.998 from 32 to 96, a dip it is unsure of between 128 and 192 (down to 0.91, std 0.15), back near 0.997 by 320."""
    m = np.arange(1, 513)
    mean = np.where(m < 32, 0.1 + 0.898 * (m / 32.0) ** 3, 0.998)
    dip = np.exp(-0.5 * ((m - 160) / 25.0) ** 2)
    mean = mean - 0.09 * dip
    std = np.where(m < 24, 0.12, 0.003) + 0.15 * dip
    return m, mean, std


def test_an_unsure_dip_past_the_sure_counts_does_not_pull_them_under_the_target():
    m, mean, std = _dip_past_the_sure_counts()
    first = {}
    for how in ("isotonic", "midpoint"):
        fixed, bound = monotone_attainment(mean, std, 1.0, how)
        reached = np.nonzero(bound >= 0.99)[0]
        first[how] = int(m[reached[0]]) if len(reached) else None
        assert np.all(np.diff(fixed) >= -1e-12) and np.all(np.diff(bound) >= -1e-12)
    assert first["isotonic"] == 32  # where the GP is sure of 0.998 (its bound 0.995)
    assert first["midpoint"] > 160  # the dip, weighed like the sure counts, drags them under 0.99


@pytest.mark.parametrize("how", ["isotonic", "midpoint"])
@settings(max_examples=60, deadline=None)
@given(mean=st.lists(st.floats(-0.2, 1.2), min_size=1, max_size=40), k=st.floats(0, 3), seed=st.integers(0, 99))
def test_monotone_attainment_is_ordered_bounded_and_conservative(how, mean, k, seed):
    mean = np.array(mean)
    std = np.random.default_rng(seed).uniform(0.0, 0.3, len(mean))
    fixed_mean, bound = monotone_attainment(mean, std, k, how)
    for series in (fixed_mean, bound):
        assert np.all(np.diff(series) >= -1e-12) and np.all((series >= 0) & (series <= 1))
    assert np.all(bound <= fixed_mean + 1e-12)
    raw = np.clip(mean - k * std, 0, 1)
    # claims for m no more than the raw bound of some m' <= m (what holds for fewer replicas holds for more)
    assert np.all(bound <= np.maximum.accumulate(raw) + 1e-12)
    assert np.all(bound >= np.minimum(raw, fixed_mean) - 1e-12)  # and never less than its own m's


def test_conservative_bound_on_a_dip():
    bound = conservative_bound(np.array([0.5, 0.9, 0.6, 0.95]), np.zeros(4), 1.0)
    np.testing.assert_allclose(bound, [0.5, 0.9, 0.9, 0.95])


def test_the_sigma_past_the_profiled_counts_does_not_pull_the_bound_down_below_them():
    # a GP sure of 1.0 up to m = 8 and back at its prior's sigma by m = 64 (the grid the oracle corrects over)
    m = np.arange(1, 65)
    mean, std = np.full(64, 1.0), np.where(m <= 8, 0.005, 0.14)
    bound = conservative_bound(mean, std, 1.0)
    assert bound[0] == pytest.approx(0.995) and bound[63] == pytest.approx(0.995)


def test_posterior_interpolates_when_noise_is_small_and_reverts_far_away():
    x = np.linspace(0, 6, 25)[:, None]
    y = np.sin(x[:, 0])
    post = GPPosterior.from_hyperparameters(
        x, y, lengthscales=np.array([[0.3]]), outputscale=np.array([1.0]), noise=np.array([1e-6]),
        constant=np.array([0.0]), x_mean=x.mean(0), x_std=x.std(0), y_mean=np.array([y.mean()]),
        y_std=np.array([y.std()]))
    mean, std = post.predict(x)
    np.testing.assert_allclose(mean[:, 0], y, atol=1e-3)
    assert np.all(std < 1e-2)
    far_mean, far_std = post.predict(np.array([[100.0]]))
    assert far_mean[0, 0] == pytest.approx(y.mean(), abs=1e-6)  # the constant mean, de-standardised
    assert far_std[0, 0] == pytest.approx(y.std(), rel=1e-3)  # the prior's scale
    again = GPPosterior.from_json(post.to_json())
    np.testing.assert_allclose(again.predict(x)[0], mean)
    with pytest.raises(ValueError, match="inputs per row"):
        post.predict(np.zeros((1, 2)))


def test_an_unknown_monotone_mean_is_refused():
    from oracle.core import OraclePolicy
    assert OraclePolicy().monotone_mean == "isotonic"
    with pytest.raises(ValueError, match="monotone_mean"):
        OraclePolicy(monotone_mean="optimistic")

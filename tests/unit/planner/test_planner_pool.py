"""Pool assignment: large or volatile traffic to the elastic pool up front, back to steady with hysteresis."""
from __future__ import annotations

import random

import pytest
from planner_test_oracles import window

from contracts import Pool
from planner.core.policy import PoolPolicy
from planner.core.pool_assignment import PoolAssigner, excess_cv

POLICY = PoolPolicy(calm_hold_s=60.0, volatility_window_s=60.0, min_num_windows=8)


def _feed(pa: PoolAssigner, model: str, rates: list[float], start_ms: float = 0.0, step_ms: float = 1000.0) -> float:
    t = start_ms
    for r in rates:
        t += step_ms
        pa.observe(window(model, r, t, window_s=10.0))
    return t


def test_large_need_goes_elastic_small_stays_steady():
    pa = PoolAssigner(POLICY)
    v = pa.assign(0.0, {"big": 0.55, "small": 0.2})
    assert v["big"].pool == Pool.ELASTIC and "large" in v["big"].reason
    assert v["small"].pool == Pool.STEADY


def test_poisson_noise_alone_is_not_volatility():
    rng = random.Random(3)
    # 20 rps measured over 10 s windows: counts are Poisson(200), so rates wobble by ~7 % with no real change.
    rates = [rng.gauss(200, 200**0.5) / 10.0 for _ in range(40)]
    assert excess_cv([(r, 10.0) for r in rates]) < 0.1


def test_volatile_traffic_goes_elastic():
    pa = PoolAssigner(POLICY)
    now = _feed(pa, "bursty", [2.0, 2.0, 20.0, 2.0, 18.0, 2.0, 2.0, 25.0, 2.0, 2.0])
    now = _feed(pa, "calm", [10.0] * 10)
    v = pa.assign(now, {"bursty": 0.1, "calm": 0.1})
    assert v["bursty"].pool == Pool.ELASTIC and "volatile" in v["bursty"].reason
    assert v["calm"].pool == Pool.STEADY
    assert v["calm"].volatility == pytest.approx(0.0, abs=0.05)


def test_too_little_history_gives_no_volatility_verdict():
    pa = PoolAssigner(POLICY)
    now = _feed(pa, "new", [1.0, 30.0, 1.0])
    v = pa.assign(now, {"new": 0.1})
    assert v["new"].volatility is None and v["new"].pool == Pool.STEADY


def test_return_to_steady_only_after_calm_hold():
    pa = PoolAssigner(POLICY)
    assert pa.assign(0.0, {"m": 0.6})["m"].pool == Pool.ELASTIC
    # Calm from t=1 s: below the exit threshold, no traffic history (nothing volatile).
    for t_s in (1, 30, 60):
        v = pa.assign(t_s * 1000.0, {"m": 0.2})["m"]
        assert v.pool == Pool.ELASTIC and "hysteresis" in v.reason
    v = pa.assign(61_000.0, {"m": 0.2})["m"]
    assert v.pool == Pool.STEADY and v.is_changed


def test_hysteresis_holds_a_model_hovering_at_the_threshold():
    pa = PoolAssigner(POLICY)
    pools = []
    # Need oscillating around the enter threshold (0.5) but never below the exit one (0.35): one switch, no flap.
    for i, need in enumerate([0.45, 0.52, 0.48, 0.51, 0.40, 0.55, 0.38, 0.49] * 3):
        pools.append(pa.assign(i * 5000.0, {"m": need})["m"].pool)
    switches = sum(1 for a, b in zip(pools, pools[1:]) if a != b)
    assert pools[0] == Pool.STEADY and pools[-1] == Pool.ELASTIC and switches == 1


def test_a_burst_during_the_calm_hold_restarts_it():
    pa = PoolAssigner(POLICY)
    pa.assign(0.0, {"m": 0.6})
    pa.assign(10_000.0, {"m": 0.2})  # calm starts
    pa.assign(40_000.0, {"m": 0.4})  # above the exit threshold: calm resets
    assert pa.assign(75_000.0, {"m": 0.2})["m"].pool == Pool.ELASTIC  # calm since 75 s only
    assert pa.assign(136_000.0, {"m": 0.2})["m"].pool == Pool.STEADY


def test_policy_refuses_exit_above_enter():
    with pytest.raises(ValueError, match="flap"):
        PoolPolicy(large_need_enter=0.4, large_need_exit=0.5)

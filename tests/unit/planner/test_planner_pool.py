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


BURSTS = [0.0, 0.0, 30.0, 0.0, 25.0, 0.0, 0.0, 40.0, 0.0, 0.0]  # a bursty small model: volatile


def test_an_idle_small_model_returns_to_steady_before_the_calm_hold():
    # parked in the elastic pool it would have no instance when its next burst comes; idle in the steady pool it
    # keeps one that shares a device
    policy = POLICY.model_copy(update={"calm_hold_s": 300.0, "idle_return_s": 30.0})
    pa = PoolAssigner(policy)
    now = _feed(pa, "bursty", BURSTS)
    assert pa.assign(now, {"bursty": 0.1})["bursty"].pool == Pool.ELASTIC
    now = _feed(pa, "bursty", [0.0] * 10, start_ms=now)  # 12 s without a request: not idle yet, still volatile
    assert pa.assign(now, {"bursty": 0.1})["bursty"].pool == Pool.ELASTIC
    now = _feed(pa, "bursty", [0.0] * 25, start_ms=now)  # 37 s since the last window that saw one (40 rps)
    v = pa.assign(now, {"bursty": 0.1})["bursty"]
    assert v.pool == Pool.STEADY and v.is_changed and "idle for 37 s" in v.reason
    # its volatility is still the bursts' (they are inside volatility_window_s), but an idle model is not sent back
    assert v.volatility is not None and v.volatility >= policy.volatility_enter
    now = _feed(pa, "bursty", [0.0] * 5, start_ms=now)
    assert pa.assign(now, {"bursty": 0.1})["bursty"].pool == Pool.STEADY
    # traffic comes back volatile: elastic again
    now = _feed(pa, "bursty", [50.0, 0.0, 45.0], start_ms=now)
    v = pa.assign(now, {"bursty": 0.1})["bursty"]
    assert v.pool == Pool.ELASTIC and "volatile" in v.reason


def test_an_idle_large_model_stays_elastic():
    pa = PoolAssigner(POLICY.model_copy(update={"idle_return_s": 30.0}))
    now = _feed(pa, "big", [5.0] * 8)
    assert pa.assign(now, {"big": 0.8})["big"].pool == Pool.ELASTIC
    now = _feed(pa, "big", [0.0] * 40, start_ms=now)
    v = pa.assign(now, {"big": 0.4})["big"]  # at rest its need is still above large_need_exit
    assert v.pool == Pool.ELASTIC and "large" in v.reason


def test_idle_return_is_off_by_default():
    pa = PoolAssigner(POLICY)
    assert POLICY.idle_return_s is None
    now = _feed(pa, "bursty", BURSTS)
    assert pa.assign(now, {"bursty": 0.1})["bursty"].pool == Pool.ELASTIC
    now = _feed(pa, "bursty", [0.0] * 50, start_ms=now)
    v = pa.assign(now, {"bursty": 0.1})["bursty"]
    assert v.pool == Pool.ELASTIC and "idle" not in v.reason


def test_a_model_that_never_had_traffic_is_not_idle():
    # no window ever saw a request: the rule has nothing to go on, and the hysteresis decides as before
    pa = PoolAssigner(POLICY.model_copy(update={"idle_return_s": 1.0}))
    assert pa.assign(0.0, {"m": 0.6})["m"].pool == Pool.ELASTIC
    assert pa.assign(30_000.0, {"m": 0.2})["m"].pool == Pool.ELASTIC  # calm 30 s of calm_hold_s 60

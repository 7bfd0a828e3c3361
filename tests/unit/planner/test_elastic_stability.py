"""The elastic scaler's burst headroom and its scale-in band: counts sized for more than the window's rate, and
counts that do not flap while a load wanders."""
from __future__ import annotations

import math

from planner_test_oracles import TableOracle, bare_elastic, features, window

from planner.core.elastic import ElasticScaler
from planner.core.policy import ElasticPolicy
from planner.core.replica_search import search_min_replicas


def _m_star(rate_rps: float) -> int:
    """m* of the table oracle for a window of `rate_rps` (the test windows: 512 + 128 tokens per request)."""
    feats = features(rate_rps * 640.0)
    return search_min_replicas(TableOracle(), {"m": feats}, 0.95, 1.0, 64)["m"].num_replicas


def _count(scaler: ElasticScaler, rate_rps: float, now_ms: float) -> int:
    scaler.observe(window("m", rate_rps, now_ms))
    target = scaler.tick(now_ms, ["m"], budget_devices=1000).plan.targets[0]
    return target.num_prefill + target.num_decode


def test_headroom_sizes_replicas_for_a_higher_rate():
    plain = ElasticScaler(TableOracle(), bare_elastic(target_attainment=0.95, is_debounced=False))
    roomy = ElasticScaler(TableOracle(), bare_elastic(target_attainment=0.95, is_debounced=False,
                                                       load_headroom=1.5))
    assert _count(plain, 10.0, 0.0) == _m_star(10.0)
    assert _count(roomy, 10.0, 0.0) == _m_star(15.0) > _m_star(10.0)


def test_counts_inside_the_scale_in_band_stay_put():
    policy = bare_elastic(target_attainment=0.95, is_debounced=False, scale_in_headroom=2.0)
    scaler = ElasticScaler(TableOracle(), policy)
    high = _count(scaler, 20.0, 0.0)
    assert high == _m_star(20.0)
    # 15 rps needs fewer, but twice 15 rps needs at least as many: keep them (no drain now, no fork later).
    assert _m_star(15.0) < high <= _m_star(30.0)
    scaler.observe(window("m", 15.0, 500.0))
    target = scaler.tick(500.0, ["m"], budget_devices=1000).plan.targets[0]
    assert target.num_prefill + target.num_decode == high
    assert "scale-in band" in target.reason
    # 4 rps: even twice that needs fewer, so the count comes down -- to what twice the rate needs.
    assert _count(scaler, 4.0, 1000.0) == _m_star(8.0) < high
    # Growth is never held back by the band.
    assert _count(scaler, 30.0, 1500.0) == _m_star(30.0)


def test_without_a_band_the_count_follows_the_load_down():
    scaler = ElasticScaler(TableOracle(), bare_elastic(target_attainment=0.95, is_debounced=False))
    _count(scaler, 20.0, 0.0)
    assert _count(scaler, 15.0, 500.0) == _m_star(15.0)


def test_a_queue_left_behind_is_sized_for_as_well_as_the_arrivals():
    def count(backlog_drain_s: float, queue_depth: int) -> int:
        scaler = ElasticScaler(TableOracle(), bare_elastic(target_attainment=0.95, is_debounced=False,
                                                            backlog_drain_s=backlog_drain_s))
        scaler.observe(window("m", 10.0, 0.0).model_copy(update={"queue_depth": queue_depth}))
        target = scaler.tick(0.0, ["m"], budget_devices=1000).plan.targets[0]
        return target.num_prefill + target.num_decode

    assert count(0.0, 100) == count(10.0, 0) == _m_star(10.0), "off, or nothing queued: arrivals only"
    # 100 queued requests to clear within 10 s are 10 more requests per second.
    assert count(10.0, 100) == _m_star(20.0) > _m_star(10.0)


def test_the_scale_in_hold_keeps_the_largest_recent_count():
    policy = bare_elastic(target_attainment=0.95, is_debounced=False, scale_in_hold_s=10.0)
    scaler = ElasticScaler(TableOracle(), policy)
    high = _count(scaler, 20.0, 0.0)
    assert high == _m_star(20.0) > _m_star(12.0) > _m_star(4.0)
    # a dip within the hold keeps the count the burst had
    scaler.observe(window("m", 4.0, 5_000.0))
    target = scaler.tick(5_000.0, ["m"], budget_devices=1000).plan.targets[0]
    assert target.num_prefill + target.num_decode == high and "within the last 10 s" in target.reason
    # later counts ask less: the hold follows the largest count of the last 10 s, not the first one
    assert _count(scaler, 12.0, 9_000.0) == high  # t=0's count is still in the window
    assert _count(scaler, 4.0, 12_000.0) == _m_star(12.0)  # t=0 left the window; t=9 s's count holds
    assert _count(scaler, 4.0, 19_500.0) == _m_star(4.0)  # everything larger is older than 10 s
    assert _count(scaler, 30.0, 20_000.0) == _m_star(30.0)  # growth is never held back


def test_without_a_hold_a_dip_gives_the_replicas_back():
    scaler = ElasticScaler(TableOracle(), bare_elastic(target_attainment=0.95, is_debounced=False))
    _count(scaler, 20.0, 0.0)
    assert _count(scaler, 4.0, 5_000.0) == _m_star(4.0)


def test_unpadded_counts_take_out_headroom_and_backlog():
    from planner.core import unpadded_counts

    policy = ElasticPolicy(load_headroom=1.5, backlog_drain_s=1.0)
    quiet = window("q", 10.0, 0.0)
    queued = window("b", 10.0, 0.0).model_copy(update={"queue_depth": 500})
    out = unpadded_counts({"q": 9, "b": 40, "idle": 0}, {"q": quiet, "b": queued}, policy)
    assert out["q"] == 6  # 9 replicas sized for 1.5x the rate: 6 carry the measured rate
    assert 1 <= out["b"] < 9  # mostly its queue: the measured rate alone needs far fewer
    assert out["idle"] == 0
    assert unpadded_counts({"q": 9}, {"q": quiet}, bare_elastic()) == {"q": 9}  # nothing padded


def _headroom_count(attainment, headroom_target: float, rate_rps: float = 10.0):
    scaler = ElasticScaler(TableOracle(attainment=attainment),
                           bare_elastic(is_debounced=False, load_headroom=1.5,
                                        headroom_target_attainment=headroom_target))
    scaler.observe(window("m", rate_rps, 0.0))
    target = scaler.tick(0.0, ["m"], budget_devices=1000).plan.targets[0]
    return target.num_prefill + target.num_decode, target.reason


def _replica_loads(feats) -> float:
    return feats.token_rate_tps / 1000.0  # the table oracle's default: a replica serves 1,000 tokens/s


def test_the_headroom_is_sized_for_its_own_target_and_the_measured_rate_for_the_target():
    # A smooth knee (attainment 1 - exp(-3 m / load)), 10 rps = 6.4 loads, 1.5x = 9.6: 0.95 at 1.5x the rate needs
    # 10 replicas, 0.99 at the rate 12, and 0.99 at 1.5x the rate (the rule before) 17.
    def smooth(model, feats, m):
        return 1.0 - math.exp(-3.0 * m / _replica_loads(feats))

    count, reason = _headroom_count(smooth, 0.95)
    assert count == 12 and "at the measured rate" in reason
    assert _headroom_count(smooth, 0.99)[0] == 17


def test_a_knee_that_steps_at_capacity_is_sized_as_before():
    # Attainment climbing from 0 at 80 % of a replica's capacity to 1 at 100 %: 1.5x the rate decides (10), and a
    # target of 0.95 or 0.99 there asks for the same count.
    def steep(model, feats, m):
        return min(1.0, max(0.0, (m / _replica_loads(feats) - 0.8) / 0.2))

    count, reason = _headroom_count(steep, 0.95)
    assert count == _headroom_count(steep, 0.99)[0] == 10
    assert "x1.5 the rate" in reason

"""The elastic scaler: binary search for m*, P/D split, the budget, debounce."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from planner_test_oracles import TableOracle, bare_elastic, features, window

from contracts import LoadFeatures
from planner.core.debounce import Debouncer, agreed
from planner.core.elastic import ElasticScaler, num_devices, split_prefill_decode
from planner.core.policy import ElasticPolicy
from planner.core.replica_search import search_min_replicas

POLICY = bare_elastic(target_attainment=0.95, k_sigma=1.0, max_num_replicas=64)


def _linear_min_m(oracle: TableOracle, model: str, feats: LoadFeatures, target: float, k: float, cap: int) -> int:
    for m in range(1, cap + 1):
        if oracle.attainment(model, feats, m) - k * 0.005 >= target:
            return m
    return cap


@pytest.mark.parametrize("rate_tps", [0.0, 100.0, 1000.0, 5000.0, 20_000.0, 60_000.0])
def test_binary_search_finds_the_least_m_meeting_the_target(rate_tps):
    oracle = TableOracle()
    feats = features(rate_tps)
    got = search_min_replicas(oracle, {"m": feats}, 0.95, 1.0, 64)["m"]
    want = _linear_min_m(oracle, "m", feats, 0.95, 1.0, 64)
    assert got.num_replicas == want and got.is_reachable
    bounds = dict(zip(got.prediction.replicas, got.prediction.attainment_bound))
    assert bounds[want] >= 0.95
    if want > 1:
        assert bounds[want - 1] < 0.95, "the search asked the neighbour below, so m* is proven least"


def test_search_batches_models_and_takes_logarithmic_rounds():
    oracle = TableOracle()
    feats = {f"m{i}": features(500.0 * (i + 1)) for i in range(62)}
    out = search_min_replicas(oracle, feats, 0.95, 1.0, 64)
    assert oracle.num_elasticity_calls == out["m0"].num_rounds <= 1 + math.ceil(math.log2(63))
    for m, f in feats.items():
        assert out[m].num_replicas == _linear_min_m(oracle, m, f, 0.95, 1.0, 64)


def test_unreachable_target_takes_the_saturation_point_and_is_flagged():
    # The bound (attainment - 0.005) tops out at 0.895 from m = 9 on: more replicas buy nothing visible.
    oracle = TableOracle(attainment=lambda model, f, m: min(0.9, 0.1 * m))
    out = search_min_replicas(oracle, {"m": features(1000.0)}, 0.95, 1.0, 16, saturation_eps=0.005)["m"]
    assert out.num_replicas == 9 and not out.is_reachable
    strict = search_min_replicas(oracle, {"m": features(1000.0)}, 0.95, 1.0, 16, saturation_eps=0.0)["m"]
    assert strict.num_replicas == 9
    rising = TableOracle(attainment=lambda model, f, m: 0.5 + 0.02 * m)
    assert search_min_replicas(rising, {"m": features(1.0)}, 0.99, 0.0, 16)["m"].num_replicas == 16


@pytest.mark.parametrize("rate_tps", [100.0, 5000.0, 60_000.0])
def test_grid_and_bisect_modes_agree(rate_tps):
    feats = {"m": features(rate_tps)}
    a = search_min_replicas(TableOracle(), feats, 0.95, 1.0, 64, mode="bisect")["m"]
    grid_oracle = TableOracle()
    b = search_min_replicas(grid_oracle, feats, 0.95, 1.0, 64, mode="grid")["m"]
    assert a.num_replicas == b.num_replicas and grid_oracle.num_elasticity_calls == 1
    assert len(b.prediction.replicas) == 64


@given(rate_tps=st.floats(0.0, 200_000.0), hint=st.integers(-3, 80), cap=st.integers(1, 64),
       target=st.sampled_from([0.5, 0.9, 0.95, 0.999]), flat=st.booleans())
@settings(max_examples=300, deadline=None)
def test_a_hint_never_changes_the_answer(rate_tps, hint, cap, target, flat):
    # flat: a bound that saturates below the target (the unreachable case, the answer where it flattens)
    shape = (lambda model, f, m: min(0.8, 0.3 + 0.05 * m)) if flat else None
    feats = {"m": features(rate_tps)}
    plain = search_min_replicas(TableOracle(attainment=shape), feats, target, 1.0, cap)["m"]
    hinted = search_min_replicas(TableOracle(attainment=shape), feats, target, 1.0, cap, hints={"m": hint})["m"]
    assert (hinted.num_replicas, hinted.is_reachable) == (plain.num_replicas, plain.is_reachable)


def test_a_right_hint_ends_the_search_in_one_call():
    feats = {"m": features(20_000.0)}
    answer = search_min_replicas(TableOracle(), feats, 0.95, 1.0, 64)["m"]
    assert answer.num_rounds > 2  # without a hint: a bisection
    oracle = TableOracle()
    hinted = search_min_replicas(oracle, feats, 0.95, 1.0, 64, hints={"m": answer.num_replicas})["m"]
    assert hinted.num_replicas == answer.num_replicas and oracle.num_elasticity_calls == 1
    # one off: still right, and fewer calls than bisecting the whole range
    near = TableOracle()
    off = search_min_replicas(near, feats, 0.95, 1.0, 64, hints={"m": answer.num_replicas + 1})["m"]
    assert off.num_replicas == answer.num_replicas and near.num_elasticity_calls < answer.num_rounds


def test_a_right_hint_asks_only_the_hint_and_the_count_below():
    # 1 and the cap are not needed when the hint still meets the target: that already shows the cap reaches it
    feats = {"m": features(20_000.0)}
    answer = search_min_replicas(TableOracle(), feats, 0.95, 1.0, 64)["m"].num_replicas
    oracle = TableOracle()
    hinted = search_min_replicas(oracle, feats, 0.95, 1.0, 64, hints={"m": answer})["m"]
    assert hinted.is_reachable and sorted(r for _, r in oracle.asked) == [answer - 1, answer]


@pytest.mark.parametrize("offset", [-1, 1])
def test_a_hint_one_off_settles_in_two_calls(offset):
    # the second call asks the end the answer lies towards with the next count past the hint, which settles it
    feats = {"m": features(20_000.0)}
    answer = search_min_replicas(TableOracle(), feats, 0.95, 1.0, 64)["m"].num_replicas
    oracle = TableOracle()
    hinted = search_min_replicas(oracle, feats, 0.95, 1.0, 64, hints={"m": answer + offset})["m"]
    assert hinted.num_replicas == answer and oracle.num_elasticity_calls == 2


def test_prefill_decode_split():
    p = ElasticPolicy(decode_token_cost_ratio=2.0)
    # prefill work 1000, decode work 250 * 2 = 500: two thirds prefill.
    f = features(1.0, input_len_mean=1000.0, output_len_mean=250.0)
    assert split_prefill_decode(6, f, p) == (4, 2)
    assert split_prefill_decode(1, f, p) == (1, 0), "one instance runs colocated"
    assert split_prefill_decode(0, f, p) == (0, 0)
    # Decode-dominated: still one prefill.
    assert split_prefill_decode(3, features(1.0, input_len_mean=10.0, output_len_mean=2000.0), p) == (1, 2)


def test_a_measured_ratio_overrides_the_policys():
    p = ElasticPolicy(decode_token_cost_ratio=2.0)
    f = features(1.0, input_len_mean=250.0, output_len_mean=750.0)
    assert split_prefill_decode(8, f, p) == (1, 7)  # 250 : 1500
    assert split_prefill_decode(8, f, p, decode_token_cost_ratio=1.0) == (2, 6)  # 250 : 750
    assert split_prefill_decode(8, f, p, decode_token_cost_ratio=None) == (1, 7)


def test_the_policys_ratio_as_a_floor_from_a_count_on():
    """`decode_ratio_floor_from` (off by default): from that many instances on, a measured ratio below the policy's
    gives way to it; below, the measured one splits."""
    assert ElasticPolicy().decode_ratio_floor_from is None
    p = ElasticPolicy(decode_token_cost_ratio=2.0, decode_ratio_floor_from=16)
    f = features(1.0, input_len_mean=250.0, output_len_mean=750.0)
    assert split_prefill_decode(8, f, p, decode_token_cost_ratio=1.0) == (2, 6)  # below 16: measured
    assert split_prefill_decode(16, f, p, decode_token_cost_ratio=1.0) == (2, 14)  # 250 : 1500, not 250 : 750 (4/12)
    assert split_prefill_decode(16, f, p, decode_token_cost_ratio=4.0) == (1, 15)  # a floor, not a cap


@pytest.mark.parametrize("measured", [None, 0.5, 1.0, 4.0])
def test_the_scaler_splits_by_the_oracles_measured_ratio(measured):
    """A calibrated oracle's decode-over-prefill token cost (ElasticityPrediction.decode_token_cost_ratio) sizes
    the split; without one, the policy's."""
    policy = bare_elastic(target_attainment=0.95, is_debounced=False, decode_token_cost_ratio=2.0,
                          min_num_disaggregated=3)
    scaler = ElasticScaler(TableOracle(per_replica_tps=200.0, decode_token_cost_ratio=measured), policy)
    scaler.observe(window("hot", 20.0, 4000.0, input_len_mean=500.0, output_len_mean=500.0))
    hot = scaler.tick(1000.0, ["hot"], budget_devices=100).plan.targets[0]
    total = hot.num_prefill + hot.num_decode
    assert total >= 6 and hot.prediction.decode_token_cost_ratio == measured
    want = split_prefill_decode(total, scaler.load("hot").features, policy, measured)
    assert (hot.num_prefill, hot.num_decode) == want
    share = 1.0 / (1.0 + (measured if measured is not None else 2.0))  # prefill's share of the device time
    assert abs(hot.num_prefill / total - share) <= 1.0 / total


@pytest.mark.parametrize("is_priced", [False, True])
def test_the_answers_spread_prices_decode_only_with_the_knob(is_priced):
    """`is_decode_priced_by_answer_spread` (off by default): the scaler asks the oracle's ratio for the window's
    answer-length spread, a decode token dearer where long answers fill a decode instance's KV cache; off, for
    answers all as long as the mean. The calibrated roofline of the simulated die's 32B kind answers."""
    from oracle.core import ModelProfile, Oracle
    from oracle.roofline import RooflineModel
    from oracle.specs import device, model_shape

    assert ElasticPolicy().is_decode_priced_by_answer_spread is False
    big = RooflineModel(device("ascend-910c-die"), model_shape("qwen2.5-32b"), tp=2)
    oracle = Oracle({"big": ModelProfile(big, 1_000.0, 68.0, roofline_attainment_std=0.0, is_calibrated=True)})
    policy = bare_elastic(is_debounced=False, is_decode_priced_by_answer_spread=is_priced)
    scaler = ElasticScaler(oracle, policy)
    spread = LoadFeatures(token_rate_tps=20.0 * (320.0 + 660.0), input_len_mean=320.0, input_len_var=0.0,
                          output_len_mean=660.0, output_len_var=(1.7 * 660.0) ** 2)
    scaler.observe(window("big", 20.0, 1000.0).model_copy(update={"features": spread}))
    target = scaler.tick(1000.0, ["big"], budget_devices=400, devices_per_instance={"big": 2}).plan.targets[0]
    priced = spread if is_priced else spread.model_copy(update={"output_len_var": 0.0})
    ratio = big.decode_token_cost_ratio(priced, 68.0)
    assert target.prediction.decode_token_cost_ratio == pytest.approx(ratio, rel=0.02)
    total = target.num_prefill + target.num_decode
    told = target.prediction.decode_token_cost_ratio
    assert total >= 3 and (target.num_prefill, target.num_decode) == split_prefill_decode(total, spread, policy, told)
    mean_only = big.decode_token_cost_ratio(spread.model_copy(update={"output_len_var": 0.0}), 68.0)
    assert (ratio > 1.5 * mean_only) is is_priced


def test_tick_produces_a_plan_with_predictions_and_reasons():
    oracle = TableOracle(version="v7")
    scaler = ElasticScaler(oracle, bare_elastic(target_attainment=0.95, is_debounced=False))
    scaler.observe(window("hot", 20.0, 1000.0))
    scaler.observe(window("idle", 0.0, 1000.0))
    plan = scaler.tick(1000.0, ["hot", "idle"], budget_devices=100).plan
    hot = next(t for t in plan.targets if t.model == "hot")
    idle = next(t for t in plan.targets if t.model == "idle")
    assert hot.desired_replicas == _linear_min_m(oracle, "hot", scaler.load("hot").features, 0.95, 1.0, 64)
    assert hot.num_prefill + hot.num_decode == hot.desired_replicas
    assert hot.prediction is not None and hot.prediction.model_version == "v7"
    assert "m*=" in hot.reason
    assert (idle.num_prefill, idle.num_decode, idle.reason) == (0, 0, "no traffic")
    assert plan.num_devices_used == hot.desired_replicas and not plan.is_scaled_down
    assert [w.model for w in plan.loads] == ["hot", "idle"]


def test_over_budget_scales_down_proportionally():
    oracle = TableOracle()
    scaler = ElasticScaler(oracle, bare_elastic(target_attainment=0.95, is_debounced=False))
    for name, rate in (("a", 30.0), ("b", 15.0), ("c", 1.0)):
        scaler.observe(window(name, rate, 0.0))
    free = scaler.tick(0.0, ["a", "b", "c"], budget_devices=1000).plan
    want = {t.model: t.desired_replicas for t in free.targets}
    budget = sum(want.values()) // 2
    plan = scaler.tick(500.0, ["a", "b", "c"], budget_devices=budget).plan
    got = {t.model: t.num_prefill + t.num_decode for t in plan.targets}
    assert plan.is_scaled_down and plan.num_devices_used == budget == sum(got.values())
    assert got["c"] >= 1 and got["a"] >= got["b"] >= got["c"]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(min_value=0.0, max_value=60.0), min_size=1, max_size=12),
    st.lists(st.integers(min_value=0, max_value=80), min_size=1, max_size=8),
)
def test_the_budget_is_never_exceeded(rates, budgets):
    scaler = ElasticScaler(TableOracle(), POLICY)
    models = [f"m{i}" for i in range(len(rates))]
    for i, b in enumerate(budgets):  # budgets change tick to tick, as the steady pool grows and shrinks
        for m, r in zip(models, rates):
            scaler.observe(window(m, r * (1 + 0.3 * (i % 2)), i * 500.0))
        plan = scaler.tick(i * 500.0, models, budget_devices=b).plan
        used = sum(t.num_prefill + t.num_decode for t in plan.targets)
        assert used == plan.num_devices_used <= b


def test_debounce_holds_a_flapping_input_steady():
    # The load flips each tick between two levels whose m* differ by one: the raw plan flaps 3,4,3,4,...
    oracle = TableOracle()
    scaler = ElasticScaler(oracle, bare_elastic(target_attainment=0.95, min_num_disaggregated=100))
    low, high = 4.0, 5.5  # rps (x 640 tokens): m* differ
    m_low = _linear_min_m(oracle, "m", window("m", low, 0).features, 0.95, 1.0, 64)
    m_high = _linear_min_m(oracle, "m", window("m", high, 0).features, 0.95, 1.0, 64)
    assert m_low != m_high
    applied = []
    for i, rate in enumerate([low, low] + [high, low] * 6):
        scaler.observe(window("m", rate, i * 500.0))
        d = scaler.tick(i * 500.0, ["m"], budget_devices=100)
        applied.append(d.plan.targets[0].num_prefill)
    assert applied[0] == 1, "the first plan starts one instance (requests wait without one), the rest waits"
    assert applied[1:] == [m_low] * (len(applied) - 1)
    # ...and a change that two plans in a row agree on is applied.
    for i in (100, 101):
        scaler.observe(window("m", high, i * 500.0))
        d = scaler.tick(i * 500.0, ["m"], budget_devices=100)
    assert d.plan.targets[0].num_prefill == m_high and not d.plan.is_debounced


def test_a_shrinking_budget_overrides_the_debounce():
    scaler = ElasticScaler(TableOracle(), bare_elastic(target_attainment=0.95))
    for i in range(2):
        scaler.observe(window("m", 20.0, i * 500.0))
        plan = scaler.tick(i * 500.0, ["m"], budget_devices=100).plan
    n = plan.num_devices_used
    assert n > 2
    plan = scaler.tick(1000.0, ["m"], budget_devices=2).plan
    assert plan.num_devices_used == 2 and "budget shrank" in plan.reason


def test_debouncer_unit():
    d: Debouncer[str] = Debouncer((0,))
    assert d.step({"a": (1,)}) == ({"a": (0,)}, {"a"})
    assert d.step({"a": (1,)}) == ({"a": (1,)}, set())
    assert d.step({"a": (2,)}) == ({"a": (1,)}, {"a"})
    assert d.step({"a": (1,)}) == ({"a": (1,)}, set())
    assert d.step({"a": (2,)}) == ({"a": (1,)}, {"a"})
    assert d.step({"a": (2,)}) == ({"a": (2,)}, set())


def test_debounce_follows_a_steady_ramp_one_tick_behind():
    # Each proposal differs from the one before, but the last two always agree that more is needed.
    d: Debouncer[str] = Debouncer((0,))
    applied = [d.step({"a": (n,)})[0]["a"][0] for n in (1, 2, 3, 4, 5, 4, 3, 2)]
    assert applied == [0, 1, 2, 3, 4, 4, 4, 3]


def test_debounce_needs_both_components_to_agree():
    assert agreed((2, 2), (3, 3), (4, 3)) == (3, 3)
    assert agreed((2, 2), (3, 1), (3, 3)) == (2, 2), "one says more decode, one less: hold"
    assert agreed((2, 2), (5, 1), (5, 1)) == (5, 1), "two identical proposals always apply"
    assert agreed((4, 4), (2, 3), (3, 2)) == (3, 3)


def test_negative_budget_is_refused():
    with pytest.raises(ValueError):
        ElasticScaler(TableOracle()).tick(0.0, ["m"], budget_devices=-1)


def test_devices_of_a_split():
    assert num_devices((3, 2)) == 5 and num_devices((1, 0)) == 1

"""Rules the elastic scaler core owns for the live and the simulated system alike: keep-alive, the budget in devices
with tensor-parallel groups, and no collapse at saturation."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from planner_test_oracles import TableOracle, bare_elastic, features, window

from planner.core.elastic import ElasticScaler, fit_to_budget
from planner.core.policy import ElasticPolicy
from planner.core.replica_search import search_min_replicas


def _target(plan, model):
    return next(t for t in plan.targets if t.model == model)


def _count(plan, model) -> int:
    t = _target(plan, model)
    return t.num_prefill + t.num_decode


def _idle_window(model: str, end_ms: float, **update):
    return window(model, 0.0, end_ms).model_copy(update=update)


# ----------------------------------------------------------------------------------------------- keep-alive
def test_a_model_with_running_streams_is_not_parked():
    scaler = ElasticScaler(TableOracle(), bare_elastic(keepalive_s=0.0, is_debounced=False))
    scaler.observe(window("m", 2.0, 0.0))
    assert _count(scaler.tick(0.0, ["m"], 10).plan, "m") >= 1
    scaler.observe(_idle_window("m", 5_000.0))  # the window saw no arrival: the search says 0
    parked = scaler.tick(5_000.0, ["m"], 10).plan
    assert _count(parked, "m") == 0, "nothing runs and keep-alive is off: parked"
    kept = scaler.tick(5_500.0, ["m"], 10, in_flight={"m": 3}).plan
    assert _count(kept, "m") == 1 and "3 running or waiting" in _target(kept, "m").reason


def test_a_model_with_requests_queued_at_a_dispatcher_is_not_parked():
    scaler = ElasticScaler(TableOracle(), bare_elastic(keepalive_s=0.0, is_debounced=False))
    scaler.observe(_idle_window("m", 1_000.0, queue_depth=2))
    plan = scaler.tick(1_000.0, ["m"], 10).plan
    assert _count(plan, "m") == 1 and "2 queued" in _target(plan, "m").reason


def test_keepalive_holds_one_instance_for_keepalive_s_after_the_last_arrival():
    scaler = ElasticScaler(TableOracle(), bare_elastic(keepalive_s=60.0, is_debounced=False))
    scaler.observe(window("m", 1.0, 0.0))
    for now_ms in (10_000.0, 60_000.0):
        scaler.observe(_idle_window("m", now_ms))
        plan = scaler.tick(now_ms, ["m"], 10).plan
        assert _count(plan, "m") == 1 and "keep-alive 60 s" in _target(plan, "m").reason
    scaler.observe(_idle_window("m", 60_500.0))
    assert _count(scaler.tick(60_500.0, ["m"], 10).plan, "m") == 0, "past keepalive_s: parked"
    assert _count(scaler.tick(61_000.0, ["never"], 10).plan, "never") == 0, "never had traffic"


def test_keepalive_is_the_default():
    assert ElasticPolicy().keepalive_s == 60.0


# ----------------------------------------------------------------------------------------------- budget in devices
def test_a_tensor_parallel_instance_takes_its_whole_group_from_the_budget():
    scaler = ElasticScaler(TableOracle(), bare_elastic(is_debounced=False, min_num_disaggregated=100))
    scaler.observe(window("big", 20.0, 0.0))
    scaler.observe(window("small", 20.0, 0.0))
    free = scaler.tick(0.0, ["big", "small"], 1000, devices_per_instance={"big": 2}).plan
    want_big, want_small = _count(free, "big"), _count(free, "small")
    assert _target(free, "big").num_devices_per_instance == 2
    assert free.num_devices_used == 2 * want_big + want_small
    budget = want_big + want_small  # room for about half of it, in devices
    plan = scaler.tick(500.0, ["big", "small"], budget, devices_per_instance={"big": 2}).plan
    assert plan.is_scaled_down and plan.num_devices_used <= budget
    assert plan.num_devices_used == 2 * _count(plan, "big") + _count(plan, "small")
    assert _count(plan, "big") >= 1 and _count(plan, "small") >= 1


@given(desired=st.dictionaries(st.sampled_from("abcdef"), st.integers(0, 40), min_size=1),
       tp=st.dictionaries(st.sampled_from("abcdef"), st.sampled_from([1, 2, 4, 8])),
       budget=st.integers(0, 120))
@settings(max_examples=300, deadline=None)
def test_fit_to_budget_never_overruns_and_never_gives_more_than_wanted(desired, tp, budget):
    out = fit_to_budget(desired, budget, tp, {m: float(n) for m, n in desired.items()}, None)
    assert sum(n * tp.get(m, 1) for m, n in out.items()) <= max(budget, 0) or out == desired
    assert all(0 <= out[m] <= desired[m] for m in desired)
    if sum(n * tp.get(m, 1) for m, n in desired.items()) <= budget:
        assert out == desired
    # a model left without an instance could not have had one: no whole group was left
    left = budget - sum(n * tp.get(m, 1) for m, n in out.items())
    assert all(out[m] > 0 or desired[m] == 0 or tp.get(m, 1) > left for m in desired)


# ----------------------------------------------------------------------------------------------- saturation
def test_saturation_keeps_the_cap_instead_of_collapsing_to_one():
    # overloaded at every count the oracle can see: the bound is 0 up to the cap
    oracle = TableOracle(attainment=lambda model, f, m: 0.0)
    out = search_min_replicas(oracle, {"m": features(1e6)}, 0.99, 1.0, 64)["m"]
    assert out.num_replicas == 64 and not out.is_reachable
    scaler = ElasticScaler(TableOracle(attainment=lambda model, f, m: 0.0),
                           bare_elastic(is_debounced=False, max_num_replicas=64, min_num_disaggregated=100))
    scaler.observe(window("m", 50.0, 0.0))
    plan = scaler.tick(0.0, ["m"], 40).plan
    assert _target(plan, "m").desired_replicas == 64
    assert _count(plan, "m") == 40, "the budget, not a collapse, limits it"
    assert "saturated" in _target(plan, "m").reason and "unreachable" in plan.reason


def test_a_bound_that_plateaus_below_the_target_still_takes_its_saturation_point():
    oracle = TableOracle(attainment=lambda model, f, m: min(0.9, 0.1 * m))
    assert search_min_replicas(oracle, {"m": features(1000.0)}, 0.95, 1.0, 64)["m"].num_replicas == 9


def test_a_models_first_instance_is_not_held_back_by_the_debounce():
    scaler = ElasticScaler(TableOracle(), bare_elastic(min_num_disaggregated=100))
    scaler.observe(window("m", 20.0, 0.0))
    first = _target(scaler.tick(0.0, ["m"], 100).plan, "m")
    assert (first.num_prefill, first.num_decode) == (1, 0) and first.desired_replicas > 1
    assert "first instance at once" in first.reason
    second = _target(scaler.tick(500.0, ["m"], 100).plan, "m")
    assert second.num_prefill == second.desired_replicas, "two plans agree: the rest"
    assert _target(ElasticScaler(TableOracle(), bare_elastic()).tick(0.0, ["m"], 0).plan, "m").num_prefill == 0


# ------------------------------------------------------------------------------- a queue skips the debounce
def _flapping_burst(scaler, queue_depths):
    """One model already at one instance; each tick the rate alone asks for one and the queue for more (the
    backlog term), then less as the queue drains: the proposals flap as they did on the simulator's seed 2."""
    plans = []
    for i, queue in enumerate(queue_depths):
        now_ms = 1_000.0 + 500.0 * i
        scaler.observe(window("m", 1.0, now_ms).model_copy(update={"queue_depth": queue}))
        plans.append(_target(scaler.tick(now_ms, ["m"], 100).plan, "m"))
    return plans


def _settled_at_one(policy):
    scaler = ElasticScaler(TableOracle(per_replica_tps=2_000.0), policy)  # the rate alone asks for one
    scaler.observe(window("m", 1.0, 0.0))
    for now_ms in (0.0, 500.0):
        assert _count(scaler.tick(now_ms, ["m"], 100).plan, "m") == 1
    return scaler


def test_a_queue_per_instance_scales_out_at_once_instead_of_waiting_for_two_plans():
    knobs = dict(backlog_drain_s=1.0, min_num_disaggregated=100)
    debounced = _flapping_burst(_settled_at_one(bare_elastic(**knobs, scale_out_queue_per_instance=0.0)),
                                [6, 0, 6, 0])
    assert [t.num_prefill for t in debounced] == [1, 1, 1, 1], "the debounce alone holds one instance"
    assert debounced[0].desired_replicas > 1
    rushed = _flapping_burst(_settled_at_one(bare_elastic(**knobs)), [6, 0, 6, 0])
    assert rushed[0].num_prefill == rushed[0].desired_replicas > 1, "6 queued on one instance: out at once"
    assert "at once, not debounced: 6 queued" in rushed[0].reason


def test_a_short_queue_for_the_count_stays_debounced():
    scaler = _settled_at_one(bare_elastic(backlog_drain_s=1.0, min_num_disaggregated=100,
                                          scale_out_queue_per_instance=8.0))
    first = _flapping_burst(scaler, [6])[0]
    assert first.desired_replicas > 1 and first.num_prefill == 1, "6 queued < 8 per instance: debounced"


def test_a_rushed_scale_out_stays_within_the_budget():
    scaler = _settled_at_one(bare_elastic(backlog_drain_s=1.0, min_num_disaggregated=100))
    scaler.observe(window("m", 1.0, 1_000.0).model_copy(update={"queue_depth": 40}))
    plan = scaler.tick(1_000.0, ["m"], 3).plan
    assert plan.num_devices_used <= 3 and _count(plan, "m") <= 3


def test_a_queue_rushes_prefill_back_even_where_the_decode_count_falls():
    # Cut to 1 prefill instance beside 138 decode ones by a budget shrink, then asked back to 163 / 114 with a queue:
    # the plan goes through at once (budget allowing); the debounce alone would hold 1 / 138 while the plans differ.
    scaler = ElasticScaler(TableOracle(), bare_elastic())
    loads = {"m": window("m", 1.0, 0.0).model_copy(update={"queue_depth": 1_300})}
    applied, raw = {"m": (1, 138)}, {"m": (163, 114)}
    out, rushed = scaler._rush_queued(applied, raw, loads, {"m": 2}, budget_devices=600)
    assert (out, rushed) == ({"m": (163, 114)}, {"m"})
    assert scaler._rush_queued(applied, raw, loads, {"m": 2}, budget_devices=500) == (applied, set()), "budget"
    fewer_prefill = {"m": (2, 60)}  # more instances, but fewer for the queue: debounced as before
    assert scaler._rush_queued({"m": (3, 50)}, fewer_prefill, loads, {"m": 2}, budget_devices=600) == (
        {"m": (3, 50)}, set())
    decode_added = {"m": (1, 139)}  # none fewer: rushed, as it always was (colocated -> P/D keeps its prefill)
    assert scaler._rush_queued(applied, decode_added, loads, {"m": 2}, budget_devices=600)[1] == {"m"}
    idle = {"m": window("m", 1.0, 0.0).model_copy(update={"queue_depth": 0})}
    assert scaler._rush_queued(applied, raw, idle, {"m": 2}, budget_devices=600) == (applied, set())


# ------------------------------------------------------------------------- a budget shrink, prefill first
def test_shrink_prefill_first_keeps_the_decode_instances():
    from planner.core.elastic import shrink_prefill_first

    assert shrink_prefill_first((7, 3), (6, 2)) == (5, 3)  # two fewer: both from prefill
    assert shrink_prefill_first((7, 3), (3, 1)) == (1, 3)  # at least one prefill instance stays
    assert shrink_prefill_first((2, 2), (2, 1)) == (1, 2)
    assert shrink_prefill_first((5, 3), (6, 2)) == (6, 2)  # the same count: the skew does not carry over
    assert shrink_prefill_first((5, 5), (6, 3)) == (5, 4)  # one fewer: one decode instance kept, not all
    assert shrink_prefill_first((5, 3), (7, 3)) == (7, 3)  # a model that grows takes the proportional split
    assert shrink_prefill_first((3, 0), (1, 1)) == (1, 1)  # colocated before, or after: nothing to keep
    assert shrink_prefill_first((7, 3), (2, 0)) == (2, 0)


def test_a_long_budget_bind_does_not_starve_prefill():
    """A peak the budget binds through: the model loses one instance a plan, the proportional split 70/30. Each
    plan's skew is its own shrink's, so prefill never falls more than that shrink below proportion (kept for as long
    as the budget bound, the skew added up to one prefill instance beside three decode ones)."""
    from planner.core.elastic import shrink_prefill_first

    applied = (7, 3)
    for total in range(9, 3, -1):
        proportional = (total - round(0.3 * total), round(0.3 * total))
        applied = shrink_prefill_first(applied, proportional)
        assert sum(applied) == total and applied[0] >= proportional[0] - 1 >= 1
    assert applied == (2, 2)  # at 4 instances, proportion (3, 1), one decode instance kept for the last shrink


def test_a_model_the_budget_shrinks_gives_up_prefill_instances_first():
    """A hot disaggregated model at 10 instances on a budget of 10; another model's load arrives, the budget splits
    between them. Its decode instances stay (a decode instance drains its longest sequence before its device frees,
    a prefill instance frees it at once), so the newcomer's instances find devices at once."""
    def run(prefill_first: bool) -> list[tuple[int, int]]:
        scaler = ElasticScaler(TableOracle(per_replica_tps=1000.0),
                               bare_elastic(is_debounced=False, is_budget_shrink_prefill_first=prefill_first))
        scaler.observe(window("hot", 15.0, 0.0))  # 9,600 tokens/s of 512 -> 128: ten instances
        before = _target(scaler.tick(0.0, ["hot", "tail"], 10).plan, "hot")
        scaler.observe(window("tail", 6.0, 500.0))
        after = scaler.tick(500.0, ["hot", "tail"], 10).plan
        again = scaler.tick(1_000.0, ["hot", "tail"], 10).plan
        return [(before.num_prefill, before.num_decode), *((_target(p, "hot").num_prefill, _target(p, "hot").num_decode)
                                                           for p in (after, again))]

    proportional, prefill_first = run(False), run(True)
    start = proportional[0]
    assert start == prefill_first[0] and start[1] >= 2 and sum(start) == 10
    shrunk = proportional[1]
    assert sum(shrunk) < 10 and shrunk[1] < start[1], "the proportional split drains a decode instance"
    assert sum(prefill_first[1]) == sum(shrunk) and prefill_first[1][1] == start[1], "prefill first: decode kept"
    assert prefill_first[2] == proportional[2], "the next plan at the same count: the proportional split again"
    assert ElasticPolicy().is_budget_shrink_prefill_first


def _bursts(scaler, model: str, starts_ms, burst_ms: float = 10_000.0, step_ms: float = 5_000.0):
    """A burst of arrivals from each start, `burst_ms` long, in windows `step_ms` apart."""
    for start in starts_ms:
        t = start
        while t <= start + burst_ms:
            scaler.observe(window(model, 2.0, t))
            t += step_ms


def test_a_model_that_comes_back_every_few_minutes_keeps_its_instance_through_its_gaps():
    scaler = ElasticScaler(TableOracle(), bare_elastic(keepalive_s=60.0, keepalive_max_s=300.0, is_debounced=False))
    _bursts(scaler, "m", [0.0])
    assert scaler.keepalive_ms("m") == 60_000.0, "no gap seen yet: the plain keep-alive"
    _bursts(scaler, "m", [200_000.0])  # back 190 s after its last window with an arrival
    assert scaler.keepalive_ms("m") == 250_000.0, "its gap plus the plain keep-alive"
    scaler.observe(_idle_window("m", 400_000.0))
    plan = scaler.tick(400_000.0, ["m"], 10).plan  # 190 s after the second burst: parked before, kept now
    assert _count(plan, "m") == 1 and "keep-alive 250 s" in _target(plan, "m").reason
    scaler.observe(_idle_window("m", 461_000.0))
    assert _count(scaler.tick(461_000.0, ["m"], 10).plan, "m") == 0, "past its own keep-alive: parked"


def test_the_gap_keep_alive_is_off_by_default():
    assert ElasticPolicy().keepalive_max_s == 0.0
    scaler = ElasticScaler(TableOracle(), bare_elastic(keepalive_s=60.0))
    _bursts(scaler, "m", [0.0, 200_000.0])
    assert scaler.keepalive_ms("m") == 60_000.0


def test_a_gap_longer_than_keepalive_max_keeps_the_plain_keep_alive():
    scaler = ElasticScaler(TableOracle(), bare_elastic(keepalive_s=60.0, keepalive_max_s=300.0))
    _bursts(scaler, "m", [0.0, 200_000.0, 900_000.0])  # gaps of 190 s and 690 s
    assert scaler.keepalive_ms("m") == 60_000.0
    _bursts(scaler, "m", [1_100_000.0, 1_300_000.0, 1_500_000.0])  # three short gaps push the long one out
    assert scaler.keepalive_ms("m") == 250_000.0
    off = ElasticScaler(TableOracle(), bare_elastic(keepalive_s=60.0, keepalive_max_s=0.0))
    _bursts(off, "m", [0.0, 200_000.0])
    assert off.keepalive_ms("m") == 60_000.0, "keepalive_max_s at or under keepalive_s: off"


def test_a_gap_keep_alive_is_given_back_when_the_budget_binds():
    """`idle` comes back every ~3 minutes and is 100 s into a gap (its plain keep-alive of 60 s is over); `hot`
    wants every device. The bet on idle's return gives way to the load that is there."""
    oracle = TableOracle(attainment=lambda model, feats, m: 1.0 if m >= 4 else 0.5)
    scaler = ElasticScaler(oracle, bare_elastic(keepalive_s=60.0, keepalive_max_s=300.0, is_debounced=False))
    _bursts(scaler, "idle", [0.0, 200_000.0])
    scaler.observe(_idle_window("idle", 310_000.0))
    scaler.observe(window("hot", 5.0, 310_000.0))
    roomy = scaler.tick(310_000.0, ["hot", "idle"], 5).plan
    assert _count(roomy, "hot") == 4 and _count(roomy, "idle") == 1, "room for both: idle keeps its instance"
    tight = scaler.tick(310_500.0, ["hot", "idle"], 4).plan
    assert _count(tight, "hot") == 4 and _count(tight, "idle") == 0
    assert "given back" in _target(tight, "idle").reason


# ----------------------------------------------------------------------------------------------- over budget
def _creeping_big(model: str, feats, m: int) -> float:
    """"big" never reaches 0.99 (its bound creeps towards 0.98 with m: the saturation rule sizes it at ~39 of the
    cap's 64); "small" meets it at a handful of instances."""
    if model == "big":
        return 0.985 - 0.5 / m
    return 1.0 - math.exp(-3.0 * m / (feats.token_rate_tps / 1000.0))


def _two_model_scaler(attainment, reachable_first: bool, rates_rps: dict[str, float]) -> ElasticScaler:
    scaler = ElasticScaler(TableOracle(attainment=attainment),
                           bare_elastic(is_debounced=False, min_num_disaggregated=100,
                                        is_budget_reachable_first=reachable_first))
    for model, rate_rps in rates_rps.items():
        scaler.observe(window(model, rate_rps, 0.0))
    return scaler


@pytest.mark.parametrize("reachable_first", [True, False])
def test_over_budget_a_reachable_model_gets_its_count_before_an_unreachable_one(reachable_first):
    scaler = _two_model_scaler(_creeping_big, reachable_first, {"big": 20.0, "small": 2.0})
    free = scaler.tick(0.0, ["big", "small"], 1000)
    assert not free.searches["big"].is_reachable and free.searches["small"].is_reachable
    want_big, want_small = _count(free.plan, "big"), _count(free.plan, "small")
    assert want_big > 30 and 2 <= want_small < 10
    plan = scaler.tick(500.0, ["big", "small"], 30).plan
    assert plan.is_scaled_down and plan.num_devices_used == 30
    if reachable_first:
        assert _count(plan, "small") == want_small, "the reachable count is served whole"
        assert _count(plan, "big") == 30 - want_small
        assert "big served after the others' measured rates" in plan.reason
    else:
        assert _count(plan, "small") < want_small, "in proportion, the small model is cut with the big one"


def test_reachable_first_is_off_by_default():
    assert not ElasticPolicy().is_budget_reachable_first


def test_over_budget_a_model_overloaded_at_every_count_keeps_its_measured_rate_count():
    """Overloaded at every count (the bound 0 up to the cap: a burst past what the cap serves) is not the creeping
    bound: its count is the cap and it shares the budget in proportion, not after the others."""
    def attainment(model, feats, m):
        return 0.0 if model == "burst" else _creeping_big(model, feats, m)

    scaler = _two_model_scaler(attainment, True, {"burst": 50.0, "small": 20.0})
    decision = scaler.tick(0.0, ["burst", "small"], 30)
    burst, small = decision.searches["burst"], decision.searches["small"]
    assert burst.is_overloaded and not burst.is_reachable and burst.num_replicas == 64
    assert not small.is_overloaded and small.num_replicas == 23
    plan = decision.plan
    assert _count(plan, "burst") + _count(plan, "small") == 30
    # in proportion, 64 : 23 of 30 (22); served after the small model's 23 it would have had 7
    assert _count(plan, "burst") >= 20, "in proportion to its count, not one instance and the leftovers"
    assert "served after" not in plan.reason

"""The steady planner end to end on small catalogues: plans, arrivals, departures, consolidation, exact mode."""
from __future__ import annotations

import pytest
from planner_test_oracles import TableOracle, window

from planner.core.greedy import pack_phi
from planner.core.packing import phi
from planner.core.oracle_port import OracleAnswerError
from planner.core.policy import PoolPolicy, SteadyPolicy
from planner.core.steady import SteadyPlanner

WORKERS = [f"w{i}" for i in range(8)]
# Bounds are mean + 0.01 (the test oracle's std, k = 1).
NEEDS = {
    "c1": (0.29, 0.59, 0.19),
    "b1": (0.29, 0.19, 0.59),
    "c2": (0.29, 0.59, 0.19),
    "b2": (0.29, 0.19, 0.59),
    "big": (0.8, 0.3, 0.3),
}
# Tests here are about packing: "large" starts above the models these tests pack.
POOL = PoolPolicy(large_need_enter=0.75, large_need_exit=0.6)


def _planner(needs=NEEDS, **policy) -> tuple[SteadyPlanner, TableOracle]:
    oracle = TableOracle(needs=needs, version="cap-v3")
    return SteadyPlanner(oracle, SteadyPolicy(**policy), POOL, id_prefix="s"), oracle


def test_startup_plan_packs_steady_models_and_isolates_large_ones():
    planner, oracle = _planner()
    d = planner.plan(0.0, list(NEEDS), WORKERS)
    plan = d.plan
    assert plan.trigger == "startup" and plan.plan_id == "s-000001"
    assert plan.elastic_models == ("big",), "peak need 0.81 >= 0.75: isolated to the elastic pool"
    assert set(plan.steady_models) == {"c1", "c2", "b1", "b2"}
    assert len(plan.bins) == 2 and [b.worker_id for b in plan.bins] == ["w0", "w1"]
    for b in plan.bins:  # complementary shapes share a device
        assert {m[0] for m in b.models} == {"c", "b"}
        assert b.used.compute == pytest.approx(0.8) and b.used.bandwidth == pytest.approx(0.8)
    assert {p.model for p in plan.predictions} == set(NEEDS)
    assert all(p.model_version == "cap-v3" for p in plan.predictions)
    assert oracle.num_capacity_calls == 1
    assert "big elastic: large" in plan.reason


def test_arrival_lands_where_phi_grows_least():
    planner, _ = _planner(needs={**NEEDS, "h": (0.39, 0.04, 0.04)})
    planner.plan(0.0, ["c1", "b1", "c2", "b2"], WORKERS)
    assert planner.packing.num_bins == 2
    plan = planner.plan(1000.0, ["c1", "b1", "c2", "b2", "h"], WORKERS, trigger="arrival").plan
    assert plan.trigger == "arrival"
    (move,) = plan.moves
    assert move.model == "h" and move.from_worker_id is None
    # Both devices have room (each is at 0.6 HBM); Phi decides.
    after = planner.packing
    growth = {}
    for b in after:
        rest = {m: v for m, v in b.needs.items() if m != "h"}
        used = tuple(sum(v[d] for v in rest.values()) for d in range(3))
        growth[b.bin_id] = phi(tuple(1 - u - h for u, h in zip(used, (0.4, 0.05, 0.05)))) - phi(
            tuple(1 - u for u in used))
    assert move.to_worker_id == min(growth, key=growth.get)


def test_departure_to_the_elastic_pool_with_local_repack():
    needs = {"x": (0.49, 0.09, 0.09), "y": (0.09, 0.49, 0.49), "z": (0.44, 0.44, 0.44)}
    planner, oracle = _planner(needs=needs, repack_damage_threshold=0.05)
    planner.plan(0.0, list(needs), ["w0", "w1"])
    start = planner.packing.assignment()
    assert sorted(map(sorted, start.values())) == [["x", "y"], ["z"]]
    # y's traffic grows large: it goes elastic; x's device is left unbalanced past the threshold and emptied.
    oracle.needs["y"] = (0.09, 0.79, 0.79)
    plan = planner.plan(1000.0, list(needs), ["w0", "w1"]).plan
    assert plan.elastic_models == ("y",)
    moves = {m.model: m for m in plan.moves}
    assert moves["y"].to_worker_id is None and "to elastic pool" in moves["y"].reason
    assert moves["x"].to_worker_id == planner.packing.bin_of("z")
    assert "repacked" in plan.reason and len(plan.bins) == 1


def test_departure_below_threshold_does_not_move_anything_else():
    needs = {"x": (0.49, 0.09, 0.09), "y": (0.09, 0.49, 0.49), "z": (0.44, 0.44, 0.44)}
    planner, oracle = _planner(needs=needs, repack_damage_threshold=0.5)
    planner.plan(0.0, list(needs), ["w0", "w1"])
    plan = planner.plan(1000.0, ["x", "z"], ["w0", "w1"], trigger="departure").plan
    assert [m.model for m in plan.moves] == ["y"] and plan.moves[0].reason == "left the catalogue"
    assert "within threshold" in plan.reason and len(plan.bins) == 2


def test_not_enough_devices_is_reported_not_dropped():
    needs = {f"m{i}": (0.39, 0.39, 0.39) for i in range(5)}
    planner, _ = _planner(needs=needs)
    d = planner.plan(0.0, list(needs), ["w0", "w1"])
    assert len(d.plan.bins) == 2 and len(d.unplaced_models) == 1
    assert "unplaced" in d.plan.reason and d.unplaced_models[0] not in d.plan.steady_models


def test_lost_device_models_are_placed_again():
    needs = {f"m{i}": (0.59, 0.09, 0.09) for i in range(3)}
    planner, _ = _planner(needs=needs)
    planner.plan(0.0, list(needs), ["w0", "w1", "w2", "w3"])
    lost = planner.packing.bin_of("m1")
    alive = [w for w in ["w0", "w1", "w2", "w3"] if w != lost]
    plan = planner.plan(1000.0, list(needs), alive).plan
    (move,) = plan.moves
    assert move.model == "m1" and move.from_worker_id == lost and move.to_worker_id in alive
    assert lost not in {b.worker_id for b in plan.bins}


def test_consolidation_within_the_migration_budget():
    # Three half-empty devices after shrinking loads: consolidation packs them onto fewer, at most 1 move.
    needs = {f"m{i}": (0.55, 0.55, 0.55) for i in range(3)}
    planner, oracle = _planner(needs=needs, max_num_migrations=1, consolidation_period_s=30.0)
    planner.plan(0.0, list(needs), WORKERS)
    assert planner.packing.num_bins == 3
    for m in needs:
        oracle.needs[m] = (0.2, 0.2, 0.2)
    early = planner.plan(10_000.0, list(needs), WORKERS).plan
    assert early.moves == () and len(early.bins) == 3, "not due yet"
    plan = planner.plan(31_000.0, list(needs), WORKERS).plan
    assert len(plan.moves) == 1 and len(plan.bins) == 2
    assert plan.moves[0].reason.startswith("consolidation")
    plan = planner.plan(62_000.0, list(needs), WORKERS).plan
    assert len(plan.moves) == 1 and len(plan.bins) == 1


def test_exact_mode_never_uses_more_devices_than_the_heuristic():
    needs = {"a": (0.49, 0.0, 0.0), "b": (0.39, 0.0, 0.0), "c": (0.29, 0.0, 0.0), "d": (0.29, 0.0, 0.0),
             "e": (0.24, 0.0, 0.0), "f": (0.24, 0.0, 0.0)}
    exact, _ = _planner(needs=needs, is_exact=True)
    heuristic, _ = _planner(needs=needs)
    ne = len(exact.plan(0.0, list(needs), WORKERS).plan.bins)
    nh = len(heuristic.plan(0.0, list(needs), WORKERS).plan.bins)
    assert ne <= nh
    assert ne == pack_phi({m: tuple(x + 0.01 for x in v) for m, v in needs.items()}).num_bins or ne < nh


def test_plan_records_loads_and_observe_only():
    oracle = TableOracle(needs=NEEDS)
    planner = SteadyPlanner(oracle, is_observe_only=True)
    planner.observe(window("c1", 3.0, 500.0))
    plan = planner.plan(1000.0, ["c1"], WORKERS).plan
    assert plan.is_observe_only and [w.model for w in plan.loads] == ["c1"]


def test_an_oracle_that_skips_a_model_is_an_error():
    class Forgetful(TableOracle):
        def capacity(self, query):
            reply = super().capacity(query)
            return reply.model_copy(update={"predictions": reply.predictions[:-1]})

    with pytest.raises(OracleAnswerError, match="lacks"):
        SteadyPlanner(Forgetful()).plan(0.0, ["a", "b"], WORKERS)

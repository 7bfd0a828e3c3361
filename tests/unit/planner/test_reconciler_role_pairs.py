"""A disaggregated model serves a request only with a prefill and a decode instance. With
`ReconcilerPolicy.pairs_disaggregated_roles` (off by default) the placer never leaves it with one role alone:
with room for one instance and neither role running, a colocated stand-in serves (a burst on a full fleet once
got a lone decode instance and waited 4.7 s for its first token, docs/bench/sim.md run 44); with room for more,
one instance of each role comes before more of either; a colocated instance stays until both roles are ready."""
from __future__ import annotations

from planner_test_workers import ScriptedWorkers
from test_planner_reconciler import POLICY, converge, elastic
from test_reconciler_no_room import settle, where

from contracts import InstanceRole, Pool
from planner.core.policy import ReconcilerPolicy
from planner.core.reconciler import Reconciler

C, P, D = InstanceRole.COLOCATED, InstanceRole.PREFILL, InstanceRole.DECODE


def boot(worker_ids: list[str], pairs_roles: bool = True):
    """test_planner_reconciler's boot, with `pairs_disaggregated_roles` (off by default) as asked."""
    rec = Reconciler(POLICY.model_copy(update={"pairs_disaggregated_roles": pairs_roles}))
    workers = ScriptedWorkers(worker_ids)
    for w in worker_ids:
        rec.observe_heartbeat(0.0, workers.heartbeat(w, 0.0))
    return rec, workers


def test_off_by_default():
    assert ReconcilerPolicy().pairs_disaggregated_roles is False


def _fleet_with(num_free: int, pairs_roles: bool = True):
    """`busy` (colocated, elastic) fills every device but `num_free`."""
    ids = [f"w{i}" for i in range(4 + num_free)]
    rec, workers = boot(ids, pairs_roles)
    converge(rec, workers, rec.on_elastic_plan(0.0, elastic("e1", {"busy": (4, 0)})).commands, 0.0)
    now, _ = settle(rec, workers, 10.0)
    return rec, workers, now


def test_one_free_device_gets_a_colocated_stand_in_not_a_lone_decode_instance():
    rec, workers, now = _fleet_with(1)
    converge(rec, workers, rec.on_elastic_plan(now, elastic("e2", {"busy": (4, 0), "cold": (1, 3)})).commands, now)
    settle(rec, workers, now)
    assert where(workers, "cold", C, Pool.ELASTIC) == ["w4"]
    assert where(workers, "cold", D, Pool.ELASTIC) == [] and where(workers, "cold", P, Pool.ELASTIC) == []


def test_without_the_rule_one_free_device_gets_a_lone_decode_instance():
    """What the rule is for (main's placement): the decode key sorts first and takes the one device."""
    rec, workers, now = _fleet_with(1, pairs_roles=False)
    converge(rec, workers, rec.on_elastic_plan(now, elastic("e2", {"busy": (4, 0), "cold": (1, 3)})).commands, now)
    settle(rec, workers, now)
    assert where(workers, "cold", D, Pool.ELASTIC) == ["w4"] and where(workers, "cold", C, Pool.ELASTIC) == []


def test_two_free_devices_get_one_instance_of_each_role():
    rec, workers, now = _fleet_with(2)
    converge(rec, workers, rec.on_elastic_plan(now, elastic("e2", {"busy": (4, 0), "cold": (1, 3)})).commands, now)
    settle(rec, workers, now)
    assert len(where(workers, "cold", P, Pool.ELASTIC)) == 1 and len(where(workers, "cold", D, Pool.ELASTIC)) == 1


def test_the_stand_in_stays_until_both_roles_are_ready_then_goes():
    rec, workers, now = _fleet_with(1)
    converge(rec, workers, rec.on_elastic_plan(now, elastic("e2", {"busy": (4, 0), "cold": (1, 3)})).commands, now)
    now, _ = settle(rec, workers, now)
    assert where(workers, "cold", C, Pool.ELASTIC) == ["w4"]
    # `busy` shrinks: three devices free up, enough for the split beside the stand-in
    converge(rec, workers, rec.on_elastic_plan(now, elastic("e3", {"busy": (1, 0), "cold": (1, 3)})).commands, now)
    now, _ = settle(rec, workers, now)
    assert len(where(workers, "cold", P, Pool.ELASTIC)) >= 1 and len(where(workers, "cold", D, Pool.ELASTIC)) >= 1
    assert where(workers, "cold", C, Pool.ELASTIC) == [], "the stand-in left once both roles were ready"


def test_a_colocated_first_instance_serves_until_the_split_is_ready():
    """The scaler's first plan for a model is one colocated instance; the next splits it. The colocated one stays
    up until a prefill and a decode instance are ready, then goes (make before break, with the stand-in rule)."""
    rec, workers = boot([f"w{i}" for i in range(4)])
    converge(rec, workers, rec.on_elastic_plan(0.0, elastic("e1", {"m": (1, 0)})).commands, 0.0)
    now, _ = settle(rec, workers, 10.0)
    (first,) = where(workers, "m", C, Pool.ELASTIC)
    effects = rec.on_elastic_plan(now, elastic("e2", {"m": (1, 2)}))
    drained = [c for c in effects.commands if c.instance_id.endswith("/colocated")]
    assert drained == [], "the colocated instance is not drained before its replacements are ready"
    converge(rec, workers, effects.commands, now)
    now, _ = settle(rec, workers, now)
    assert where(workers, "m", C, Pool.ELASTIC) == []
    assert len(where(workers, "m", P, Pool.ELASTIC)) == 1 and len(where(workers, "m", D, Pool.ELASTIC)) == 2

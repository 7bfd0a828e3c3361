"""The reconciler's placement rules, shared by the live system and the simulator: tensor-parallel groups, devices
that are still draining, resuming a drain, the most starved model first, and make before break across roles."""
from __future__ import annotations

from test_planner_reconciler import POLICY, boot, converge, elastic, heartbeats, run_commands

from contracts import (
    ElasticPlan,
    ElasticTarget,
    InstanceRole,
    LifecycleAction,
    LifecycleReply,
    LoadFeatures,
    ModelLoadWindow,
    ModelState,
    Pool,
)
from planner.core.policy import ReconcilerPolicy
from planner.core.reconciler import Reconciler

C, P, D = InstanceRole.COLOCATED, InstanceRole.PREFILL, InstanceRole.DECODE


def plan_with(plan_id: str, targets: dict[str, tuple[int, int]], tp: dict[str, int] | None = None,
              rates: dict[str, float] | None = None) -> ElasticPlan:
    loads = tuple(
        ModelLoadWindow(model=m, window_s=5.0, end_unix_ms=0.0, num_requests=1, request_rate_rps=1.0,
                        features=LoadFeatures(token_rate_tps=r, input_len_mean=100.0, input_len_var=0.0,
                                              output_len_mean=10.0))
        for m, r in (rates or {}).items())
    return ElasticPlan(
        plan_id=plan_id, created_unix_ms=0.0, budget_devices=64, num_devices_used=0,
        targets=tuple(ElasticTarget(model=m, num_prefill=p, num_decode=d, desired_replicas=p + d,
                                    num_devices_per_instance=(tp or {}).get(m, 1))
                      for m, (p, d) in targets.items()),
        loads=loads,
    )


def test_a_tensor_parallel_instance_is_one_command_on_a_group_of_free_devices():
    rec, workers = boot(["w0", "w1", "w2", "w3", "w4"])
    eff = rec.on_elastic_plan(0.0, plan_with("e1", {"big": (2, 0), "small": (1, 0)}, tp={"big": 2}))
    assert sorted(c.model for c in eff.commands) == ["big", "small"], "one load per model: big's second forks"
    later = [c for e in converge(rec, workers, eff.commands, 0.0) for c in e.commands]
    assert [c.model for c in later] == ["big"]
    by_model = {}
    for c in [*eff.commands, *later]:
        by_model.setdefault(c.model, []).append(c)
    assert len(by_model["big"]) == 2 and len(by_model["small"]) == 1
    groups = [(c.worker_id, *c.peer_worker_ids) for c in by_model["big"]]
    assert all(len(g) == 2 for g in groups)
    used = [w for g in groups for w in g] + [by_model["small"][0].worker_id]
    assert len(set(used)) == 5, "no device is given twice"


def test_a_group_reported_by_its_lead_occupies_every_device_of_it():
    rec, workers = boot(["w0", "w1", "w2"])
    st = workers.put("big", "w0", C, Pool.ELASTIC, ModelState.ACTIVE)
    workers.instances["w0"][st] = workers.instances["w0"][st].model_copy(update={"peer_worker_ids": ("w1",)})
    heartbeats(rec, workers, 0.0)
    rec.on_record(0.0, workers.record(st, 0.0))
    eff = rec.on_elastic_plan(0.0, plan_with("e1", {"big": (1, 0), "other": (1, 0)}, tp={"big": 2}))
    assert [(c.model, c.worker_id) for c in eff.commands] == [("other", "w2")], "big stays on w0+w1"


def test_a_device_still_draining_takes_no_new_model_until_the_drain_is_over():
    rec, workers = boot(["w0"])
    old = workers.put("old", "w0", C, Pool.ELASTIC, ModelState.DRAINING, load=3)
    heartbeats(rec, workers, 0.0)
    eff = rec.on_elastic_plan(0.0, plan_with("e1", {"new": (1, 0)}))
    assert not eff.commands
    assert any(s.status == "blocked" for s in eff.plan_statuses)
    workers.instances["w0"][old] = workers.instances["w0"][old].model_copy(update={"state": ModelState.WARM})
    heartbeats(rec, workers, 100.0)
    eff = rec.on_tick(100.0)
    assert [(c.model, c.worker_id, c.action) for c in eff.commands] == [("new", "w0", LifecycleAction.ACTIVATE)]


def test_a_count_that_rises_again_resumes_the_draining_instance_in_place():
    rec, workers = boot(["w0", "w1", "w2"])
    converge(rec, workers, rec.on_elastic_plan(0.0, elastic("e1", {"m": (2, 0)})).commands, 0.0)
    heartbeats(rec, workers, 10.0)
    eff = rec.on_elastic_plan(10.0, elastic("e2", {"m": (1, 0)}))
    (removal,) = eff.commands
    assert removal.action == LifecycleAction.WARM
    # the worker drains it (a long stream still runs): its heartbeat says DRAINING, no reply yet
    gone = removal.instance_id
    workers.instances[removal.worker_id][gone] = workers.instances[removal.worker_id][gone].model_copy(
        update={"state": ModelState.DRAINING, "num_running": 1})
    heartbeats(rec, workers, 20.0)
    assert rec.on_tick(20.0).is_empty
    eff = rec.on_elastic_plan(30.0, elastic("e3", {"m": (2, 0)}))
    assert [(c.instance_id, c.action) for c in eff.commands] == [(gone, LifecycleAction.ACTIVATE)]
    assert (gone, "cancelled") in [(a.instance_id, a.status) for a in eff.actions]
    # the drain's late answer is for a command since replaced: nothing happens
    late = LifecycleReply(command_id=removal.command_id, instance_id=gone, ok=True, state=ModelState.WARM)
    assert not rec.on_reply(31.0, late).commands


def test_without_resume_the_drain_ends_before_the_instance_comes_back():
    rec = Reconciler(POLICY.model_copy(update={"resumes_draining": False}))
    _, workers = boot(["w0", "w1", "w2"])
    for w in workers.instances:
        rec.observe_heartbeat(0.0, workers.heartbeat(w, 0.0))
    converge(rec, workers, rec.on_elastic_plan(0.0, elastic("e1", {"m": (2, 0)})).commands, 0.0)
    heartbeats(rec, workers, 10.0)
    (removal,) = rec.on_elastic_plan(10.0, elastic("e2", {"m": (1, 0)})).commands
    gone = removal.instance_id
    workers.instances[removal.worker_id][gone] = workers.instances[removal.worker_id][gone].model_copy(
        update={"state": ModelState.DRAINING})
    heartbeats(rec, workers, 20.0)
    eff = rec.on_elastic_plan(30.0, elastic("e3", {"m": (2, 0)}))
    assert all(c.instance_id != gone for c in eff.commands), "no resume"
    assert all(c.worker_id != removal.worker_id for c in eff.commands), "and its device is not free"


def test_devices_go_to_the_most_starved_model_first():
    rec, workers = boot(["w0", "w1", "w2"])
    rates = {"busy": 1000.0, "sparse": 1.0}
    converge(rec, workers, rec.on_elastic_plan(0.0, plan_with("e1", {"busy": (2, 0)}, rates=rates)).commands, 0.0)
    heartbeats(rec, workers, 10.0)
    # one device left: busy wants two more, sparse its first; sparse gets it (or each of its requests is turned
    # away while busy merely runs a little hotter)
    eff = rec.on_elastic_plan(10.0, plan_with("e2", {"busy": (4, 0), "sparse": (1, 0)}, rates=rates))
    assert [c.model for c in eff.commands] == ["sparse"]
    assert any("2 instance(s) of busy: no free device" in s.detail for s in eff.plan_statuses)


def test_the_model_furthest_below_its_count_goes_before_a_busier_one():
    rec, workers = boot([f"w{i}" for i in range(5)])
    rates = {"busy": 1000.0, "sparse": 10.0}
    plan = plan_with("e1", {"busy": (2, 0), "sparse": (1, 0)}, rates=rates)
    converge(rec, workers, rec.on_elastic_plan(0.0, plan).commands, 0.0)
    heartbeats(rec, workers, 10.0)
    # two free devices; busy has 2 of 5 (0.4), sparse 1 of 3 (0.33): sparse is the further behind
    eff = rec.on_elastic_plan(10.0, plan_with("e2", {"busy": (5, 0), "sparse": (3, 0)}, rates=rates))
    assert sorted(c.model for c in eff.commands) == ["sparse", "sparse"]


def test_a_move_from_colocated_to_prefill_decode_keeps_serving_until_both_roles_are_ready():
    rec, workers = boot(["w0", "w1", "w2", "w3"])
    converge(rec, workers, rec.on_elastic_plan(0.0, elastic("e1", {"m": (1, 0)})).commands, 0.0)
    heartbeats(rec, workers, 1.0)
    eff = rec.on_elastic_plan(1.0, elastic("e2", {"m": (1, 1), }))
    ups = [c for c in eff.commands if c.action in (LifecycleAction.ACTIVATE, LifecycleAction.FORK_FROM)]
    assert {c.role for c in ups} == {P, D} and not [c for c in eff.commands if c not in ups]
    prefill = next(c for c in ups if c.role == P)
    decode = next(c for c in ups if c.role == D)
    # the prefill instance is ready first: the colocated one must stay (nothing would decode)
    effects = run_commands(rec, workers, [prefill], 2.0)
    heartbeats(rec, workers, 2.0)
    tick = rec.on_tick(2.0)
    assert not [c for e in [*effects, tick] for c in e.commands if c.action == LifecycleAction.WARM]
    effects = run_commands(rec, workers, [decode], 3.0)
    heartbeats(rec, workers, 3.0)
    tick = rec.on_tick(3.0)
    removed = [c for e in [*effects, tick] for c in e.commands if c.action == LifecycleAction.WARM]
    assert [c.role for c in removed] == [C], "both roles ready: the colocated instance goes"


def test_an_observed_reply_is_reported_with_the_next_tick():
    rec, workers = boot(["w0"])
    (cmd,) = rec.on_elastic_plan(0.0, elastic("e1", {"m": (1, 0)})).commands
    rec.observe_reply(1.0, workers.apply(cmd, 1.0, ok=False))
    tick = rec.on_tick(1.0)
    assert (cmd.instance_id, "retrying") in [(a.instance_id, a.status) for a in tick.actions]


def test_the_policy_resumes_by_default():
    assert ReconcilerPolicy().resumes_draining


def _to_elastic(plan_id: str, bins: dict, elastic_models: tuple[str, ...]):
    from test_planner_reconciler import steady

    plan = steady(plan_id, bins)
    return plan.model_copy(update={"elastic_models": elastic_models})


def test_a_model_handed_to_the_elastic_pool_serves_from_its_steady_replica_until_an_elastic_one_is_ready():
    rec, workers = boot(["w0", "w1", "w2"])
    converge(rec, workers, rec.on_steady_plan(0.0, _to_elastic("s1", {"w0": ("m", "x")}, ())).commands, 0.0)
    heartbeats(rec, workers, 1.0)
    # the next steady plan hands m to the elastic pool and packs another model in its place; the elastic plan
    # has not caught up (it predates the hand-over): m keeps its steady replica
    eff = rec.on_steady_plan(1.0, _to_elastic("s2", {"w0": ("x", "y")}, ("m",)))
    assert not [c for c in eff.commands if c.model == "m"], "no removal yet: nothing else serves m"
    # the elastic plan's debounce still holds m at 0, but it wants replicas of it: still kept
    held = plan_with("e1", {"m": (0, 0)}).model_copy(update={"targets": (
        ElasticTarget(model="m", num_prefill=0, num_decode=0, desired_replicas=2),)})
    assert not [c for c in rec.on_elastic_plan(2.0, held).commands if c.model == "m"]
    ups = rec.on_elastic_plan(3.0, plan_with("e2", {"m": (1, 0)})).commands
    assert [(c.model, c.action) for c in ups] == [("m", LifecycleAction.FORK_FROM)], "forks from the steady one"
    effects = run_commands(rec, workers, ups, 4.0)
    heartbeats(rec, workers, 4.0)
    removed = [c for e in [*effects, rec.on_tick(4.0)] for c in e.commands if c.model == "m"]
    assert [(c.worker_id, c.action) for c in removed] == [("w0", LifecycleAction.COLD)], "then it goes"


def test_a_model_handed_over_without_traffic_is_released_at_once():
    rec, workers = boot(["w0", "w1"])
    converge(rec, workers, rec.on_steady_plan(0.0, _to_elastic("s1", {"w0": ("m",)}, ())).commands, 0.0)
    heartbeats(rec, workers, 1.0)
    rec.on_elastic_plan(1.0, plan_with("e1", {"m": (0, 0)}).model_copy(update={"targets": (
        ElasticTarget(model="m", num_prefill=0, num_decode=0, desired_replicas=0, reason="no traffic"),)}))
    eff = rec.on_steady_plan(2.0, _to_elastic("s2", {}, ("m",)))
    assert [(c.model, c.action) for c in eff.commands] == [("m", LifecycleAction.COLD)]

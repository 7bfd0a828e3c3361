"""The reconciler core: plans -> lifecycle commands, completion only when ready, retries and reports, ordering."""
from __future__ import annotations

import pytest
from planner_test_workers import ScriptedWorkers

from contracts import (
    BinAssignment,
    ElasticPlan,
    ElasticTarget,
    ErrorCode,
    ErrorInfo,
    HostCopy,
    InstanceRole,
    LifecycleAction,
    LifecycleReply,
    ModelState,
    NeedVector,
    Pool,
    SteadyPlan,
    WeightSegment,
)
from planner.core.policy import ReconcilerPolicy
from planner.core.reconciler import Reconciler

POLICY = ReconcilerPolicy(command_deadline_ms=5_000, ready_grace_ms=2_000, max_num_attempts=2,
                          retry_backoff_ms=500, heartbeat_timeout_ms=2_000, failure_cooldown_ms=10_000)
USED = NeedVector(hbm=0.5, compute=0.5, bandwidth=0.5)


def steady(plan_id: str, bins: dict[str, tuple[str, ...]], observe_only: bool = False) -> SteadyPlan:
    return SteadyPlan(
        plan_id=plan_id, created_unix_ms=0.0, trigger="periodic",
        steady_models=tuple(m for ms in bins.values() for m in ms), elastic_models=(),
        bins=tuple(BinAssignment(worker_id=w, models=ms, used=USED) for w, ms in bins.items()),
        is_observe_only=observe_only,
    )


def elastic(plan_id: str, counts: dict[str, tuple[int, int]], budget: int = 8) -> ElasticPlan:
    return ElasticPlan(
        plan_id=plan_id, created_unix_ms=0.0, budget_devices=budget,
        num_devices_used=sum(p + d for p, d in counts.values()),
        targets=tuple(ElasticTarget(model=m, num_prefill=p, num_decode=d, desired_replicas=p + d)
                      for m, (p, d) in counts.items()),
    )


def boot(worker_ids: list[str], now: float = 0.0) -> tuple[Reconciler, ScriptedWorkers]:
    rec = Reconciler(POLICY)
    workers = ScriptedWorkers(worker_ids)
    for w in worker_ids:
        rec.observe_heartbeat(now, workers.heartbeat(w, now))
    return rec, workers


def heartbeats(rec: Reconciler, workers: ScriptedWorkers, now: float) -> None:
    """Every worker beats; the reconciler records them (the test then ticks to see what it decides)."""
    for w in workers.instances:
        rec.observe_heartbeat(now, workers.heartbeat(w, now))


def run_commands(rec, workers, commands, now, fail: set[str] = frozenset()):
    """Workers execute every command, reply, and (for activations) write the registry record."""
    out = []
    for cmd in commands:
        reply = workers.apply(cmd, now, ok=cmd.instance_id not in fail)
        out.append(rec.on_reply(now, reply))
        if reply.ok and reply.state == ModelState.ACTIVE:
            out.append(rec.on_record(now, workers.record(cmd.instance_id, now)))
    return out


def converge(rec, workers, commands, now):
    """Run the commands, then whatever the reconciler sends in answer, until it sends nothing more."""
    out = []
    while commands:
        effects = run_commands(rec, workers, commands, now)
        out += effects
        commands = [c for e in effects for c in e.commands]
    return out


def statuses(effects) -> list[tuple[str, str]]:
    return [(s.plan_id, s.status) for e in effects for s in e.plan_statuses]


def actions(effects) -> list[tuple[str, str]]:
    return [(a.instance_id, a.status) for e in effects for a in e.actions]


def test_steady_plan_activates_and_is_done_only_when_ready():
    rec, workers = boot(["w0", "w1"])
    eff = rec.on_steady_plan(0.0, steady("s1", {"w0": ("a", "b"), "w1": ("c",)}))
    cmds = {c.instance_id: c for c in eff.commands}
    assert set(cmds) == {"a@w0/colocated", "b@w0/colocated", "c@w1/colocated"}
    assert all(c.action == LifecycleAction.ACTIVATE and c.plan_id == "s1" and c.pool == Pool.STEADY
               for c in cmds.values())
    assert actions([eff]) == [(i, "issued") for i in sorted(cmds)]
    # ok replies alone do not finish the plan: the registry must say ready.
    replies = [rec.on_reply(10.0, workers.apply(c, 10.0)) for c in eff.commands]
    assert statuses(replies) == [] and not rec.is_done("s1")
    recs = [rec.on_record(20.0, workers.record(i, 20.0)) for i in sorted(cmds)]
    assert actions(recs) == [(i, "succeeded") for i in sorted(cmds)]
    assert statuses(recs) == [("s1", "done")] and rec.is_done("s1")
    # Nothing more to do: a later tick issues nothing.
    assert rec.on_tick(100.0).is_empty


def test_fork_from_the_least_loaded_ready_replica():
    rec, workers = boot(["w0", "w1", "w2", "w3"])
    busy = workers.put("m", "w0", InstanceRole.COLOCATED, Pool.STEADY, ModelState.ACTIVE, load=9)
    idle = workers.put("m", "w1", InstanceRole.COLOCATED, Pool.STEADY, ModelState.ACTIVE, load=1)
    heartbeats(rec, workers, 0.0)
    for iid in (busy, idle):
        rec.on_record(0.0, workers.record(iid, 0.0))
    rec.on_steady_plan(0.0, steady("s1", {"w0": ("m",), "w1": ("m",)}))
    eff = rec.on_elastic_plan(0.0, elastic("e1", {"m": (1, 1)}))
    assert {c.worker_id for c in eff.commands} == {"w2", "w3"}
    assert {c.role for c in eff.commands} == {InstanceRole.PREFILL, InstanceRole.DECODE}
    for c in eff.commands:
        assert c.action == LifecycleAction.FORK_FROM and c.pool == Pool.ELASTIC
        assert c.fork_source.instance_id == idle and c.fork_source.transfer_session == "w1:7000"
        assert c.fork_source.segments
    run_commands(rec, workers, eff.commands, 10.0)
    assert rec.is_done("e1")


def test_activate_when_no_source_and_prefer_a_warm_device():
    rec, workers = boot(["w0", "w1", "w2"])
    workers.put("m", "w2", InstanceRole.COLOCATED, Pool.ELASTIC, ModelState.WARM)
    heartbeats(rec, workers, 0.0)
    eff = rec.on_elastic_plan(0.0, elastic("e1", {"m": (1, 0)}))
    (cmd,) = eff.commands
    assert cmd.worker_id == "w2" and cmd.action == LifecycleAction.ACTIVATE and cmd.fork_source is None


def test_a_model_without_a_replica_loads_once_and_forks_the_rest_from_it():
    rec, workers = boot(["w0", "w1", "w2", "w3"])
    workers.put("m", "w3", InstanceRole.COLOCATED, Pool.ELASTIC, ModelState.WARM)
    heartbeats(rec, workers, 0.0)
    eff = rec.on_elastic_plan(0.0, elastic("e1", {"m": (3, 0)}))
    # one load from disk, and the device that holds m warm wakes it; nothing else yet
    assert sorted((c.worker_id, c.action) for c in eff.commands) == [
        ("w0", LifecycleAction.ACTIVATE), ("w3", LifecycleAction.ACTIVATE)]
    assert rec.on_tick(1.0).commands == (), "the third waits for a replica to fork from"
    first = next(c for c in eff.commands if c.worker_id == "w0")
    run_commands(rec, workers, [first], 10.0)
    heartbeats(rec, workers, 11.0)  # the first is ready and its heartbeat offers its segments
    (fork,) = rec.on_tick(12.0).commands
    assert fork.action == LifecycleAction.FORK_FROM and fork.fork_source.instance_id == first.instance_id
    assert fork.fork_source.kind == "replica" and fork.worker_id in ("w1", "w2")
    converge(rec, workers, [fork, *(c for c in eff.commands if c is not first)], 20.0)
    heartbeats(rec, workers, 30.0)
    assert rec.is_done("e1")


def test_every_replica_loads_at_once_when_the_policy_says_so():
    rec = Reconciler(POLICY.model_copy(update={"is_one_load_per_model": False}))
    workers = ScriptedWorkers(["w0", "w1", "w2"])
    heartbeats(rec, workers, 0.0)
    eff = rec.on_elastic_plan(0.0, elastic("e1", {"m": (3, 0)}))
    assert [c.action for c in eff.commands] == [LifecycleAction.ACTIVATE] * 3


def _host_copy(offset: int) -> HostCopy:
    return HostCopy(base_offset_bytes=offset, segments=(WeightSegment(global_offset_bytes=0, num_bytes=4096,
                                                                      checksum="w64:" + "1" * 32),))


def test_without_a_replica_the_other_devices_pull_a_warm_copy_from_its_host():
    rec, workers = boot(["w0", "w1", "w2"])
    warm = workers.put("m", "w1", InstanceRole.COLOCATED, Pool.ELASTIC, ModelState.WARM,
                       host_copy=_host_copy(-(1 << 30)))
    heartbeats(rec, workers, 0.0)
    eff = rec.on_elastic_plan(0.0, elastic("e1", {"m": (2, 0)}))
    by_worker = {c.worker_id: c for c in eff.commands}
    assert len(by_worker) == 2 and by_worker["w1"].action == LifecycleAction.ACTIVATE  # wakes its own copy
    (other,) = [c for w, c in by_worker.items() if w != "w1"]
    assert other.action == LifecycleAction.FORK_FROM
    src = other.fork_source
    assert (src.kind, src.worker_id, src.instance_id, src.transfer_session) == ("host_copy", "w1", warm, "w1:7000")
    assert src.base_offset_bytes == -(1 << 30) and src.segments == _host_copy(0).segments
    assert by_worker["w1"].fork_source is None


def test_a_live_replica_is_preferred_to_a_warm_copy_and_a_draining_host_offers_none():
    rec, workers = boot(["w0", "w1", "w2"])
    workers.put("m", "w1", InstanceRole.COLOCATED, Pool.ELASTIC, ModelState.WARM, host_copy=_host_copy(4096))
    live = workers.put("m", "w2", InstanceRole.COLOCATED, Pool.ELASTIC, ModelState.ACTIVE)
    heartbeats(rec, workers, 0.0)
    rec.on_record(0.0, workers.record(live, 0.0))
    alive = rec.view.alive_workers(0.0)
    source = rec.view.fork_source("m", alive, exclude_ids=set(), target_worker="w0")
    assert source.kind == "replica" and source.instance_id == live
    # without the replica: the warm copy, unless it is on the target itself or its worker drains
    assert rec.view.fork_source("m", alive, exclude_ids={live}, target_worker="w0").kind == "host_copy"
    assert rec.view.fork_source("m", alive, exclude_ids={live}, target_worker="w1") is None
    draining = workers.heartbeat("w1", 10.0).model_copy(update={"is_draining": True})
    rec.observe_heartbeat(10.0, draining)
    assert rec.view.fork_source("m", alive, exclude_ids={live}, target_worker="w0") is None


def test_failure_is_retried_then_reported_and_cooled_down():
    rec, workers = boot(["w0"])
    eff = rec.on_steady_plan(0.0, steady("s1", {"w0": ("a",)}))
    (cmd,) = eff.commands
    out = run_commands(rec, workers, [cmd], 10.0, fail={cmd.instance_id})
    assert actions(out) == [("a@w0/colocated", "retrying")]
    err = next(a for e in out for a in e.actions).error
    assert err is not None and err.retryable
    heartbeats(rec, workers, 100.0)
    assert rec.on_tick(300.0).commands == (), "backoff not over"
    eff2 = rec.on_tick(600.0)
    (retry,) = eff2.commands
    assert retry.command_id != cmd.command_id and retry.command_id.endswith("/2")
    assert actions([eff2]) == [("a@w0/colocated", "issued")]
    out = run_commands(rec, workers, [retry], 700.0, fail={retry.instance_id})
    assert actions(out) == [("a@w0/colocated", "failed")]
    failed = next(a for e in out for a in e.actions)
    assert failed.attempt == 2 and "gave up" in failed.reason
    # Cooling down: reported as blocked once, not retried, not done.
    assert statuses(out) == [("s1", "blocked")]
    assert "cooling down" in out[0].plan_statuses[0].detail
    eff3 = rec.on_tick(800.0)
    assert eff3.commands == () and eff3.plan_statuses == ()
    assert not rec.is_done("s1")
    # After the cooldown a new round of attempts starts.
    heartbeats(rec, workers, 10_700.0)
    eff4 = rec.on_tick(10_800.0)
    assert [c.instance_id for c in eff4.commands] == ["a@w0/colocated"]


def test_no_reply_times_out_and_retries():
    rec, workers = boot(["w0"])
    (cmd,) = rec.on_steady_plan(0.0, steady("s1", {"w0": ("a",)})).commands
    for t in range(1000, 5000, 1000):
        heartbeats(rec, workers, float(t))
        assert rec.on_tick(t + 10.0).actions == (), "within the deadline"
    eff = rec.on_tick(5_100.0)
    assert actions([eff]) == [("a@w0/colocated", "timed_out")]
    heartbeats(rec, workers, 5_500.0)
    (retry,) = rec.on_tick(5_700.0).commands
    assert retry.command_id.endswith("/2")


def test_ok_but_never_ready_times_out():
    rec, workers = boot(["w0"])
    (cmd,) = rec.on_steady_plan(0.0, steady("s1", {"w0": ("a",)})).commands
    rec.on_reply(10.0, workers.apply(cmd, 10.0))  # ok, but no registry record ever says ready
    heartbeats(rec, workers, 1_500.0)
    eff = rec.on_tick(2_100.0)
    assert actions([eff]) == [("a@w0/colocated", "timed_out")]
    assert "not ready" in eff.actions[0].reason


def test_failed_fork_falls_back_to_activate():
    rec, workers = boot(["w0", "w1"])
    src = workers.put("m", "w0", InstanceRole.COLOCATED, Pool.STEADY, ModelState.ACTIVE)
    heartbeats(rec, workers, 0.0)
    rec.on_record(0.0, workers.record(src, 0.0))
    rec.on_steady_plan(0.0, steady("s1", {"w0": ("m",)}))
    (fork,) = rec.on_elastic_plan(0.0, elastic("e1", {"m": (1, 0)})).commands
    assert fork.action == LifecycleAction.FORK_FROM
    run_commands(rec, workers, [fork], 10.0, fail={fork.instance_id})
    heartbeats(rec, workers, 600.0)
    (retry,) = rec.on_tick(600.0).commands
    assert retry.action == LifecycleAction.ACTIVATE and retry.instance_id == fork.instance_id


def test_scale_down_warms_the_extra_instances_and_stops_routing_at_once():
    rec, workers = boot(["w0", "w1", "w2"])
    eff = rec.on_elastic_plan(0.0, elastic("e1", {"m": (3, 0)}))
    converge(rec, workers, eff.commands, 10.0)
    heartbeats(rec, workers, 20.0)
    assert rec.is_done("e1")
    eff = rec.on_elastic_plan(500.0, elastic("e2", {"m": (1, 0)}))
    assert [c.action for c in eff.commands] == [LifecycleAction.WARM, LifecycleAction.WARM]
    removed = {c.instance_id for c in eff.commands}
    assert {r.instance_id for r in eff.registry_updates} == removed
    assert all(not r.is_ready and r.state == ModelState.DRAINING for r in eff.registry_updates)
    out = run_commands(rec, workers, eff.commands, 600.0)
    assert sorted(actions(out)) == sorted((i, "succeeded") for i in removed)
    assert not rec.is_done("e2"), "heartbeats still show them active"
    heartbeats(rec, workers, 700.0)
    assert statuses([rec.on_tick(710.0)]) == [("e2", "done")]


def test_a_move_keeps_the_last_replica_up_until_its_replacement_is_ready():
    rec, workers = boot(["w0", "w1"])
    run_commands(rec, workers, rec.on_steady_plan(0.0, steady("s1", {"w0": ("a",)})).commands, 10.0)
    heartbeats(rec, workers, 20.0)
    eff = rec.on_steady_plan(100.0, steady("s2", {"w1": ("a",)}))
    (cmd,) = eff.commands
    assert cmd.worker_id == "w1" and cmd.action == LifecycleAction.FORK_FROM, "make before break"
    assert cmd.fork_source.worker_id == "w0"
    out = run_commands(rec, workers, [cmd], 200.0)
    (cold,) = [c for e in out for c in e.commands]
    assert cold.worker_id == "w0" and cold.action == LifecycleAction.COLD


def test_removal_goes_first_on_a_device_that_needs_the_room():
    rec, workers = boot(["w0"])
    run_commands(rec, workers, rec.on_steady_plan(0.0, steady("s1", {"w0": ("a",)})).commands, 10.0)
    heartbeats(rec, workers, 20.0)
    eff = rec.on_steady_plan(100.0, steady("s2", {"w0": ("b",)}))
    assert [(c.instance_id, c.action) for c in eff.commands] == [("a@w0/colocated", LifecycleAction.COLD)]
    # The worker confirms the removal: the room is free, the activation follows at once.
    out = run_commands(rec, workers, eff.commands, 200.0)
    assert [(c.instance_id, c.action) for e in out for c in e.commands] == [
        ("b@w0/colocated", LifecycleAction.ACTIVATE)]
    assert rec.on_heartbeat(300.0, workers.heartbeat("w0", 300.0)).commands == (), "no second removal"


def test_a_silent_worker_is_marked_not_ready_and_its_commands_fail():
    rec, workers = boot(["w0", "w1"])
    eff = rec.on_steady_plan(0.0, steady("s1", {"w0": ("a",), "w1": ("b",)}))
    cmd_b = next(c for c in eff.commands if c.worker_id == "w1")
    run_commands(rec, workers, [c for c in eff.commands if c.worker_id == "w0"], 10.0)
    # w0 keeps beating, w1 falls silent.
    rec.observe_heartbeat(1_500.0, workers.heartbeat("w0", 1_500.0))
    eff = rec.on_tick(2_500.0)
    assert ("b@w1/colocated", "retrying") in actions([eff])
    assert "not alive" in eff.actions[0].reason
    assert eff.registry_updates == ()
    rec.observe_heartbeat(3_000.0, workers.heartbeat("w0", 3_000.0))
    eff = rec.on_tick(3_100.0)
    assert eff.commands == () and ("s1", "blocked") in statuses([eff]), "no command to a dead worker"
    # The ready instance on a worker that dies is taken out of the registry.
    rec2, workers2 = boot(["w0"])
    run_commands(rec2, workers2, rec2.on_steady_plan(0.0, steady("s1", {"w0": ("a",)})).commands, 10.0)
    eff = rec2.on_tick(2_100.0)
    (fixed,) = eff.registry_updates
    assert fixed.instance_id == "a@w0/colocated" and not fixed.is_ready and fixed.state == ModelState.FAILED
    assert cmd_b.worker_id == "w1"


def test_observe_only_plans_are_ignored_and_old_plans_superseded():
    rec, workers = boot(["w0"])
    eff = rec.on_steady_plan(0.0, steady("s0", {"w0": ("a",)}, observe_only=True))
    assert eff.commands == () and statuses([eff]) == [("s0", "ignored")]
    rec.on_steady_plan(10.0, steady("s1", {"w0": ("a",)}))
    eff = rec.on_steady_plan(20.0, steady("s2", {"w0": ("a",)}))
    assert ("s1", "superseded") in statuses([eff])
    assert eff.commands == (), "the activation already in flight serves the new plan too"


def test_elastic_instances_survive_until_an_elastic_plan_is_seen():
    rec, workers = boot(["w0", "w1"])
    workers.put("m", "w1", InstanceRole.COLOCATED, Pool.ELASTIC, ModelState.ACTIVE)
    heartbeats(rec, workers, 0.0)
    eff = rec.on_steady_plan(0.0, steady("s1", {"w0": ("a",)}))
    assert [c.instance_id for c in eff.commands] == ["a@w0/colocated"]
    # Once the steady pool claims w1, the elastic instance there has to go.
    eff = rec.on_steady_plan(10.0, steady("s2", {"w0": ("a",), "w1": ("b",)}))
    assert ("m@w1/colocated", LifecycleAction.WARM) in [(c.instance_id, c.action) for c in eff.commands]


def test_not_enough_free_devices_is_reported():
    rec, workers = boot(["w0", "w1", "w2"])
    rec.on_steady_plan(0.0, steady("s1", {"w0": ("a",)}))
    eff = rec.on_elastic_plan(0.0, elastic("e1", {"m": (2, 1)}))
    assert len(eff.commands) == 1  # m's first instance; the other forks from it once it is ready
    blocked = [s for s in eff.plan_statuses if s.status == "blocked"]
    assert blocked and "no free device" in blocked[0].detail


def test_an_instance_the_worker_already_runs_fills_the_slot_under_its_own_id():
    rec, workers = boot(["w0"])
    # A worker started "a" at bootstrap, under its own id.
    workers.put("a", "w0", InstanceRole.COLOCATED, Pool.STEADY, ModelState.ACTIVE, instance_id="w0/a")
    heartbeats(rec, workers, 0.0)
    rec.on_record(0.0, workers.record("w0/a", 0.0))
    eff = rec.on_steady_plan(0.0, steady("s1", {"w0": ("a",)}))
    assert eff.commands == () and statuses([eff]) == [("s1", "done")]


def _set_state(workers: ScriptedWorkers, cmd, state: ModelState) -> None:
    """What the worker's next heartbeat reports for the instance `cmd` names."""
    insts = workers.instances[cmd.worker_id]
    insts[cmd.instance_id] = insts[cmd.instance_id].model_copy(update={"state": state})


def _drain_past_the_deadline(draining: bool, answer_state: ModelState = ModelState.DRAINING):
    """Scale m from 2 to 1; the worker takes the removal and (when `draining`) reports the instance DRAINING on every
    heartbeat, past the command deadline (5 s here); the command's deadline is answered with a timeout in
    `answer_state` (the worker's own answer says DRAINING; the bus's, when it comes first, says FAILED)."""
    rec, workers = boot(["w0", "w1"])
    converge(rec, workers, rec.on_elastic_plan(0.0, elastic("e1", {"m": (2, 0)})).commands, 10.0)
    heartbeats(rec, workers, 20.0)
    (removal,) = rec.on_elastic_plan(500.0, elastic("e2", {"m": (1, 0)})).commands
    if draining:
        _set_state(workers, removal, ModelState.DRAINING)
    out = []
    for t in range(1_000, 12_000, 1_000):
        heartbeats(rec, workers, float(t))
        out.append(rec.on_tick(t + 10.0))
        if t == 5_000:
            reply = LifecycleReply(
                command_id=removal.command_id, instance_id=removal.instance_id, ok=False,
                state=answer_state if draining else ModelState.ACTIVE, detail="not done within 5000 ms",
                error=ErrorInfo(code=ErrorCode.TIMEOUT, message="not done within 5000 ms; still running",
                                retryable=True))
            out.append(rec.on_reply(t + 20.0, reply))
    return rec, workers, removal, out


@pytest.mark.parametrize("answer_state", [ModelState.DRAINING, ModelState.FAILED], ids=["worker", "bus"])
def test_a_drain_that_outlasts_the_command_deadline_is_waited_for_not_retried(answer_state):
    rec, workers, removal, out = _drain_past_the_deadline(draining=True, answer_state=answer_state)
    assert actions(out) == [], "neither timed out nor retried while the worker reports it draining"
    assert [c for e in out for c in e.commands] == []
    assert not rec.is_done("e2")
    _set_state(workers, removal, ModelState.WARM)  # the drain ends
    heartbeats(rec, workers, 60_000.0)
    eff = rec.on_tick(60_010.0)
    assert actions([eff]) == [(removal.instance_id, "succeeded")]
    assert statuses([eff]) == [("e2", "done")]
    # no cooldown was left behind: the model may come back on that worker at once
    (up,) = rec.on_elastic_plan(60_100.0, elastic("e3", {"m": (2, 0)})).commands
    assert up.worker_id == removal.worker_id


def test_a_removal_the_worker_does_not_report_draining_still_times_out():
    rec, workers, removal, out = _drain_past_the_deadline(draining=False)
    assert ("timed_out" in {s for _, s in actions(out)} or "retrying" in {s for _, s in actions(out)})
    retries = [c for e in out for c in e.commands]
    assert retries and all(c.instance_id == removal.instance_id for c in retries)

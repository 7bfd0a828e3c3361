"""The simulated fleet behind the reconciler core: the live reconciler's commands carried out on simulated devices,
and what a worker would report coming back (replies, records, heartbeats)."""
from __future__ import annotations

import dataclasses

from contracts import ElasticPlan, ElasticTarget, LifecycleAction
from planner.core import Reconciler, ReconcilerPolicy
from sim.scenario import build_scenario
from sim.systems.base import ControlPlane, SystemRun
from sim.systems.fleet import SimFleet
from sim.trace import Trace


class _Idle(ControlPlane):
    """Places nothing by itself: the test drives the reconciler."""

    name = "idle"

    def install(self, run: SystemRun) -> None:
        self.run = run


def _fleet(num_devices: int, model: str = "qwen2-7b", policy: ReconcilerPolicy | None = None,
           device: str = "nvidia-h200", is_warm_at_start: bool = True):
    # two requests at t = 0 (no instance yet: turned away), two after the test, which keep the clock running
    # (the later two are long: assigned by hand, they keep a drain going for a while)
    trace = Trace.build([0.0, 0.0, 500.0, 500.0], [0, 1, 0, 1], [100] * 4, [10, 10, 4000, 4000], ("a", "b"))
    scenario = build_scenario(trace, device_name=device, num_devices=num_devices, tiers=((1.0, (model,)),))
    scenario = dataclasses.replace(scenario, is_warm_at_start=is_warm_at_start)
    run = SystemRun(scenario, _Idle())
    run.control.install(run)
    rec = Reconciler(policy or ReconcilerPolicy())
    fleet = SimFleet(run, rec)
    fleet.settle(0.0, None)
    return run, rec, fleet


_PLANS = iter(range(10**6))


def _plan(counts: dict[str, int], tp: int = 1) -> ElasticPlan:
    return ElasticPlan(plan_id=f"e{next(_PLANS)}", created_unix_ms=0.0, budget_devices=64, num_devices_used=0,
                       targets=tuple(ElasticTarget(model=m, num_prefill=n, num_decode=0, desired_replicas=n,
                                                   num_devices_per_instance=tp) for m, n in counts.items()))


def _send(run, rec, fleet, counts: dict[str, int], at_s: float, tp: int = 1):
    run.sim.run(until_s=at_s)
    effects = rec.on_elastic_plan(at_s * 1e3, _plan(counts, tp))
    fleet.apply(effects, at_s)
    return effects


def _live(run, app: int) -> list:
    return [i for i in run.sim.instances_by_app.get(app, ()) if not i.is_draining]


def test_a_tensor_parallel_instance_runs_on_the_group_the_reconciler_chose():
    run, rec, fleet = _fleet(5, model="qwen2.5-32b", device="ascend-910c-die")
    assert run.costs[0].tp == 2
    first = _send(run, rec, fleet, {"a": 1}, 0.1, tp=2).commands
    assert len(first) == 1 and len(first[0].peer_worker_ids) == 1
    run.sim.run(until_s=60.0)
    (inst,) = _live(run, 0)
    assert inst.is_ready and inst.executor.device_ids == tuple(
        int(w[1:]) for w in (first[0].worker_id, *first[0].peer_worker_ids))
    assert rec.view.occupied_workers(rec.view.alive_workers(60e3)) >= {first[0].worker_id, *first[0].peer_worker_ids}
    second = _send(run, rec, fleet, {"a": 2}, 60.1, tp=2).commands
    assert [c.action for c in second] == [LifecycleAction.FORK_FROM]
    assert not {second[0].worker_id, *second[0].peer_worker_ids} & {first[0].worker_id, *first[0].peer_worker_ids}
    run.sim.run(until_s=70.0)
    assert len(_live(run, 0)) == 2 and run.counters["fork"] == 1


def test_the_first_replica_loads_from_disk_and_the_others_fork_from_it():
    run, rec, fleet = _fleet(4, is_warm_at_start=False)
    effects = _send(run, rec, fleet, {"a": 3}, 0.1)
    assert [c.action for c in effects.commands] == [LifecycleAction.ACTIVATE]
    run.sim.run(until_s=60.0)
    assert len(_live(run, 0)) == 3 and all(i.is_ready for i in _live(run, 0))
    assert run.counters["cold_load"] == 1 and run.counters["fork"] == 2


def test_a_model_warm_in_a_peers_host_is_pulled_from_there_not_read_from_disk():
    run, rec, fleet = _fleet(4)  # a fleet that had been running: model "a" is warm on d0's host
    effects = _send(run, rec, fleet, {"a": 2}, 0.1)
    by_worker = {c.worker_id: c for c in effects.commands}
    assert by_worker["d0"].action == LifecycleAction.ACTIVATE, "d0 holds it warm itself: a warm copy"
    (pull,) = [c for w, c in by_worker.items() if w != "d0"]
    assert pull.action == LifecycleAction.FORK_FROM and pull.fork_source.kind == "host_copy"
    assert pull.fork_source.worker_id == "d0"
    run.sim.run(until_s=60.0)
    assert len(_live(run, 0)) == 2 and run.counters["cold_load"] == 0
    assert run.counters["warm_copy"] == 1 and run.counters["remote_warm"] == 1


def test_a_device_still_draining_takes_no_new_model_until_the_drain_is_over():
    run, rec, fleet = _fleet(1)
    _send(run, rec, fleet, {"a": 1}, 0.1)
    run.sim.run(until_s=60.0)
    (old,) = _live(run, 0)
    run.sim.assign(old, 2, 60.0)  # a request in flight: the drain waits for it
    effects = _send(run, rec, fleet, {"b": 1}, 60.1)
    assert [(c.model, c.action) for c in effects.commands] == [("a", LifecycleAction.WARM)]
    run.sim.run(until_s=60.3)
    assert old.is_draining and old.executor is not None and not run.sim.instances_by_app.get(1)
    run.sim.run(until_s=200.0)
    assert old.executor is None, "drained and released"
    (new,) = _live(run, 1)
    assert new.is_ready and new.executor.device_ids == (0,)


def test_an_instance_with_no_device_is_kept_as_the_reconcilers_blocked_report():
    """What `--watch` shows of a plan that waits for a device (sim/watch.py): the reconciler's report, with its
    time, once per plan."""
    from sim.watch import blocked_story

    run, rec, fleet = _fleet(2)
    _send(run, rec, fleet, {"a": 3}, 0.1)  # three wanted, two devices
    assert fleet.blocked_log == [(0.1, "1 instance(s) of a: no free device")]
    run.sim.run(until_s=5.0)
    fleet.tick(5.0)  # the same plan, still short: not reported again
    assert len(fleet.blocked_log) == 1
    _send(run, rec, fleet, {"a": 2}, 6.0)  # fits: nothing more to report
    assert len(fleet.blocked_log) == 1 and len(_live(run, 0)) == 2
    assert blocked_story(fleet.blocked_log, "a") == [{"t_s": 0.1, "detail": "1 instance(s) of a: no free device"}]
    assert blocked_story(fleet.blocked_log, "b") == []


def test_a_count_that_rises_again_resumes_the_draining_instance():
    for resumes in (True, False):
        run, rec, fleet = _fleet(3, policy=ReconcilerPolicy(resumes_draining=resumes))
        _send(run, rec, fleet, {"a": 2}, 0.1)
        run.sim.run(until_s=60.0)
        both = _live(run, 0)
        for request, inst in zip((2, 3), both):
            run.sim.assign(inst, request, 60.0)
        _send(run, rec, fleet, {"a": 1}, 60.1)
        run.sim.run(until_s=60.3)
        (draining,) = [i for i in both if i.is_draining]
        _send(run, rec, fleet, {"a": 2}, 60.4)
        run.sim.run(until_s=61.0)
        if resumes:
            assert draining.is_ready and not draining.is_draining, "admitted again in place"
            assert run.counters["resumed"] == 1 and len(run.sim.instances) == 2
        else:
            assert draining.is_draining and run.counters["resumed"] == 0
            assert len(_live(run, 0)) == 2, "a new one on the free device"

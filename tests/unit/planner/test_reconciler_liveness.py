"""The reconciler takes a worker for dead only for the worker's silence, not its own: a record read before the
worker's first heartbeat could arrive, a stalled event loop, and a lost bus connection each once drained live
instances on a loaded host (docs/reliability.md)."""
from __future__ import annotations

from planner_test_workers import ScriptedWorkers
from test_planner_reconciler import POLICY, boot, run_commands, steady

from contracts import InstanceRole, ModelState, Pool
from planner.core.reconciler import Reconciler

TIMEOUT_MS = POLICY.heartbeat_timeout_ms
PERIOD_MS = 200.0


def _serving(worker="w0"):
    """A reconciler whose worker serves model a (ready record), last heard at 10 ms."""
    rec, workers = boot([worker])
    run_commands(rec, workers, rec.on_steady_plan(0.0, steady("s1", {worker: ("a",)})).commands, 10.0)
    return rec, workers


def _failed_ids(effects) -> set[str]:
    return {r.instance_id for r in effects.registry_updates if r.state == ModelState.FAILED}


def test_a_ready_record_of_a_worker_not_heard_yet_gets_the_heartbeat_timeout_to_speak():
    workers = ScriptedWorkers(["w0"])
    iid = workers.put("a", "w0", InstanceRole.COLOCATED, Pool.STEADY, ModelState.ACTIVE)
    rec = Reconciler(POLICY)  # a reconciler that just started: the registry first, no heartbeat yet
    rec.observe_record(workers.record(iid, 0.0))
    assert _failed_ids(rec.on_tick(200.0)) == set(), "heard of 200 ms ago: not dead"
    assert _failed_ids(rec.on_tick(TIMEOUT_MS)) == set()
    assert _failed_ids(rec.on_tick(200.0 + TIMEOUT_MS + 1)) == {iid}, "silent for the whole timeout: dead"


def test_a_heartbeat_within_the_grace_keeps_the_record():
    workers = ScriptedWorkers(["w0"])
    iid = workers.put("a", "w0", InstanceRole.COLOCATED, Pool.STEADY, ModelState.ACTIVE)
    rec = Reconciler(POLICY)
    rec.observe_record(workers.record(iid, 0.0))
    rec.on_tick(100.0)
    rec.observe_heartbeat(1_000.0, workers.heartbeat("w0", 1_000.0))
    assert _failed_ids(rec.on_tick(1_000.0 + TIMEOUT_MS)) == set()


def test_a_stalled_tick_is_the_reconcilers_silence_not_its_workers():
    for expected_period_ms, is_taken_for_dead in ((PERIOD_MS, False), (None, True)):
        rec, _ = _serving()
        rec.on_tick(100.0, expected_period_ms=expected_period_ms)
        # the loop was blocked for 5 s: the heartbeats sent meanwhile wait unread in the socket
        late = rec.on_tick(5_100.0, expected_period_ms=expected_period_ms)
        assert bool(_failed_ids(late)) is is_taken_for_dead, expected_period_ms
    rec, _ = _serving()
    rec.on_tick(100.0, expected_period_ms=PERIOD_MS)
    t, failed_at = 100.0, {}
    while t < 100.0 + TIMEOUT_MS + 4 * PERIOD_MS:  # on time, and the worker silent: dead after the timeout
        t += PERIOD_MS
        failed_at.update((iid, t) for iid in _failed_ids(rec.on_tick(t, expected_period_ms=PERIOD_MS)))
    assert list(failed_at) == ["a@w0/colocated"] and failed_at["a@w0/colocated"] > 10.0 + TIMEOUT_MS


def test_without_a_bus_connection_the_workers_clocks_stop():
    rec, workers = _serving()
    rec.on_tick(100.0)
    for t in (1_000.0, 3_000.0, 6_000.0):  # the reconciler's NATS node is down for 6 s
        assert _failed_ids(rec.on_tick(t, is_listening=False)) == set()
    rec.observe_heartbeat(6_300.0, workers.heartbeat("w0", 6_300.0))
    assert _failed_ids(rec.on_tick(6_400.0)) == set(), "back, and heard at once"
    assert _failed_ids(rec.on_tick(6_300.0 + TIMEOUT_MS + 1)) == {"a@w0/colocated"}, "then silent again: dead"

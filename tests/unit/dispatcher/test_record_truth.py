"""A worker's heartbeat proves a FAILED record of its instance stale (dispatcher/core/record_truth.py)."""
from __future__ import annotations

from contracts import InstanceRole, ModelState
from dispatcher.core import DispatcherCore, DispatchPolicy, ThroughputPrefillModel
from dispatcher.core.record_truth import corrected_by_heartbeat

from .helpers import assigns, heartbeat, record, rejects, request


def _failed(instance_id: str, at_ms: float):
    return record(instance_id, is_ready=False, state=ModelState.FAILED, updated_ms=at_ms)


def test_a_failed_record_written_before_a_heartbeat_reporting_the_instance_active_is_corrected():
    records = {"k-a": _failed("a", 1000.0), "k-b": _failed("b", 1000.0)}
    records = {k: r.model_copy(update={"worker_id": "w"}) for k, r in records.items()}
    hb = heartbeat(1500.0, {"a": 1}, role=InstanceRole.COLOCATED)  # worker "w" reports a ACTIVE, not b
    (key, fixed), = corrected_by_heartbeat(records, hb).items()
    assert key == "k-a" and fixed.is_ready and fixed.state == ModelState.ACTIVE and fixed.updated_unix_ms == 1500.0


def test_what_the_heartbeat_does_not_contradict_stands():
    older_hb = heartbeat(900.0, {"a": 1}, role=InstanceRole.COLOCATED)
    failed = {"k": _failed("a", 1000.0).model_copy(update={"worker_id": "w"})}
    assert corrected_by_heartbeat(failed, older_hb) == {}  # the record may report what came after the heartbeat
    other_worker = {"k": _failed("a", 1000.0)}  # written for worker "w-a"
    assert corrected_by_heartbeat(other_worker, heartbeat(1500.0, {"a": 1}, role=InstanceRole.COLOCATED)) == {}
    draining = {"k": record("a", is_ready=False, state=ModelState.DRAINING, updated_ms=1000.0)
                .model_copy(update={"worker_id": "w"})}
    # a drain the reconciler ordered: the worker may still say ACTIVE until the command reaches it
    assert corrected_by_heartbeat(draining, heartbeat(1500.0, {"a": 1}, role=InstanceRole.COLOCATED)) == {}


def test_the_corrected_record_makes_the_instance_routable_again_and_lifts_a_ban():
    core = DispatcherCore(DispatchPolicy(), ThroughputPrefillModel(10_000.0))
    live = record("a", updated_ms=0.0).model_copy(update={"worker_id": "w"})
    core.on_instances(0.0, [live])
    core.on_instance_lost(500.0, "a")  # banned: its worker looked silent
    failed = live.model_copy(update={"is_ready": False, "state": ModelState.FAILED, "updated_unix_ms": 1000.0})
    core.on_instances(1000.0, [failed])
    assert core.routable_models() == []
    waited = core.on_request(1100.0, request("r0", 1100.0, slo_ms=30_000.0))
    assert not assigns(waited) and not rejects(waited)  # waits for an instance
    (fixed,) = corrected_by_heartbeat({"k": failed}, heartbeat(1200.0, {"a": 0}, role=InstanceRole.COLOCATED)).values()
    (assign,) = assigns(core.on_instances(1250.0, [fixed]))
    assert (assign.request_id, assign.instance_id) == ("r0", "a") and core.routable_models() == ["m"]

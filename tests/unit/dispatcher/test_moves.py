"""Moving running decodes off draining decode instances (dispatcher/core/moves.py), through the core: which draining
instance moves how many decodes where, from heartbeats alone."""
from __future__ import annotations

from contracts import DeviceInfo, InstanceRole, InstanceStatus, ModelState, PageCounters, Pool, WorkerHeartbeat
from dispatcher.core import DispatcherCore, DispatchPolicy, ThroughputPrefillModel
from dispatcher.core.effects import MoveDecodes

from .helpers import TOKENS_PER_S, record, request

SLO_MS = 100.0  # TPOT SLO of the requests: a target's step may grow to 60 ms (the 0.6 margin)


def make_core(**knobs) -> DispatcherCore:
    policy = DispatchPolicy(**{"moves_draining_decodes": True, "move_after_draining_ms": 1000.0, **knobs})
    core = DispatcherCore(policy, ThroughputPrefillModel(TOKENS_PER_S))
    core.on_instances(0.0, [record("p", role=InstanceRole.PREFILL), record("t0", role=InstanceRole.DECODE),
                            record("t1", role=InstanceRole.DECODE),
                            record("s0", role=InstanceRole.DECODE, is_ready=False, state=ModelState.DRAINING),
                            record("s1", role=InstanceRole.DECODE, is_ready=False, state=ModelState.DRAINING)])
    req = request("r", 0.0)
    core.on_request(0.0, type(req)(**{**{f: getattr(req, f) for f in req.__dataclass_fields__}, "tpot_slo_ms": SLO_MS}))
    return core


def status(iid: str, running: int, *, draining: bool = False, step_ms: float | None = None) -> InstanceStatus:
    """A decode instance's heartbeat line; `step_ms`: its decode step now (it reports running / step tokens/s)."""
    tps = None if step_ms is None or running == 0 else running * 1e3 / step_ms
    return InstanceStatus(instance_id=iid, model="m", role=InstanceRole.DECODE, pool=Pool.ELASTIC,
                          state=ModelState.DRAINING if draining else ModelState.ACTIVE, num_running=running,
                          decode_tokens_per_s=tps)


def beat(core, at_ms: float, worker: str, *statuses: InstanceStatus) -> list[MoveDecodes]:
    hb = WorkerHeartbeat(worker_id=worker, seq=0, sent_unix_ms=at_ms,
                         device=DeviceInfo(kind="cpu", name="cpu", hbm_bytes=0),
                         pages=PageCounters(page_size_bytes=1, num_pages_total=0, num_pages_free=0,
                                            fragmentation=0.0), instances=statuses)
    return [e for e in core.on_heartbeat(at_ms, hb) if isinstance(e, MoveDecodes)]


def moves(effects) -> list[tuple[str, str, int]]:
    return [(m.instance_id, m.target_instance_id, m.max_requests) for m in effects]


def test_a_decode_instance_draining_long_enough_moves_its_decodes_within_the_targets_tpot():
    core = make_core()
    beat(core, 0.0, "w-t", status("t0", 10, step_ms=30.0), status("t1", 10, step_ms=55.0))
    assert beat(core, 0.0, "w-s", status("s0", 5, draining=True)) == []  # just started draining
    assert beat(core, 900.0, "w-s", status("s0", 5, draining=True)) == []
    got = beat(core, 1000.0, "w-s", status("s0", 5, draining=True))
    # t0 runs 10 at 30 ms: 10 more keep it at 60 ms, the margin; t1 at 55 ms has no room
    assert moves(got) == [("s0", "t0", 5)]
    assert got[0].worker_id == "w-s" and got[0].target_worker_id == "w-t0" and got[0].model == "m"


def test_targets_fill_up_to_their_room_and_the_emptiest_source_goes_first():
    core = make_core(move_max_per_target=4)
    beat(core, 0.0, "w-t", status("t0", 0), status("t1", 10, step_ms=50.0))  # t0 idle: step unknown
    beat(core, 0.0, "w-s", status("s0", 9, draining=True), status("s1", 3, draining=True))
    got = beat(core, 1000.0, "w-s", status("s0", 9, draining=True), status("s1", 3, draining=True))
    # t0 takes the most per heartbeat (4); t1's step may grow 50 -> 60 ms: 10 * (60 / 50 - 1) = 2 more
    assert moves(got) == [("s1", "t0", 3), ("s0", "t0", 1), ("s0", "t1", 2)]


def test_orders_wait_for_fresh_heartbeats_of_source_and_target():
    core = make_core()
    beat(core, 0.0, "w-t", status("t0", 0), status("t1", 0))
    beat(core, 0.0, "w-s", status("s0", 30, draining=True))
    first = beat(core, 1000.0, "w-s", status("s0", 30, draining=True))
    assert moves(first) == [("s0", "t0", 8), ("s0", "t1", 8)]
    # the targets have not reported the moved decodes yet: their room is spent until they do
    assert beat(core, 1500.0, "w-s", status("s0", 14, draining=True)) == []
    beat(core, 1600.0, "w-t", status("t0", 8, step_ms=20.0), status("t1", 8, step_ms=40.0))
    again = beat(core, 2000.0, "w-s", status("s0", 14, draining=True))
    # t0: 8 * (60 / 20 - 1) = 16, at most 8 a heartbeat; t1: 8 * (60 / 40 - 1) = 4
    assert moves(again) == [("s0", "t0", 8), ("s0", "t1", 4)]


def test_nothing_moves_with_the_knob_off_or_without_a_tpot_slo():
    off = make_core(moves_draining_decodes=False)
    beat(off, 0.0, "w-t", status("t0", 0))
    beat(off, 0.0, "w-s", status("s0", 5, draining=True))
    assert beat(off, 5000.0, "w-s", status("s0", 5, draining=True)) == []
    core = DispatcherCore(DispatchPolicy(moves_draining_decodes=True, move_after_draining_ms=0.0),
                          ThroughputPrefillModel(TOKENS_PER_S))
    core.on_instances(0.0, [record("t0", role=InstanceRole.DECODE),
                            record("s0", role=InstanceRole.DECODE, is_ready=False, state=ModelState.DRAINING)])
    assert beat(core, 0.0, "w-s", status("s0", 5, draining=True)) == []  # no request told it the SLO


def test_a_resumed_or_drained_instance_is_no_source_any_more():
    core = make_core()
    beat(core, 0.0, "w-t", status("t0", 0))
    beat(core, 0.0, "w-s", status("s0", 5, draining=True), status("s1", 5, draining=True))
    beat(core, 500.0, "w-s", status("s0", 5), status("s1", 5, draining=True))  # s0 resumed (DRAINING -> ACTIVE)
    got = beat(core, 1000.0, "w-s", status("s1", 5, draining=True))  # s0 left the worker
    assert moves(got) == [("s1", "t0", 5)]
    beat(core, 1100.0, "w-t", status("t0", 5, step_ms=10.0))
    beat(core, 1200.0, "w-s", status("s0", 4, draining=True))  # drains again: its clock starts over, s1 is gone
    assert beat(core, 2100.0, "w-s", status("s0", 4, draining=True)) == []
    assert moves(beat(core, 2200.0, "w-s", status("s0", 4, draining=True))) == [("s0", "t0", 4)]

"""DispatcherCore event by event: routing, EPDT, LST-IMH rounds, overload policies, failures, baselines."""
from __future__ import annotations

import pytest

from contracts import ErrorCode, GenerateRequest, InstanceRole, ModelState, SamplingParams
from dispatcher.core import (
    Algorithm,
    DispatchPolicy,
    DispatcherCore,
    OverloadPolicy,
    PublishLoad,
    Relaxed,
    Requeued,
    ThroughputPrefillModel,
)

from .helpers import TOKENS_PER_S, assigns, heartbeat, placed, record, rejects, request


def make_core(**knobs) -> DispatcherCore:
    knobs.setdefault("publish_period_ms", 60_000.0)  # load windows out of the way of the wakeups under test
    knobs.setdefault("is_wake_published_at_once", False)  # that window has its own tests below
    # the paper's overload rule (reject at once) unless a test asks for requeue, the default, by name
    knobs.setdefault("overload", OverloadPolicy.REJECT)
    return DispatcherCore(DispatchPolicy(**knobs), ThroughputPrefillModel(TOKENS_PER_S))


def test_routes_only_to_ready_active_instances_of_the_model():
    core = make_core()
    core.on_instances(0.0, [
        record("a"),
        record("b", is_ready=False),  # waking
        record("c", is_ready=True, state=ModelState.DRAINING),  # inconsistent record: not routed to either
        record("d", model="other"),
    ])
    effects = core.on_requests(0.0, [request(f"r{k}", 0.0, tokens=100) for k in range(6)])
    assert set(placed(effects).values()) == {"a"}
    assert len(placed(effects)) == 6


def test_routable_models_are_those_a_new_request_is_routed_for_now():
    # what the dispatcher's heartbeat tells the gateways' /ready
    core = make_core()
    core.on_instances(0.0, [
        record("a"),
        record("b", model="waking", is_ready=False),
        record("p", model="pd", role=InstanceRole.PREFILL),  # no decode instance to hand over to: not routable
        record("c", model="banned"),
    ])
    core.on_instance_lost(1.0, "c")  # its worker went silent
    assert core.routable_models() == ["m"]
    core.on_instances(2.0, [record("a"), record("b", model="waking"),
                            record("p", model="pd", role=InstanceRole.PREFILL),
                            record("d", model="pd", role=InstanceRole.DECODE)])
    assert core.routable_models() == ["m", "pd", "waking"]


def test_no_ready_instance_is_a_clear_retryable_error():
    core = make_core(max_wait_for_instance_ms=0.0)  # no wait for one to come up (tested below)
    core.on_instances(0.0, [record("b", is_ready=False)])
    (reject,) = rejects(core.on_request(0.0, request("r0", 0.0)))
    assert reject.code == ErrorCode.NO_INSTANCE
    assert reject.retryable
    assert "'m'" in reject.reason
    info = reject.error_info()
    assert info.code == ErrorCode.NO_INSTANCE and info.retryable


def test_overload_reject_fails_early_with_the_reason():
    core = make_core(overload=OverloadPolicy.REJECT)
    core.on_instances(0.0, [record("a")])
    assert placed(core.on_request(0.0, request("r0", 0.0, tokens=8000))) == {"r0": "a"}  # 800 ms of 1000
    (reject,) = rejects(core.on_request(1.0, request("r1", 1.0, tokens=8000)))
    assert reject.code == ErrorCode.OVERLOADED
    assert "TTFT deadline" in reject.reason
    assert core.queue_depth("m") == 0


def test_overload_requeue_relaxes_the_deadline_and_counts_the_request_late():
    # a round on every event: the relaxation comes with the arrival (the deferred rounds are tested below)
    core = make_core(overload=OverloadPolicy.REQUEUE, publish_period_ms=5000.0, window_s=10.0,
                     defers_rounds_until_near=False)
    core.on_instances(0.0, [record("a")])
    core.on_request(0.0, request("r0", 0.0, tokens=8000))
    effects = core.on_request(1.0, request("r1", 1.0, tokens=8000))
    (relaxed,) = [e for e in effects if isinstance(e, Relaxed)]
    assert relaxed.ttft_deadline_ms == pytest.approx(2001.0) and relaxed.num_relaxations == 1
    assert not rejects(effects) and not assigns(effects)
    assert core.next_wakeup_ms() == pytest.approx(780.0)  # lookahead before a frees up
    (late,) = assigns(core.on_tick(780.0))
    assert (late.request_id, late.instance_id, late.is_late) == ("r1", "a", True)
    assert late.ttft_deadline_ms == pytest.approx(2001.0)
    core.on_prefill_done(800.0, "a", "r0")
    core.on_prefill_done(1590.0, "a", "r1")  # before its relaxed deadline and even its own: still late
    (window,) = [e.window for e in core.on_tick(5000.0) if e.__class__.__name__ == "PublishLoad"]
    assert window.ttft_attainment == pytest.approx(0.5)
    assert window.num_late == 1 and window.num_rejected == 0


def test_requeue_defers_the_round_until_an_instance_comes_near_free():
    core = make_core(overload=OverloadPolicy.REQUEUE, publish_period_ms=5000.0, window_s=10.0)
    core.on_instances(0.0, [record("a")])
    core.on_request(0.0, request("r0", 0.0, tokens=8000))  # a is busy until 800
    # arrivals while a is busy beyond the lookahead: nothing could be committed, so no round yet
    assert core.on_request(1.0, request("r1", 1.0, tokens=8000)) == []
    assert core.on_request(2.0, request("r2", 2.0, tokens=100)) == []
    assert core.queue_depth("m") == 2
    assert core.next_wakeup_ms() == pytest.approx(780.0)
    # the round at 780 plans both together: r2 (10 ms) still makes its deadline, r1 cannot and is relaxed
    effects = core.on_tick(780.0)
    (relaxed,) = [e for e in effects if isinstance(e, Relaxed)]
    assert relaxed.request_id == "r1" and relaxed.ttft_deadline_ms == pytest.approx(2001.0)
    (on_time,) = assigns(effects)
    assert (on_time.request_id, on_time.instance_id, on_time.is_late) == ("r2", "a", False)
    # eager rounds make the same relaxation at once, and the same assignment at the same wakeup
    eager = make_core(overload=OverloadPolicy.REQUEUE, defers_rounds_until_near=False)
    eager.on_instances(0.0, [record("a")])
    eager.on_request(0.0, request("r0", 0.0, tokens=8000))
    assert [type(e).__name__ for e in eager.on_request(1.0, request("r1", 1.0, tokens=8000))] == ["Relaxed"]
    assert eager.on_request(2.0, request("r2", 2.0, tokens=100)) == []
    assert [(a.request_id, a.is_late) for a in assigns(eager.on_tick(780.0))] == [("r2", False)]


def test_deferred_rounds_still_resolve_a_late_request_when_it_turns_hopeless():
    core = make_core(overload=OverloadPolicy.REQUEUE, max_num_relaxations=1)
    core.on_instances(0.0, [record("a")])
    core.on_request(0.0, request("r0", 0.0, tokens=8000))  # a busy until 800
    core.on_request(1.0, request("r1", 1.0, tokens=9000, slo_ms=5000.0))  # 900 ms, deadline 5001
    core.on_request(2.0, request("r2", 2.0, tokens=5000))  # 500 ms, deadline 1002: cannot make it
    effects = core.on_tick(780.0)
    assert [a.request_id for a in assigns(effects)] == ["r1"]  # a is now busy until 1700
    assert [e.request_id for e in effects if isinstance(e, Relaxed)] == ["r2"]  # to 2002, late
    # r2 turns hopeless at 2002 - 50 - 500 = 1452, before a comes near free (1680): that wakeup runs a round
    assert core.next_wakeup_ms() == pytest.approx(1452.0)
    (reject,) = rejects(core.on_tick(1452.0))
    assert reject.request_id == "r2" and core.queue_depth("m") == 0


def test_requeue_gives_up_after_the_last_relaxation():
    core = make_core(overload=OverloadPolicy.REQUEUE, max_num_relaxations=1, defers_rounds_until_near=False)
    core.on_instances(0.0, [record("a")])
    core.on_request(0.0, request("r0", 0.0, tokens=30_000, slo_ms=5000.0))  # 3 s of work
    effects = core.on_request(1.0, request("r1", 1.0, tokens=8000))
    assert [type(e).__name__ for e in effects] == ["Relaxed"]  # new deadline 2001, unreachable behind r0
    # It waits while a free instance could still make it (an EPDT can improve), then fails: 2001 - 50 - 800.
    assert core.next_wakeup_ms() == pytest.approx(1151.0)
    (reject,) = rejects(core.on_tick(1151.0))
    assert reject.request_id == "r1" and reject.code == ErrorCode.OVERLOADED
    assert core.queue_depth("m") == 0


def test_late_work_never_displaces_a_request_that_can_be_on_time():
    core = make_core(overload=OverloadPolicy.REQUEUE)
    core.on_instances(0.0, [record("a")])
    core.on_request(0.0, request("r0", 0.0, tokens=8000))
    core.on_request(1.0, request("r1", 1.0, tokens=8000))  # late now
    core.on_request(2.0, request("r2", 2.0, tokens=1000))  # fits after r0
    first = assigns(core.on_tick(780.0))
    assert [(a.request_id, a.is_late) for a in first] == [("r2", False)]
    assert core.next_wakeup_ms() == pytest.approx(880.0)
    second = assigns(core.on_tick(880.0))
    assert [(a.request_id, a.is_late) for a in second] == [("r1", True)]


def test_deadline_margin_leaves_room_for_prediction_error():
    for margin, is_planned_on_time in ((0.05, False), (0.0, True)):
        core = make_core(deadline_margin_frac=margin)
        core.on_instances(0.0, [record("a")])
        core.on_request(0.0, request("r0", 0.0, tokens=9000))  # a busy until 900
        # 15 ms of wait + 940 ms of prefill: 955 ms of r1's 1000 ms SLO (its prefill alone fits in the margin's 950)
        effects = core.on_request(885.0, request("r1", 885.0, tokens=9400))
        if is_planned_on_time:
            assert [(a.request_id, a.is_late) for a in assigns(effects)] == [("r1", False)]
        else:  # within the margin of its deadline: refused (the overload policy here is reject)
            assert [r.request_id for r in rejects(effects)] == ["r1"]


def test_an_oversized_request_is_served_late_not_refused():
    # 960 ms of prefill: more than the 950 ms a 1000 ms SLO leaves after the margin, so no instance could ever plan
    # it on time. Refusing it would refuse it on every retry: it is served, late, by the idle instance.
    core = make_core(overload=OverloadPolicy.REJECT)
    core.on_instances(0.0, [record("a")])
    effects = core.on_request(0.0, request("r0", 0.0, tokens=9600))
    assert not rejects(effects)
    assert [(a.request_id, a.instance_id, a.is_late) for a in assigns(effects)] == [("r0", "a", True)]
    # Under requeue, one far past all its relaxations (2.95 SLOs): 4 s of prefill on a 1 s SLO, also served late.
    core = make_core(overload=OverloadPolicy.REQUEUE)
    core.on_instances(0.0, [record("a")])
    effects = core.on_request(0.0, request("r1", 0.0, tokens=40_000))
    assert not rejects(effects)
    assert [(a.request_id, a.is_late) for a in assigns(effects)] == [("r1", True)]


def test_an_oversized_request_still_has_a_bounded_wait():
    # Its deadline moves out by its own prefill (4 s): behind 3 s of other work it waits, but no longer than a
    # request of no size would, its relaxed deadline less the margin: 2950 ms after arrival, then it is refused.
    core = make_core(overload=OverloadPolicy.REQUEUE, defers_rounds_until_near=False)
    core.on_instances(0.0, [record("a")])
    core.on_request(0.0, request("r0", 0.0, tokens=30_000, slo_ms=5000.0))  # a busy until 3000
    effects = core.on_request(1.0, request("r1", 1.0, tokens=40_000))
    assert not rejects(effects) and not assigns(effects)
    assert core.next_wakeup_ms() == pytest.approx(1951.0)  # relaxed once, to 2001, as any request would be
    (relaxed,) = [e for e in core.on_tick(1951.0) if isinstance(e, Relaxed)]
    assert relaxed.ttft_deadline_ms == pytest.approx(3001.0) and relaxed.num_relaxations == 2
    assert core.next_wakeup_ms() == pytest.approx(2951.0)
    (reject,) = rejects(core.on_tick(2951.0))
    assert reject.request_id == "r1" and reject.code == ErrorCode.OVERLOADED
    # The same wait with a free instance sooner: served late when r0 finishes before r1 turns hopeless.
    core = make_core(overload=OverloadPolicy.REQUEUE, defers_rounds_until_near=False)
    core.on_instances(0.0, [record("a")])
    core.on_request(0.0, request("r0", 0.0, tokens=20_000, slo_ms=5000.0))  # a busy until 2000
    core.on_request(1.0, request("r1", 1.0, tokens=40_000))
    core.on_prefill_done(2000.0, "a", "r0")
    late = [a for a in assigns(core.on_tick(2000.0))] or [a for a in assigns(core.on_tick(core.next_wakeup_ms()))]
    assert [(a.request_id, a.is_late) for a in late] == [("r1", True)]


def test_late_binding_holds_work_until_lookahead_before_the_instance_frees():
    core = make_core()
    core.on_instances(0.0, [record("a")])
    core.on_request(0.0, request("r0", 0.0, tokens=8000))
    assert not assigns(core.on_request(10.0, request("r1", 10.0, tokens=1000, slo_ms=2000.0)))
    assert core.queued_ids("m") == ["r1"]
    assert core.next_wakeup_ms() == pytest.approx(780.0)
    assert not assigns(core.on_tick(779.0))
    (assign,) = assigns(core.on_tick(780.0))
    assert assign.request_id == "r1"
    assert assign.expected_done_ms == pytest.approx(900.0)
    # the literal reading: every instance's plan is committed at once
    eager = make_core(is_late_binding=False)
    eager.on_instances(0.0, [record("a")])
    eager.on_request(0.0, request("r0", 0.0, tokens=8000))
    (assign,) = assigns(eager.on_request(10.0, request("r1", 10.0, tokens=1000, slo_ms=2000.0)))
    assert (assign.instance_id, assign.expected_done_ms) == ("a", pytest.approx(900.0))


def test_an_idle_instance_takes_planned_work_instead_of_idling():
    for is_work_conserving, expected in ((True, {"r1": "b"}), (False, {})):
        core = make_core(is_work_conserving=is_work_conserving)
        core.on_instances(0.0, [record("a"), record("b")])
        assert placed(core.on_request(0.0, request("r0", 0.0, tokens=8000))) == {"r0": "a"}
        # LST-IMH plans r1 on the busy, latest instance a (it still fits there before its deadline)
        assert placed(core.on_request(1.0, request("r1", 1.0, tokens=1000))) == expected


def test_prefill_completion_corrects_the_epdt():
    core = make_core()
    core.on_instances(0.0, [record("a")])
    core.on_request(0.0, request("r0", 0.0, tokens=8000))
    assert core.epdt_ms("a") == pytest.approx(800.0)
    core.on_prefill_done(650.0, "a", "r0")  # faster than predicted
    assert core.epdt_ms("a") == pytest.approx(650.0)
    assert core.outstanding("a") == []


def test_a_request_whose_instance_dies_before_its_first_token_goes_elsewhere():
    core = make_core()
    core.on_instances(0.0, [record("a"), record("b")])
    assert placed(core.on_request(0.0, request("r0", 0.0))) == {"r0": "a"}
    effects = core.on_instance_lost(10.0, "a")
    assert [e for e in effects if isinstance(e, Requeued)] == [Requeued("r0", "m", "a", 1)]
    (again,) = assigns(effects)
    assert (again.instance_id, again.attempt) == ("b", 1)
    assert core.outstanding("a") == []
    # the registry has not caught up yet: a stays out until a newer record says it is back
    core.on_instances(20.0, [record("a", updated_ms=5.0), record("b")])
    assert "a" not in placed(core.on_requests(20.0, [request(f"x{k}", 20.0, tokens=10) for k in range(5)]))
    core.on_instances(30.0, [record("a", updated_ms=25.0), record("b")])
    assert "a" in placed(core.on_request(30.0, request("y", 30.0, tokens=10))).values()


def test_assignments_unconfirmed_for_long_are_listed_per_worker_oldest_first():
    core = make_core(confirm_assignment_after_ms=5000.0)
    core.on_instances(0.0, [record("a"), record("b", model="other")])
    for rid, at_ms, model in (("r0", 0.0, "m"), ("o0", 500.0, "other"), ("r1", 1000.0, "m"), ("r2", 3000.0, "m")):
        assert len(assigns(core.on_request(at_ms, request(rid, at_ms, tokens=10, model=model)))) == 1
    assert core.unconfirmed(4999.0, max_num_per_worker=8) == {}
    assert core.unconfirmed(6000.0, max_num_per_worker=8) == {"w-a": [("r0", "a"), ("r1", "a")],
                                                               "w-b": [("o0", "b")]}
    core.on_prefill_done(6500.0, "a", "r0")  # confirmed after all
    assert core.unconfirmed(9000.0, max_num_per_worker=8)["w-a"] == [("r1", "a"), ("r2", "a")]
    assert core.unconfirmed(9000.0, max_num_per_worker=1)["w-a"] == [("r1", "a")]


def test_attempts_are_bounded():
    core = make_core(max_num_attempts=2)
    core.on_instances(0.0, [record("a"), record("b")])
    core.on_request(0.0, request("r0", 0.0))
    core.on_instance_lost(10.0, "a")
    # handed back by an instance that was not ready: an attempt used, no instance failure (not a poison request)
    (reject,) = rejects(core.on_prefill_done(20.0, "b", "r0", ok=False))
    assert reject.code == ErrorCode.INSTANCE_FAILED
    assert core.inflight_ids() == [] and core.queue_depth("m") == 0


def test_a_failed_prefill_is_retried():
    core = make_core()
    core.on_instances(0.0, [record("a")])
    core.on_request(0.0, request("r0", 0.0))
    effects = core.on_prefill_done(50.0, "a", "r0", ok=False)
    assert [type(e).__name__ for e in effects] == ["Requeued", "Assign"]
    assert assigns(effects)[0].attempt == 1


def test_failed_or_vanished_instances_in_the_snapshot_count_as_lost():
    core = make_core()
    core.on_instances(0.0, [record("a"), record("b"), record("c")])
    core.on_requests(0.0, [request("r0", 0.0, tokens=5000, slo_ms=5000.0),
                           request("r1", 0.0, tokens=5000, slo_ms=5000.0)])
    holders = {iid: core.outstanding(iid) for iid in "abc"}
    failed = next(iid for iid, ids in holders.items() if ids)
    rest = [iid for iid in "abc" if iid != failed]
    effects = core.on_instances(10.0, [record(failed, is_ready=False, state=ModelState.FAILED)] + [record(i) for i in rest])
    assert {e.request_id for e in effects if isinstance(e, Requeued)} == set(holders[failed])
    assert all(a.instance_id != failed for a in assigns(effects))
    gone = max(rest, key=lambda iid: len(core.outstanding(iid)))
    (kept,) = [iid for iid in rest if iid != gone]
    holding = set(core.outstanding(gone))
    assert holding
    effects = core.on_instances(20.0, [record(kept)])  # `gone` vanished while holding prefills
    assert {e.request_id for e in effects if isinstance(e, Requeued)} == holding
    # back in the queue: planned behind kept's work (late binding) or placed there at once
    assert set(placed(effects)) | set(core.queued_ids("m")) == holding
    assert set(placed(effects).values()) <= {kept}


def test_a_draining_instance_keeps_its_work_but_gets_no_more():
    core = make_core()
    core.on_instances(0.0, [record("a"), record("b")])
    core.on_request(0.0, request("r0", 0.0))
    effects = core.on_instances(5.0, [record("a", is_ready=False, state=ModelState.DRAINING), record("b")])
    assert effects == []
    assert core.outstanding("a") == ["r0"]
    assert placed(core.on_request(6.0, request("r1", 6.0))) == {"r1": "b"}
    core.on_prefill_done(90.0, "a", "r0")
    assert core.outstanding("a") == [] and core.inflight_ids() == ["r1"]


def test_cancel_forgets_the_request_wherever_it_is():
    core = make_core()
    core.on_instances(0.0, [record("a")])
    core.on_request(0.0, request("r0", 0.0, tokens=5000))
    core.on_request(1.0, request("r1", 1.0, tokens=1000))  # planned behind r0, still queued
    assert core.queued_ids("m") == ["r1"]
    assert core.on_cancel(2.0, "r1") == []
    assert core.queue_depth("m") == 0
    core.on_cancel(3.0, "r0")
    assert core.epdt_ms("a") == pytest.approx(3.0)
    assert core.on_prefill_done(500.0, "a", "r0") == []  # a stale report changes nothing
    assert not assigns(core.on_tick(480.0))


def test_a_redelivered_request_is_dispatched_once():
    core = make_core()
    core.on_instances(0.0, [record("a")])
    assert assigns(core.on_request(0.0, request("r0", 0.0)))
    assert core.on_request(1.0, request("r0", 0.0)) == []


def test_decode_goes_to_the_instance_with_the_least_backlog():
    core = make_core()
    core.on_instances(0.0, [record("p", role=InstanceRole.PREFILL), record("d0", role=InstanceRole.DECODE),
                            record("d1", role=InstanceRole.DECODE)])
    core.on_heartbeat(0.0, heartbeat(0.0, {"d0": 5, "d1": 1}))
    chosen = []
    for k in range(5):
        t = 100.0 * k
        (assign,) = assigns(core.on_request(t, request(f"r{k}", t, tokens=500)))
        assert assign.instance_id == "p"
        chosen.append(assign.decode_instance_id)
        core.on_prefill_done(t + 50.0, "p", f"r{k}")
    assert chosen == ["d1", "d1", "d1", "d1", "d0"]  # backlogs 1..4 against 5, then the tie goes by id
    core.on_heartbeat(600.0, heartbeat(600.0, {"d0": 6, "d1": 2}))  # d1 finished most of them
    (assign,) = assigns(core.on_request(700.0, request("r5", 700.0)))
    assert assign.decode_instance_id == "d1" and assign.decode_worker_id == "w-d1"


def test_colocated_instances_share_the_decoding_between_equally_free_ones():
    """Each prefill on a co-located instance stays there to decode. LST-IMH alone breaks ties between free
    instances by position, so every request whose instance was free went to the first one; the core now puts the
    least decode backlog (reported, plus what it sent since the report) first."""
    core = make_core()
    core.on_instances(0.0, [record("a"), record("b"), record("c")])
    chosen = []
    for k in range(6):  # one at a time, each done before the next comes: every instance is free at each arrival
        t = 1000.0 * k
        (assign,) = assigns(core.on_request(t, request(f"r{k}", t, tokens=500)))
        assert assign.decode_instance_id is None  # it decodes where it prefills
        chosen.append(assign.instance_id)
        core.on_prefill_done(t + 50.0, assign.instance_id, f"r{k}")
    assert chosen == ["a", "b", "c", "a", "b", "c"]
    # a heartbeat says a and b still decode theirs while c finished both: the next ones go to c first
    core.on_heartbeat(6000.0, heartbeat(6000.0, {"a": 2, "b": 2, "c": 0}, InstanceRole.COLOCATED))
    (assign,) = assigns(core.on_request(6500.0, request("r6", 6500.0, tokens=500)))
    assert assign.instance_id == "c"
    core.on_prefill_done(6550.0, "c", "r6")
    (assign,) = assigns(core.on_request(7000.0, request("r7", 7000.0, tokens=500)))
    assert assign.instance_id == "c"  # 1 sent since the report, against 2 on a and b


def test_a_finished_request_leaves_the_backlog_before_the_next_heartbeat():
    """Short requests: each finishes long before the next heartbeat. Counted as sent until a heartbeat confirmed
    them, one instance's finished requests piled up in its backlog, and a prefix holder past the decode gap lost
    its affinity (docs/dispatcher.md, "Prefix affinity"). The outcome takes a request sent since the last
    heartbeat out at once; one the heartbeat already counted stays until the next heartbeat says what is left."""
    core = make_core()
    core.on_instances(0.0, [record("a"), record("b")])
    core.on_heartbeat(0.0, heartbeat(0.0, {"a": 0, "b": 0}, InstanceRole.COLOCATED))
    for k in range(3):
        (assign,) = assigns(core.on_request(10.0 * k, request(f"r{k}", 10.0 * k, tokens=100, output_tokens=2)))
        core.on_prefill_done(10.0 * k + 5.0, assign.instance_id, f"r{k}")
    placed_on = {r: core._inflight.get(r) for r in ("r0", "r1", "r2")}
    assert placed_on == {"r0": None, "r1": None, "r2": None}  # past their first tokens: only the backlogs know them
    assert core._decode.backlog("a") + core._decode.backlog("b") == 3
    for k in range(3):
        core.on_request_outcome(50.0 + k, f"r{k}", "m", num_output_tokens=2, num_on_time_tokens=2)
    assert core._decode.backlog("a") == core._decode.backlog("b") == 0
    # a heartbeat that counted one running request keeps it until the next heartbeat
    (assign,) = assigns(core.on_request(100.0, request("r3", 100.0, tokens=100, output_tokens=2)))
    core.on_prefill_done(105.0, assign.instance_id, "r3")
    core.on_heartbeat(110.0, heartbeat(110.0, {assign.instance_id: 1}, InstanceRole.COLOCATED))
    core.on_request_outcome(120.0, "r3", "m", num_output_tokens=2, num_on_time_tokens=2)
    assert core._decode.backlog(assign.instance_id) == 1
    core.on_heartbeat(130.0, heartbeat(130.0, {assign.instance_id: 0}, InstanceRole.COLOCATED))
    assert core._decode.backlog(assign.instance_id) == 0


@pytest.mark.parametrize("algorithm", [Algorithm.LST_IMH, Algorithm.LEAST_LOAD])
def test_a_request_waits_for_an_instance_to_come_up_when_told_to(algorithm):
    core = make_core(max_wait_for_instance_ms=5000.0, algorithm=algorithm)
    core.on_instances(0.0, [record("b", is_ready=False, state=ModelState.WAKING)])
    assert core.on_request(0.0, request("r0", 0.0)) == []  # b is waking: wait for it
    assert core.queue_depth("m") == 1 and core.next_wakeup_ms() == pytest.approx(5000.0)
    assert core.on_tick(100.0) == []
    (assign,) = assigns(core.on_instances(200.0, [record("b")]))  # b is ready: r0 goes there, still on time
    assert (assign.request_id, assign.instance_id) == ("r0", "b")
    assert core.queue_depth("m") == 0


def test_by_default_a_request_waits_thirty_seconds_for_an_instance():
    # a worker silent for a moment (a bus failover), or a cold load, must not turn requests away
    core = make_core()
    core.on_instances(0.0, [])
    assert core.on_request(0.0, request("r0", 0.0)) == [] and core.next_wakeup_ms() == pytest.approx(30_000.0)
    assert core.on_tick(29_999.0) == []
    (reject,) = rejects(core.on_tick(30_000.0))
    assert reject.code == ErrorCode.NO_INSTANCE


@pytest.mark.parametrize("overload", [OverloadPolicy.REJECT, OverloadPolicy.REQUEUE])
def test_a_request_that_waited_for_the_first_instance_is_served_by_it_however_long_the_wait(overload):
    # A cold load takes longer than the SLO and every relaxation (1 + 2 SLOs): the request's own deadline is long
    # gone when the instance comes up idle. It waited for an instance, not for capacity, so the instance serves it
    # (it was refused as overloaded before); it counts as late, against its own deadline.
    core = make_core(overload=overload, max_wait_for_instance_ms=30_000.0, publish_period_ms=500.0)
    core.on_instances(0.0, [record("b", is_ready=False, state=ModelState.LOADING)])
    assert core.on_request(0.0, request("r0", 0.0, tokens=100, slo_ms=1000.0)) == []
    effects = core.on_instances(7000.0, [record("b", updated_ms=7000.0)])
    assert not rejects(effects)
    (assign,) = assigns(effects)
    assert (assign.request_id, assign.instance_id) == ("r0", "b")
    core.on_prefill_done(7020.0, "b", "r0", first_token_ms=7020.0)
    windows = [e.window for e in core.on_tick(7500.0) if hasattr(e, "window")]
    assert [w.ttft_attainment for w in windows] == [0.0]
    # a request arriving once the model has an instance keeps its own deadline: infeasible is refused as before
    if overload == OverloadPolicy.REJECT:
        assert placed(core.on_request(8000.0, request("r1", 8000.0, tokens=9000, slo_ms=1000.0))) == {"r1": "b"}
        (reject,) = rejects(core.on_request(8001.0, request("r2", 8001.0, tokens=9000, slo_ms=1000.0)))
        assert reject.code == ErrorCode.OVERLOADED


def test_a_request_stops_waiting_for_an_instance_after_the_limit():
    core = make_core(max_wait_for_instance_ms=5000.0)
    core.on_instances(0.0, [])  # nothing at all yet: the scaler starts one on seeing the load
    assert core.on_request(0.0, request("r0", 0.0)) == []
    assert core.on_request(1000.0, request("r1", 1000.0)) == []
    (reject,) = rejects(core.on_tick(5000.0))  # r0 waited 5 s; r1 waits on
    assert (reject.request_id, reject.code) == ("r0", ErrorCode.NO_INSTANCE)
    assert core.next_wakeup_ms() == pytest.approx(6000.0)
    (reject,) = rejects(core.on_tick(6000.0))
    assert (reject.request_id, reject.code) == ("r1", ErrorCode.NO_INSTANCE)
    assert core.queue_depth("m") == 0


def _published(effects) -> list:
    return [e.window for e in effects if isinstance(e, PublishLoad)]


def test_the_first_request_waiting_for_an_instance_publishes_the_window_at_once():
    # the scaler starts a model's first instance on seeing requests wait (ElasticScaler.wake); at the next publish
    # period (60 s here) it would have seen them that much later
    core = make_core(is_wake_published_at_once=True, max_wait_for_instance_ms=5000.0)
    core.on_instances(0.0, [])
    (window,) = _published(core.on_request(0.0, request("r0", 0.0)))
    assert (window.model, window.queue_depth, window.num_requests) == ("m", 1, 1)
    assert _published(core.on_request(100.0, request("r1", 100.0))) == []  # once per wait, not per request
    assert len(assigns(core.on_instances(200.0, [record("b")]))) == 2
    # b lost: what it ran waits again (or fails), and the first request to wait publishes again, once
    lost = core.on_instances(300.0, [])
    windows = _published(lost) + _published(core.on_request(400.0, request("r2", 400.0)))
    assert len(windows) == 1 and windows[0].queue_depth >= 1


def test_a_wait_that_ended_in_refusals_publishes_again_on_the_next_request():
    core = make_core(is_wake_published_at_once=True, max_wait_for_instance_ms=5000.0)
    core.on_instances(0.0, [])
    assert len(_published(core.on_request(0.0, request("r0", 0.0)))) == 1
    (reject,) = rejects(core.on_tick(5000.0))  # nobody started it: r0 refused, the queue empty
    assert reject.code == ErrorCode.NO_INSTANCE
    (window,) = _published(core.on_request(6000.0, request("r1", 6000.0)))
    assert window.queue_depth == 1


def test_without_the_knob_a_waiting_request_publishes_nothing_before_the_period():
    core = make_core(max_wait_for_instance_ms=5000.0)
    core.on_instances(0.0, [])
    assert core.on_request(0.0, request("r0", 0.0)) == []


def test_a_prefill_instance_without_a_decode_instance_cannot_serve():
    core = make_core(max_wait_for_instance_ms=0.0)
    core.on_instances(0.0, [record("p", role=InstanceRole.PREFILL), record("d", role=InstanceRole.DECODE,
                                                                           is_ready=False)])
    (reject,) = rejects(core.on_request(0.0, request("r0", 0.0)))
    assert reject.code == ErrorCode.NO_INSTANCE


def test_round_robin_cycles_and_never_rejects_for_load():
    core = make_core(algorithm=Algorithm.ROUND_ROBIN)
    core.on_instances(0.0, [record("a"), record("b"), record("c")])
    effects = core.on_requests(0.0, [request(f"r{k}", float(k), tokens=20_000) for k in range(6)])
    assert [a.instance_id for a in assigns(effects)] == ["a", "b", "c", "a", "b", "c"]
    assert not rejects(effects)


def test_least_load_picks_the_earliest_free_instance():
    core = make_core(algorithm=Algorithm.LEAST_LOAD)
    core.on_instances(0.0, [record("a"), record("b")])
    order = [placed(core.on_request(0.0, request(f"r{k}", 0.0, tokens=t)))[f"r{k}"]
             for k, t in enumerate([5000, 1000, 1000, 1000])]
    # a: 500 ms; b: 100, 200, 300 ms: b stays the earliest free for the next three
    assert order == ["a", "b", "b", "b"]
    assert placed(core.on_request(0.0, request("r9", 0.0, tokens=3000)))["r9"] == "b"  # b free at 300 < 500


def test_measured_prefill_throughput_drives_predictions():
    core = make_core()
    core.on_instances(0.0, [record("a", prefill_tokens_per_s=20_000.0)])
    (assign,) = assigns(core.on_request(0.0, request("r0", 0.0, tokens=1000)))
    assert assign.predicted_prefill_ms == pytest.approx(50.0)


def test_load_window_numbers():
    core = make_core(publish_period_ms=500.0, window_s=2.0)
    core.on_instances(0.0, [record("a")])
    core.on_request(0.0, request("r0", 0.0, tokens=1000, output_tokens=10))
    core.on_request(100.0, request("r1", 100.0, tokens=3000, output_tokens=30))
    assert core.next_wakeup_ms() == pytest.approx(500.0)
    (publish,) = [e for e in core.on_tick(500.0) if e.__class__.__name__ == "PublishLoad"]
    w = publish.window
    assert (w.model, w.num_requests, w.window_s) == ("m", 2, pytest.approx(0.5))
    assert w.request_rate_rps == pytest.approx(4.0)
    assert w.features.input_len_mean == pytest.approx(2000.0)
    assert w.features.input_len_var == pytest.approx(1_000_000.0)
    assert w.features.output_len_mean == pytest.approx(20.0) and w.features.output_len_var == pytest.approx(100.0)
    assert w.features.token_rate_tps == pytest.approx(4040.0 / 0.5)
    assert w.ttft_attainment is None  # no first token yet
    assert w.queue_depth == core.queue_depth("m")
    core.on_prefill_done(100.0 + 1.0, "a", "r0")
    core.on_prefill_done(1200.0, "a", "r1")  # its deadline was 1100
    windows = [e.window for e in core.on_tick(1300.0) if e.__class__.__name__ == "PublishLoad"]
    assert windows[-1].ttft_attainment == pytest.approx(0.5)
    later = [e.window for e in core.on_tick(3500.0) if e.__class__.__name__ == "PublishLoad"]
    assert later[-1].num_requests == 0 and later[-1].window_s == pytest.approx(2.0)  # slid past both


def test_generate_request_from_the_bus_is_accepted():
    core = make_core()
    core.on_instances(0.0, [record("a")])
    req = GenerateRequest(request_id="g1", model="m", prompt_token_ids=tuple(range(500)),
                          sampling=SamplingParams(max_tokens=16), arrival_unix_ms=0.0, ttft_deadline_unix_ms=800.0,
                          tpot_slo_ms=50.0, reply_subject="janus.reply.gw.g1")
    (assign,) = assigns(core.on_request(0.0, req))
    assert assign.request.source is req
    assert assign.request.expected_output_tokens == 16
    assert assign.predicted_prefill_ms == pytest.approx(50.0)


def test_one_monotone_clock_and_clear_errors():
    core = make_core()
    core.on_instances(100.0, [record("a")])
    (assign,) = assigns(core.on_request(50.0, request("r0", 50.0)))  # a step back is read as "still 100"
    assert assign.expected_done_ms == pytest.approx(200.0)
    with pytest.raises(ValueError, match="finite"):
        core.on_tick(float("nan"))
    with pytest.raises(ValueError, match="before arrival"):
        request("bad", 100.0, slo_ms=-1.0)
    with pytest.raises(TypeError, match="DispatchPolicy"):
        DispatcherCore({"algorithm": "lst_imh"}, ThroughputPrefillModel(TOKENS_PER_S))
    with pytest.raises(ValueError):
        DispatchPolicy(algorithm="fifo")
    with pytest.raises(TypeError, match="InstanceRecord"):
        core.on_instances(200.0, [{"instance_id": "x"}])

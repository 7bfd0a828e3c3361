"""The poison rule in the dispatcher core: a request whose instance failed under it on two instances is not
dispatched again (a 500 naming it); hand-backs of an instance that was not ready cost attempts, not failures; a
request that failed alone on its instance is forgotten, never re-dispatched."""
from __future__ import annotations

from contracts import ErrorCode, ModelState
from dispatcher.core import DispatcherCore, DispatchPolicy
from dispatcher.core.effects import Requeued
from dispatcher.core.policy import OverloadPolicy
from dispatcher.core.poison import MAX_NUM_INSTANCE_FAILURES, is_poison, note_instance_failure, poison_message
from dispatcher.core.prefill_time import ThroughputPrefillModel

from .helpers import assigns, record, rejects, request


def _core(**knobs) -> DispatcherCore:
    knobs.setdefault("publish_period_ms", 60_000.0)
    return DispatcherCore(DispatchPolicy(overload=OverloadPolicy.REJECT, **knobs), ThroughputPrefillModel(10_000.0))


def _holder(effects, request_id: str) -> str:
    (assign,) = [a for a in assigns(effects) if a.request_id == request_id]
    return assign.instance_id


def test_the_rule_counts_distinct_instances():
    failed_on = note_instance_failure((), "a")
    assert not is_poison(failed_on)
    assert note_instance_failure(failed_on, "a") == ("a",)  # the same instance twice is one failure
    failed_on = note_instance_failure(failed_on, "b")
    assert is_poison(failed_on) and len(failed_on) == MAX_NUM_INSTANCE_FAILURES == 2
    assert "r7" in poison_message("r7", failed_on) and "a, b" in poison_message("r7", failed_on)


def test_a_request_failing_on_two_instances_is_not_dispatched_again():
    core = _core(max_num_attempts=5)
    core.on_instances(0.0, [record("a"), record("b"), record("c")])
    first = _holder(core.on_request(0.0, request("poison", 0.0, tokens=10)), "poison")
    effects = core.on_prefill_done(10.0, first, "poison", ok=False, failure="instance_failed")
    assert [e.attempt for e in effects if isinstance(e, Requeued)] == [1]
    second = _holder(effects, "poison")
    assert second != first
    # a bystander on a third instance is untouched by all this
    bystander = core.on_request(15.0, request("ok", 15.0, tokens=10))
    effects = core.on_prefill_done(20.0, second, "poison", ok=False, failure="instance_failed")
    (reject,) = rejects(effects)
    assert reject.code == ErrorCode.POISON_REQUEST and not reject.retryable
    assert "poison" in reject.reason and first in reject.reason and second in reject.reason
    assert assigns(effects) == [] and "poison" not in core.inflight_ids() and core.queue_depth("m") == 0
    assert "ok" in core.inflight_ids() and assigns(bystander)
    # the gateway maps the code to a 500
    from gateway.core.errors import status_of

    assert status_of(reject.code) == 500


def test_registry_failures_and_worker_deaths_count_too():
    core = _core(max_num_attempts=5)
    core.on_instances(0.0, [record("a"), record("b"), record("c")])
    first = _holder(core.on_request(0.0, request("r", 0.0, tokens=10)), "r")
    rest = [i for i in "abc" if i != first]
    effects = core.on_instances(10.0, [record(first, is_ready=False, state=ModelState.FAILED)]
                                + [record(i) for i in rest])
    second = _holder(effects, "r")
    (reject,) = rejects(core.on_instance_lost(20.0, second))  # its worker fell silent: a death
    assert reject.code == ErrorCode.POISON_REQUEST


def test_an_instance_gone_from_the_registry_is_a_loss_not_a_failure():
    core = _core(max_num_attempts=5)
    core.on_instances(0.0, [record("a"), record("b"), record("c")])
    first = _holder(core.on_request(0.0, request("r", 0.0, tokens=10)), "r")
    rest = [i for i in "abc" if i != first]
    second = _holder(core.on_instances(10.0, [record(i) for i in rest]), "r")  # `first` vanished holding it
    effects = core.on_prefill_done(20.0, second, "r", ok=False, failure="instance_failed")
    assert rejects(effects) == [] and assigns(effects)  # one failure so far: dispatched again


def test_hand_backs_of_instances_that_were_not_ready_are_not_failures():
    core = _core(max_num_attempts=4)
    core.on_instances(0.0, [record("a"), record("b")])
    holder = _holder(core.on_request(0.0, request("r", 0.0, tokens=10)), "r")
    for k in range(1, 4):  # three hand-backs (failure="handed_back"): more than the poison rule's two
        effects = core.on_prefill_done(10.0 * k, holder, "r", ok=False)
        assert rejects(effects) == []
        holder = _holder(effects, "r")
    # the attempts still bound it: the fourth ends it as before, not as a poison request
    (reject,) = rejects(core.on_prefill_done(40.0, holder, "r", ok=False))
    assert reject.code == ErrorCode.INSTANCE_FAILED


def test_a_request_that_failed_alone_is_forgotten():
    core = _core()
    core.on_instances(0.0, [record("a")])
    core.on_request(0.0, request("bad", 0.0, tokens=10))
    effects = core.on_prefill_done(5.0, "a", "bad", ok=False, failure="request_failed")
    assert [e for e in effects if isinstance(e, (Requeued,))] == [] and assigns(effects) == []
    assert rejects(effects) == []  # its error already went to the client from the worker
    assert core.inflight_ids() == [] and core.queue_depth("m") == 0 and core.outstanding("a") == []

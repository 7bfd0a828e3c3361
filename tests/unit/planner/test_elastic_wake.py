"""`ElasticScaler.wake`: a model parked at zero whose requests wait at a dispatcher gets its first instance between
ticks, and nothing else in the plan moves (docs/planner.md, "Waking a model at once")."""
from __future__ import annotations

from planner_test_oracles import TableOracle, bare_elastic, window

from planner.core.elastic import ElasticScaler


def _pd(plan, model) -> tuple[int, int]:
    t = next(t for t in plan.targets if t.model == model)
    return t.num_prefill, t.num_decode


def _parked_and_busy(**knobs) -> ElasticScaler:
    """`a` busy, `b` parked (its last window saw nothing), one tick made."""
    scaler = ElasticScaler(TableOracle(), bare_elastic(**{"keepalive_s": 0.0, "is_woken_at_once": True, **knobs}))
    scaler.observe(window("a", 20.0, 0.0))
    scaler.observe(window("b", 0.0, 0.0))
    for now_ms in (0.0, 500.0):  # two agreeing plans: past the debounce
        plan = scaler.tick(now_ms, ["a", "b"], 100).plan
    assert _pd(plan, "b") == (0, 0) and sum(_pd(plan, "a")) >= 1
    return scaler


def _waiting(model: str, end_ms: float, depth: int = 2):
    return window(model, 0.0, end_ms).model_copy(update={"queue_depth": depth, "num_requests": depth})


def test_a_parked_model_with_requests_waiting_gets_one_colocated_instance_between_ticks():
    scaler = _parked_and_busy()
    last = scaler.tick(1_000.0, ["a", "b"], 100).plan
    woke = _waiting("b", 1_100.0)
    assert scaler.is_waking(woke)
    scaler.observe(woke)
    plan = scaler.wake(1_100.0, 100)
    assert plan is not None and plan.plan_id != last.plan_id and plan.created_unix_ms == 1_100.0
    assert _pd(plan, "b") == (1, 0) and "woken" in next(t for t in plan.targets if t.model == "b").reason
    assert _pd(plan, "a") == _pd(last, "a"), "nothing else moves"
    assert plan.num_devices_used == last.num_devices_used + 1
    assert not scaler.is_waking(woke), "woken once: the plan has its instance now"
    assert scaler.wake(1_200.0, 100) is None
    # the next tick keeps it (requests still queued) rather than parking it again
    assert sum(_pd(scaler.tick(1_500.0, ["a", "b"], 100).plan, "b")) >= 1


def test_no_wake_without_a_wait_or_without_room_or_with_the_knob_off():
    scaler = _parked_and_busy()
    scaler.tick(1_000.0, ["a", "b"], 100)
    assert not scaler.is_waking(window("b", 0.0, 1_100.0)), "no request waits"
    assert not scaler.is_waking(_waiting("a", 1_100.0)), "a has instances: the tick's business"
    assert not scaler.is_waking(_waiting("c", 1_100.0)), "not an elastic model of the last plan"
    scaler.observe(_waiting("b", 1_100.0))
    full = scaler.tick(1_200.0, ["a", "b"], 100).plan  # b's first instance by the tick's own rule
    assert _pd(full, "b") == (1, 0)
    off = _parked_and_busy(is_woken_at_once=False)
    off.tick(1_000.0, ["a", "b"], 100)
    off.observe(_waiting("b", 1_100.0))
    assert not off.is_waking(_waiting("b", 1_100.0)) and off.wake(1_100.0, 100) is None


def test_a_wake_stays_inside_the_budget():
    scaler = _parked_and_busy()
    last = scaler.tick(1_000.0, ["a", "b"], 100).plan
    scaler.observe(_waiting("b", 1_100.0))
    assert scaler.wake(1_100.0, last.num_devices_used) is None, "no device left for it: the next tick decides"
    assert scaler.wake(1_100.0, last.num_devices_used + 1) is not None


def test_a_wake_confirms_no_change_the_debounce_holds():
    scaler = _parked_and_busy()
    before = scaler.tick(1_000.0, ["a", "b"], 100).plan
    scaler.observe(window("a", 40.0, 1_400.0))  # a doubles: one plan wants more, the debounce holds it
    held = scaler.tick(1_500.0, ["a", "b"], 100)
    assert "a" in held.held_models and _pd(held.plan, "a") == _pd(before, "a")
    scaler.observe(_waiting("b", 1_600.0))
    woke = scaler.wake(1_600.0, 100)
    assert woke is not None and _pd(woke, "a") == _pd(before, "a"), "a's rise still waits for a second tick"

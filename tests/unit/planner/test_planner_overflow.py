"""A steady model whose requests queue up gets an early steady plan (planner.core.overflow)."""
from planner_test_oracles import window

from planner.core import OverflowWatch, SteadyPolicy


def _queued(model: str, depth: int, end_ms: float, dispatcher: str = "d0"):
    return window(model, 1.0, end_ms).model_copy(update={"queue_depth": depth, "dispatcher_id": dispatcher})


def test_queued_windows_in_a_row_make_a_steady_model_overflow():
    watch = OverflowWatch(SteadyPolicy(overflow_queue_depth=2, overflow_num_windows=3))
    for i, depth in enumerate([2, 5, 1, 3, 2, 4]):  # the 1 breaks the run: only the last three count
        watch.observe(_queued("small", depth, 500.0 * i))
        watch.observe(_queued("quiet", 0, 500.0 * i))
    assert watch.overflowing(["small", "quiet"]) == ["small"]
    assert watch.overflowing(["quiet"]) == []  # an elastic model's queue is the scaler's business
    assert watch.due(3000.0, ["small", "quiet"]) == ["small"]


def test_early_plans_are_spaced_and_a_trigger_starts_the_count_again():
    watch = OverflowWatch(SteadyPolicy(overflow_num_windows=2, overflow_min_interval_s=5.0))
    for t in (0.0, 500.0):
        watch.observe(_queued("a", 1, t))
    assert watch.due(500.0, ["a"]) == ["a"]
    for t in (1000.0, 1500.0):
        watch.observe(_queued("a", 1, t))
    assert watch.due(1500.0, ["a"]) == []  # within 5 s of the last early plan
    assert watch.due(5600.0, ["a"]) == ["a"]
    assert watch.due(11_000.0, ["a"]) == []  # the trigger reset its count: no new queued windows since


def test_a_short_run_of_queued_windows_is_not_an_overflow():
    watch = OverflowWatch(SteadyPolicy(overflow_queue_depth=2, overflow_num_windows=3))
    for i, depth in enumerate([2, 5, 1, 3, 2]):
        watch.observe(_queued("small", depth, 500.0 * i))
    assert watch.due(3000.0, ["small"]) == []


def test_zero_depth_turns_the_watch_off():
    watch = OverflowWatch(SteadyPolicy(overflow_queue_depth=0))
    for t in range(10):
        watch.observe(_queued("a", 7, 500.0 * t))
    assert not watch.is_enabled and watch.due(10_000.0, ["a"]) == []


def test_each_dispatchers_windows_count_on_their_own():
    watch = OverflowWatch(SteadyPolicy(overflow_num_windows=3))
    for i in range(3):  # two dispatchers interleave: one queues, the other does not
        watch.observe(_queued("a", 2, 500.0 * i, dispatcher="d0"))
        watch.observe(_queued("a", 0, 500.0 * i, dispatcher="d1"))
    assert watch.due(1500.0, ["a"]) == ["a"]


def test_a_model_that_starts_to_overflow_is_not_kept_waiting_by_anothers_interval():
    watch = OverflowWatch(SteadyPolicy(overflow_num_windows=2, overflow_min_interval_s=15.0, overflow_min_gap_s=2.0))
    for t in (0.0, 500.0):
        watch.observe(_queued("a", 1, t))
    assert watch.due(500.0, ["a", "b"]) == ["a"]
    for t in (1000.0, 1500.0, 2000.0, 2500.0):
        watch.observe(_queued("a", 1, t))
        watch.observe(_queued("b", 1, t))
    assert watch.due(2000.0, ["a", "b"]) == [], "two early plans at least 2 s apart"
    assert watch.due(2500.0, ["a", "b"]) == ["b"], "b's burst is planned at once; a waits out its own interval"
    for t in (3000.0, 3500.0):
        watch.observe(_queued("a", 1, t))
    assert watch.due(5000.0, ["a", "b"]) == []
    assert watch.due(15_500.0, ["a", "b"]) == ["a"]


def _plan_for(rates_tps: dict[str, float]):
    from contracts import SteadyPlan

    loads = tuple(window(m, 1.0, 0.0).model_copy(update={"features": window(m, 1.0, 0.0).features.model_copy(
        update={"token_rate_tps": tps})}) for m, tps in rates_tps.items())
    return SteadyPlan(plan_id="s1", created_unix_ms=0.0, trigger="periodic", steady_models=tuple(rates_tps),
                      elastic_models=(), bins=(), loads=loads)


def _at_rate(model: str, tps: float, end_ms: float):
    w = window(model, 1.0, end_ms)
    return w.model_copy(update={"features": w.features.model_copy(update={"token_rate_tps": tps})})


def test_a_burst_far_above_the_planned_rate_overflows_before_any_queue():
    # an idle app's burst on a shared device: admitted into the batch (no queue at the dispatchers), TPOT missed
    policy = SteadyPolicy(overflow_num_windows=3, overflow_rate_factor=4.0, overflow_min_rate_tps=1000.0)
    watch = OverflowWatch(policy)
    watch.planned(_plan_for({"idle": 0.0, "busy": 5000.0}))
    for i, tps in enumerate([3000.0, 4500.0, 8000.0, 12_000.0]):  # 3000 < 4 x the 1000 floor: not yet
        watch.observe(_at_rate("idle", tps, 500.0 * i))
        watch.observe(_at_rate("busy", 12_000.0, 500.0 * i))  # 2.4x its planned 5000: a rise, not a surge
    assert watch.overflowing(["idle", "busy"]) == ["idle"]
    off = OverflowWatch(policy.model_copy(update={"overflow_rate_factor": 0.0}))
    off.planned(_plan_for({"idle": 0.0}))
    for i in range(4):
        off.observe(_at_rate("idle", 12_000.0, 500.0 * i))
    assert off.overflowing(["idle"]) == [], "factor 0: queues only"


def test_a_new_plan_that_saw_the_burst_ends_the_surge():
    watch = OverflowWatch(SteadyPolicy(overflow_num_windows=2))
    watch.planned(_plan_for({"m": 0.0}))
    for i in range(2):
        watch.observe(_at_rate("m", 10_000.0, 500.0 * i))
    assert watch.due(1_000.0, ["m"]) == ["m"]
    watch.planned(_plan_for({"m": 10_000.0}))  # the early plan sized it for the burst
    for i in range(2, 6):
        watch.observe(_at_rate("m", 10_000.0, 500.0 * i))
    assert watch.overflowing(["m"]) == []

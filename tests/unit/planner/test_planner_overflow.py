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

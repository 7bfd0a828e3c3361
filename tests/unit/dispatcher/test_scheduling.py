"""Moore-Hodgson and LST-IMH against brute force on small cases (hypothesis)."""
from __future__ import annotations

from functools import lru_cache
from itertools import combinations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.core.scheduling import FEASIBILITY_EPS_MS, lst_imh, moore_hodgson


def is_feasible(start_ms: float, proc_ms: list[float], due_ms: list[float], jobs) -> bool:
    """Earliest deadline first from start_ms meets every deadline (EDF is optimal for feasibility on one machine)."""
    t = start_ms
    for j in sorted(jobs, key=lambda j: (due_ms[j], j)):
        t += proc_ms[j]
        if t > due_ms[j] + FEASIBILITY_EPS_MS:
            return False
    return True


def best_on_one_machine(proc_ms, due_ms, start_ms=0.0) -> int:
    n = len(proc_ms)
    for size in range(n, 0, -1):
        if any(is_feasible(start_ms, proc_ms, due_ms, c) for c in combinations(range(n), size)):
            return size
    return 0


def best_on_machines(available_ms, proc_ms, due_ms) -> int:
    """Most requests finished on time over all assignments (subset DP over machines)."""
    num_machines, n = len(available_ms), len(due_ms)
    feasible = [
        [is_feasible(available_ms[i], list(proc_ms[i]), due_ms, [j for j in range(n) if mask >> j & 1])
         for mask in range(1 << n)]
        for i in range(num_machines)
    ]

    @lru_cache(maxsize=None)
    def best(i: int, free: int) -> int:
        if i == num_machines:
            return 0
        result = best(i + 1, free)
        sub = free
        while sub:
            if feasible[i][sub]:
                result = max(result, bin(sub).count("1") + best(i + 1, free & ~sub))
            sub = (sub - 1) & free
        return result

    return best(0, (1 << n) - 1)


jobs_strategy = st.lists(st.tuples(st.integers(1, 40), st.integers(0, 120)), min_size=0, max_size=9)


@given(jobs=jobs_strategy, start=st.integers(0, 30))
@settings(max_examples=200, deadline=None)
def test_moore_hodgson_keeps_a_maximum_on_time_set(jobs, start):
    proc = [float(p) for p, _ in jobs]
    due = [float(d) for _, d in jobs]
    kept = moore_hodgson(proc, due, start_ms=float(start))
    assert len(set(kept)) == len(kept)
    assert is_feasible(float(start), proc, due, kept)
    assert len(kept) == best_on_one_machine(proc, due, float(start))
    # the machine runs them earliest deadline first
    assert [due[j] for j in kept] == sorted(due[j] for j in kept)


@given(jobs=st.lists(st.tuples(st.floats(0.01, 50.0), st.floats(0.0, 150.0)), max_size=8))
@settings(max_examples=200, deadline=None)
def test_moore_hodgson_on_fractional_times(jobs):
    proc = [p for p, _ in jobs]
    due = [d for _, d in jobs]
    kept = moore_hodgson(proc, due)
    assert is_feasible(0.0, proc, due, kept)
    assert len(kept) == best_on_one_machine(proc, due)


def test_moore_hodgson_drops_the_longest_not_the_latest():
    # Three jobs fit only without the long one, although it has the earliest deadline.
    kept = moore_hodgson([50.0, 10.0, 10.0], [55.0, 20.0, 30.0])
    assert sorted(kept) == [1, 2]


def test_moore_hodgson_rejects_bad_input():
    with pytest.raises(ValueError, match="one deadline per job"):
        moore_hodgson([1.0, 2.0], [3.0])
    with pytest.raises(ValueError, match=">= 0"):
        moore_hodgson([-1.0], [3.0])


machines_strategy = st.integers(1, 3).flatmap(
    lambda m: st.tuples(
        st.lists(st.integers(0, 40), min_size=m, max_size=m),  # T_i
        st.integers(0, 7).flatmap(
            lambda n: st.tuples(
                st.lists(st.lists(st.integers(1, 40), min_size=n, max_size=n), min_size=m, max_size=m),  # p_ij
                st.lists(st.integers(0, 120), min_size=n, max_size=n),  # d_j
            )
        ),
    )
)


@given(case=machines_strategy)
@settings(max_examples=150, deadline=None)
def test_lst_imh_completes_at_least_half_the_optimum(case):
    available, (proc_rows, due) = case
    available = [float(t) for t in available]
    due = [float(d) for d in due]
    proc = np.array(proc_rows, dtype=np.float64).reshape(len(available), len(due))
    plan = lst_imh(available, proc, due)
    placed = [j for subset in plan.assigned for j in subset]
    # a partition of the requests: each placed once or left over
    assert sorted(placed + list(plan.unassigned)) == list(range(len(due)))
    for i, subset in enumerate(plan.assigned):
        assert is_feasible(available[i], list(proc[i]), due, subset)
        assert [due[j] for j in subset] == sorted(due[j] for j in subset)
    assert 2 * len(placed) >= best_on_machines(available, proc, due)


@given(case=machines_strategy)
@settings(max_examples=80, deadline=None)
def test_lst_imh_latest_instance_gets_a_maximum_set(case):
    """The latest-available instance chooses first, from everything: its subset is a maximum on-time set."""
    available, (proc_rows, due) = case
    available = [float(t) for t in available]
    due = [float(d) for d in due]
    proc = np.array(proc_rows, dtype=np.float64).reshape(len(available), len(due))
    plan = lst_imh(available, proc, due)
    latest = max(range(len(available)), key=lambda i: (available[i], -i))
    assert len(plan.assigned[latest]) == best_on_one_machine(list(proc[latest]), due, available[latest])


def test_lst_imh_leaves_early_instances_for_tight_deadlines():
    # Instance 0 is free now, instance 1 at 50. The loose request goes to the late instance so that the tight one
    # still fits on the early instance; an earliest-free-first greedy would place the loose one first and miss.
    plan = lst_imh([0.0, 50.0], np.array([[40.0, 40.0], [40.0, 40.0]]), [45.0, 200.0])
    assert plan.assigned == ((0,), (1,))
    assert plan.unassigned == ()


def test_lst_imh_same_clock_rejects_what_cannot_finish():
    # Absolute times: a deadline already behind every instance's availability is never placed.
    plan = lst_imh([1_000_000.0], np.array([[10.0, 10.0]]), [999_990.0, 1_000_020.0])
    assert plan.assigned == ((1,),)
    assert plan.unassigned == (0,)


def test_lst_imh_rejects_bad_times():
    with pytest.raises(ValueError, match="finite"):
        lst_imh([0.0], np.array([[np.nan]]), [1.0])

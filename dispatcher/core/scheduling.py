"""Moore-Hodgson and LST-IMH as pure functions over plain numbers (docs/dispatcher.md, "How a round works").

All times are absolute milliseconds on one clock: an instance's availability T_i, a request's deadline d_j and
the predicted prefill time p_ij. Request j can be finished on time by instance i when T_i + (work queued before it)
+ p_ij <= d_j; so Moore-Hodgson runs on the deadlines shifted by T_i.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

# Absolute tolerance on "finishes by its deadline": sums of float milliseconds must not flip a tie.
FEASIBILITY_EPS_MS = 1e-9


def _moore_hodgson_pass(proc_ms: list[float], due_ms: list[float], start_ms: float, is_taken: bytearray) -> list[int]:
    """Moore-Hodgson on one machine free from start_ms, over the jobs not yet taken, already in deadline order.
    Returns the kept positions in order. One plain loop: this is the hot path of every LST-IMH round.

    Add jobs one at a time; when the running total passes the current job's deadline, drop the longest job so far
    (this one, if nothing kept is longer). A job that cannot finish even alone is dropped by that same rule.
    """
    heap: list[tuple[float, int]] = []  # (-processing time, position): a max-heap on processing time
    total_ms = 0.0
    shift_ms = start_ms - FEASIBILITY_EPS_MS
    push, replace = heapq.heappush, heapq.heapreplace
    for k in range(len(proc_ms)):
        if is_taken[k]:
            continue
        p = proc_ms[k]
        with_k_ms = total_ms + p
        if with_k_ms <= due_ms[k] - shift_ms:
            push(heap, (-p, k))
            total_ms = with_k_ms
        elif heap and p < -heap[0][0]:
            total_ms = with_k_ms + replace(heap, (-p, k))[0]
    return sorted(k for _, k in heap)


def moore_hodgson(proc_ms: Sequence[float], due_ms: Sequence[float], start_ms: float = 0.0) -> list[int]:
    """A maximum set of jobs that one machine, free from `start_ms`, finishes by their deadlines.

    Returns indices into the inputs, in the order the machine should run them (earliest deadline first, ties by
    index). Jobs are kept or dropped whole; a job longer than its own slack is never kept.
    """
    if len(proc_ms) != len(due_ms):
        raise ValueError(f"one deadline per job: {len(proc_ms)} processing times, {len(due_ms)} deadlines")
    if any(p < 0 for p in proc_ms):
        raise ValueError("processing times must be >= 0")
    order = sorted(range(len(due_ms)), key=lambda j: (due_ms[j], j))
    kept = _moore_hodgson_pass(
        [float(proc_ms[j]) for j in order], [float(due_ms[j]) for j in order], start_ms, bytearray(len(order))
    )
    return [order[k] for k in kept]


@dataclass(frozen=True)
class LstImhPlan:
    """Per instance (same order as the inputs) the requests it should run, in order; and what no instance can
    finish on time."""

    assigned: tuple[tuple[int, ...], ...]
    unassigned: tuple[int, ...]


def lst_imh(available_ms: Sequence[float], proc_ms: np.ndarray, due_ms: Sequence[float]) -> LstImhPlan:
    """Latest-Start-Time Iterated Moore-Hodgson.

    available_ms[i]: when instance i is free (T_i, absolute). proc_ms[i, j]: predicted prefill of request j on
    instance i. due_ms[j]: request j's deadline (absolute). Instances are taken from the latest T_i to the earliest;
    each takes the Moore-Hodgson set of the requests still left with deadlines shifted by its T_i; what it drops
    goes on to the next. Completes at least half as many requests on time as the best assignment.
    """
    num_instances = len(available_ms)
    num_requests = len(due_ms)
    proc = np.asarray(proc_ms, dtype=np.float64).reshape(num_instances, num_requests)
    return lst_imh_rows(available_ms, shared_rows(proc), [float(d) for d in due_ms])


def shared_rows(proc_ms: np.ndarray) -> list[list[float]]:
    """A p_ij matrix as one list per instance, equal rows being one shared list (alike instances, the common case:
    `lst_imh_rows` then sorts that row once)."""
    rows: list[list[float]] = []
    for row in proc_ms.tolist():
        rows.append(rows[-1] if rows and rows[-1] == row else row)
    return rows


def check_rows(rows: Sequence[list[float]]) -> None:
    """Predicted prefill times must be finite and >= 0 (each shared row is checked once)."""
    for row in {id(row): row for row in rows}.values():
        # a sum is NaN with any NaN in the row, inf with any inf; the min catches negatives
        if row and not (sum(row) < math.inf and min(row) >= 0):
            raise ValueError("predicted prefill times must be finite and >= 0")


def lst_imh_rows(available_ms: Sequence[float], rows: Sequence[list[float]], due_ms: list[float]) -> LstImhPlan:
    """`lst_imh` with p_ij as rows[i][j], plain floats; alike instances may share one list. Plain lists, not numpy:
    a round's queue is tens of requests, where numpy's per-call cost is most of the work, and this runs on every
    arrival and on every instance coming near free."""
    num_instances = len(available_ms)
    num_requests = len(due_ms)
    if num_requests == 0:
        return LstImhPlan(assigned=((),) * num_instances, unassigned=())
    check_rows(rows)
    order = sorted(range(num_requests), key=due_ms.__getitem__)  # stable: equal deadlines stay in input order
    due_sorted = [due_ms[j] for j in order]
    is_taken = bytearray(num_requests)
    assigned: list[tuple[int, ...]] = [()] * num_instances
    num_left = num_requests
    row: list[float] | None = None
    row_sorted: list[float] = []
    # Latest available first; ties by input index so the plan is deterministic (a stable sort keeps equal keys in
    # input order, reverse=True included).
    for i in sorted(range(num_instances), key=available_ms.__getitem__, reverse=True):
        if num_left == 0:
            break
        if rows[i] is not row:
            row = rows[i]
            row_sorted = [row[j] for j in order]
        kept = _moore_hodgson_pass(row_sorted, due_sorted, float(available_ms[i]), is_taken)
        for k in kept:
            is_taken[k] = 1
        num_left -= len(kept)
        assigned[i] = tuple([order[k] for k in kept])
    unassigned = tuple([order[k] for k in range(num_requests) if not is_taken[k]])
    return LstImhPlan(assigned=tuple(assigned), unassigned=unassigned)

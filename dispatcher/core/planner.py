"""One LST-IMH round over a model's global queue: which queued requests go where now, which are rejected or
relaxed (DESIGN.md section 3). Pure: jobs, instance availabilities and predicted times in, decisions out.

Planning. First the requests that can still be on time: LST-IMH over every routable instance, against deadlines
moved in by a safety margin (deadline_margin_frac of the TTFT SLO, for prediction error). What no instance can finish
in time meets the overload policy: rejected at once, or relaxed (requeue) and so late. Then the late requests, on the
time the first pass left over, so late work never displaces a request that can still be on time.

Committing (late binding). Only instances within lookahead_ms of free get work now; everything else stays queued and
is planned again on the next round, with the EPDTs corrected by the completions in between. A near-free instance
gets its whole on-time subset. With is_work_conserving, one that LST-IMH left empty takes the most urgent on-time
request planned on a later instance (moving it earlier only adds slack there) rather than idle; and late requests
are served only by instances that would otherwise idle, one at a time.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import inf

import numpy as np

from .jobs import Job
from .policy import DispatchPolicy, OverloadPolicy
from .scheduling import FEASIBILITY_EPS_MS, LstImhPlan, lst_imh


@dataclass
class RoundDecision:
    """commits: (instance index, job index, predicted prefill ms) in the order to assign them.
    rejected: job indices to fail with OVERLOADED. relaxed: job index -> (new deadline ms, num relaxations).
    hopeless_at_ms: job index -> when a queued late job turns hopeless (a wakeup time)."""

    commits: list[tuple[int, int, float]] = field(default_factory=list)
    rejected: list[int] = field(default_factory=list)
    relaxed: dict[int, tuple[float, int]] = field(default_factory=dict)
    hopeless_at_ms: dict[int, float] = field(default_factory=dict)


def _relax(job: Job, deadline_ms: float, num_relaxations: int, policy: DispatchPolicy) -> tuple[float, int] | None:
    step_ms = policy.relaxation_factor * job.request.ttft_slo_ms
    if policy.overload != OverloadPolicy.REQUEUE or step_ms <= 0 or num_relaxations >= policy.max_num_relaxations:
        return None
    return deadline_ms + step_ms, num_relaxations + 1


def _edf_donors(plan: tuple[tuple[int, ...], ...], index: list[int], far: list[int], due: np.ndarray) -> list[int]:
    """Jobs planned on not-yet-free instances, most urgent first."""
    jobs = [index[p] for i in far for p in plan[i]]
    return sorted(jobs, key=lambda k: (due[k], k))  # (due, index): deterministic among equal deadlines


def _take_feasible(donors: list[int], start_ms: float, proc_row: np.ndarray, due: np.ndarray) -> int | None:
    for pos, k in enumerate(donors):
        if start_ms + proc_row[k] <= due[k] + FEASIBILITY_EPS_MS:
            del donors[pos]
            return k
    return None


def plan_round(
    now_ms: float,
    jobs: list[Job],
    available_ms: list[float],
    proc_ms: np.ndarray,
    policy: DispatchPolicy,
) -> RoundDecision:
    """available_ms[i]: T_i of routable instance i (>= now_ms). proc_ms[i, k]: predicted prefill of jobs[k] on i."""
    if len(jobs) == 1 and not jobs[0].is_late:
        decision = _plan_lone_on_time_job(now_ms, jobs[0], available_ms, proc_ms, policy)
        if decision is not None:
            return decision
    return plan_round_general(now_ms, jobs, available_ms, proc_ms, policy)


def plan_round_general(now_ms: float, jobs: list[Job], available_ms: list[float], proc_ms: np.ndarray,
                       policy: DispatchPolicy) -> RoundDecision:
    """`plan_round` for any queue (the lone-job shortcut's reference)."""
    decision = RoundDecision()
    num_instances = len(available_ms)
    deadline = np.array([job.deadline_ms for job in jobs], dtype=np.float64)
    margin_ms = policy.deadline_margin_frac * np.array([job.request.ttft_slo_ms for job in jobs], dtype=np.float64)
    num_relax = [job.num_relaxations for job in jobs]
    on_time = [k for k, job in enumerate(jobs) if not job.is_late]
    late = [k for k, job in enumerate(jobs) if job.is_late]

    plan_on_time = lst_imh(available_ms, proc_ms[:, on_time], (deadline - margin_ms)[on_time])
    planned_ms = np.zeros(num_instances)
    for i, picked in enumerate(plan_on_time.assigned):
        if picked:
            planned_ms[i] = proc_ms[i, [on_time[p] for p in picked]].sum()
    for p in plan_on_time.unassigned:
        k = on_time[p]
        relaxed = _relax(jobs[k], deadline[k], num_relax[k], policy)
        if relaxed is None:
            decision.rejected.append(k)
            continue
        deadline[k], num_relax[k] = relaxed
        decision.relaxed[k] = relaxed
        late.append(k)

    due = deadline - margin_ms
    if late:
        plan_late = lst_imh(list(np.asarray(available_ms) + planned_ms), proc_ms[:, late], due[late])
    else:  # the usual round: nothing late, and the instances' availabilities need not be shifted
        plan_late = LstImhPlan(assigned=((),) * num_instances, unassigned=())
    fastest_ms = proc_ms.min(axis=0)
    for p in plan_late.unassigned:
        k = late[p]
        # Not placed this round, but it may be on a later one until even a free instance cannot make it.
        # Hopeless from the moment even a free instance would only just make it (>=: a wakeup at exactly
        # hopeless_at_ms must resolve the request, not find it still pending).
        while now_ms + fastest_ms[k] >= due[k]:
            relaxed = _relax(jobs[k], deadline[k], num_relax[k], policy)
            if relaxed is None:
                break
            deadline[k], num_relax[k] = relaxed
            due[k] = deadline[k] - margin_ms[k]
            decision.relaxed[k] = relaxed
        if now_ms + fastest_ms[k] >= due[k]:
            decision.rejected.append(k)
            decision.relaxed.pop(k, None)
    rejected = set(decision.rejected)
    for k in late:
        if k not in rejected:
            decision.hopeless_at_ms[k] = float(due[k] - fastest_ms[k])

    horizon_ms = now_ms + policy.lookahead_ms if policy.is_late_binding else float("inf")
    near = sorted((i for i in range(num_instances) if available_ms[i] <= horizon_ms), key=lambda i: (available_ms[i], i))
    far = [i for i in range(num_instances) if available_ms[i] > horizon_ms]
    on_time_donors: list[int] | None = None  # built only when a near-free instance has nothing planned
    late_donors: list[int] | None = None
    for i in near:
        if plan_on_time.assigned[i]:
            decision.commits.extend((i, on_time[p], float(proc_ms[i, on_time[p]])) for p in plan_on_time.assigned[i])
            continue
        k = None
        if policy.is_work_conserving:
            if on_time_donors is None:
                on_time_donors = _edf_donors(plan_on_time.assigned, on_time, far, due)
            k = _take_feasible(on_time_donors, available_ms[i], proc_ms[i], due)
        if k is None and plan_late.assigned[i]:
            k = late[plan_late.assigned[i][0]]
        if k is None and policy.is_work_conserving:
            if late_donors is None:
                late_donors = _edf_donors(plan_late.assigned, late, far, due)
            k = _take_feasible(late_donors, available_ms[i], proc_ms[i], due)
        if k is not None:
            decision.commits.append((i, k, float(proc_ms[i, k])))
    return decision


def _plan_lone_on_time_job(now_ms: float, job: Job, available_ms: list[float], proc_ms: np.ndarray,
                           policy: DispatchPolicy) -> RoundDecision | None:
    """The usual round of a lightly loaded model: one queued request, still on time. The same decision as the
    general path (LST-IMH over one job: the latest-free instance that makes the deadline takes it; then late
    binding and work conservation), without building its arrays. None when no instance makes the deadline: the
    general path relaxes or rejects."""
    due_ms = job.deadline_ms - policy.deadline_margin_frac * job.request.ttft_slo_ms
    column = proc_ms[:, 0].tolist()
    # One pass each, no sorting (rounds of models with hundreds of instances run on every arrival):
    # chosen = the latest-free instance that passes Moore-Hodgson's test for one job (ties: the lowest index).
    chosen = None
    chosen_ms = -inf
    for i, available in enumerate(available_ms):
        if available > chosen_ms and column[i] <= due_ms - (available - FEASIBILITY_EPS_MS):
            chosen, chosen_ms = i, available
    if chosen is None:
        return None
    decision = RoundDecision()
    horizon_ms = now_ms + policy.lookahead_ms if policy.is_late_binding else inf
    if chosen_ms <= horizon_ms:
        decision.commits.append((chosen, 0, float(column[chosen])))  # near free: it takes the job now
    elif policy.is_work_conserving:
        # A near-free instance would plan nothing this round: the earliest-free one (ties: the lowest index) that
        # makes the deadline takes the job from the far one.
        taker = None
        for i, available in enumerate(available_ms):
            if (available <= horizon_ms and available + column[i] <= due_ms + FEASIBILITY_EPS_MS
                    and (taker is None or available < available_ms[taker])):
                taker = i
        if taker is not None:
            decision.commits.append((taker, 0, float(column[taker])))
    return decision

"""One LST-IMH round over a model's global queue: which queued requests go where now, which are rejected or
relaxed (docs/dispatcher.md, "How a round works"). Pure: jobs, instance availabilities and predicted times in,
decisions out.

Planning. First the requests that can still be on time: LST-IMH over every routable instance, against deadlines
moved in by a safety margin (deadline_margin_frac of the TTFT SLO, for prediction error). What no instance can finish
in time meets the overload policy: rejected at once, or relaxed (requeue) and so late. Then the late requests, on the
time the first pass left over, so late work never displaces a request that can still be on time.

Oversized requests. A request whose predicted prefill alone, on the fastest instance, is longer than all the wait its
SLO and relaxations allow could not be on time even on an idle instance: refusing it would refuse it on every retry.
It is served late instead, its deadline counted from when its prefill could at best be done (moved out by that
prefill); it is refused only if it still waits past that, as any late request is.

Committing (late binding). Only instances within lookahead_ms of free get work now; everything else stays queued and
is planned again on the next round, with the EPDTs corrected by the completions in between. A near-free instance
gets its whole on-time subset. With is_work_conserving, one that LST-IMH left empty takes the most urgent on-time
request planned on a later instance (moving it earlier only adds slack there) rather than idle; and late requests
are served only by instances that would otherwise idle, one at a time.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import inf
from typing import Sequence

import numpy as np

from .jobs import Job
from .policy import DispatchPolicy, OverloadPolicy
from .scheduling import FEASIBILITY_EPS_MS, LstImhPlan, lst_imh_rows, shared_rows


@dataclass
class RoundDecision:
    """commits: (instance index, job index, predicted prefill ms) in the order to assign them.
    rejected: job indices to fail with OVERLOADED. relaxed: job index -> (new deadline ms, num relaxations).
    hopeless_at_ms: job index -> when a queued late job turns hopeless (a wakeup time)."""

    commits: list[tuple[int, int, float]] = field(default_factory=list)
    rejected: list[int] = field(default_factory=list)
    relaxed: dict[int, tuple[float, int]] = field(default_factory=dict)
    hopeless_at_ms: dict[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Affinity:
    """Prefix affinity's input to a round (dispatcher/core/prefix_affinity.py): per job index, the instance
    indices holding its prompt's prefix and how many of its tokens each holds (only instances that may take more:
    `DispatcherCore._may_take_more`)."""

    held: dict[int, dict[int, int]]

    def holds_more(self, k: int, holder: int, other: int) -> bool:
        hits = self.held.get(k)
        return bool(hits) and hits.get(holder, 0) > hits.get(other, 0)

    def waits_for_holder(self, k: int, holder: int, taker: int, available_ms: Sequence[float],
                         rows: Sequence[list[float]]) -> bool:
        """Job k, planned on a busy `holder` of its prefix, stays there rather than go to the idle `taker` when the
        holder gives it the earlier first token (its cached tokens are not computed again)."""
        return (self.holds_more(k, holder, taker)
                and available_ms[holder] + rows[holder][k] < available_ms[taker] + rows[taker][k])


def _relaxed_budget_ms(job: Job, policy: DispatchPolicy) -> float:
    """How long past its (plan) arrival a job may have its first token at the latest: its SLO, every relaxation the
    policy allows, less the planning margin."""
    slo_ms = job.request.ttft_slo_ms
    step_ms = _relaxation_step_ms(job, policy)
    return slo_ms + (policy.max_num_relaxations * step_ms if step_ms else 0.0) - policy.deadline_margin_frac * slo_ms


def _relaxation_step_ms(job: Job, policy: DispatchPolicy) -> float:
    """How far one relaxation moves a job's deadline; 0 where the policy never relaxes."""
    step_ms = policy.relaxation_factor * job.request.ttft_slo_ms
    return step_ms if policy.overload == OverloadPolicy.REQUEUE and step_ms > 0 else 0.0


def _relax(job: Job, deadline_ms: float, num_relaxations: int, policy: DispatchPolicy) -> tuple[float, int] | None:
    step_ms = _relaxation_step_ms(job, policy)
    if not step_ms or num_relaxations >= policy.max_num_relaxations:
        return None
    return deadline_ms + step_ms, num_relaxations + 1


def _edf_donors(plan: tuple[tuple[int, ...], ...], index: list[int], far: list[int],
                due: list[float]) -> list[tuple[int, int]]:
    """(job, the instance it is planned on) for jobs planned on not-yet-free instances, most urgent first."""
    jobs = [(index[p], i) for i in far for p in plan[i]]
    return sorted(jobs, key=lambda kf: (due[kf[0]], kf[0]))  # (due, index): deterministic among equal deadlines


def _take_feasible(donors: list[tuple[int, int]], taker: int, available_ms: list[float],
                   rows: Sequence[list[float]], due: list[float], affinity: Affinity | None) -> int | None:
    start_ms, proc_row = available_ms[taker], rows[taker]
    for pos, (k, planned_on) in enumerate(donors):
        if start_ms + proc_row[k] <= due[k] + FEASIBILITY_EPS_MS and not (
                affinity and affinity.waits_for_holder(k, planned_on, taker, available_ms, rows)):
            del donors[pos]
            return k
    return None


def _columns(rows: Sequence[list[float]], cols: list[int]) -> list[list[float]]:
    """rows restricted to the given job indices, shared rows staying shared."""
    picked: dict[int, list[float]] = {}
    out = []
    for row in rows:
        sub = picked.get(id(row))
        if sub is None:
            sub = picked[id(row)] = [row[k] for k in cols]
        out.append(sub)
    return out


def plan_round(
    now_ms: float,
    jobs: list[Job],
    available_ms: list[float],
    proc_ms: np.ndarray | Sequence[list[float]],
    policy: DispatchPolicy,
    affinity: Affinity | None = None,
) -> RoundDecision:
    """available_ms[i]: T_i of routable instance i (>= now_ms). proc_ms[i, k]: predicted prefill of jobs[k] on i, as
    a matrix or as one list per instance (alike instances may share one list: the core's usual round). affinity:
    which instances hold each job's prompt prefix (`_move_to_holders`, `Affinity.waits_for_holder`)."""
    rows = shared_rows(proc_ms) if isinstance(proc_ms, np.ndarray) else proc_ms
    decision = None
    if len(jobs) == 1 and not jobs[0].is_late:
        decision = _plan_lone_on_time_job(now_ms, jobs[0], available_ms, rows, policy, affinity)
    if decision is None:
        decision = plan_round_general(now_ms, jobs, available_ms, rows, policy, affinity)
    if affinity is not None and affinity.held:
        _move_to_holders(now_ms, decision, jobs, available_ms, rows, policy, affinity)
    return decision


def _move_to_holders(now_ms: float, decision: RoundDecision, jobs: list[Job], available_ms: list[float],
                     rows: Sequence[list[float]], policy: DispatchPolicy, affinity: Affinity) -> None:
    """Prefix affinity, after the plan: an on-time job committed to one instance moves to a near-free instance
    holding more of its prompt's prefix (the most first) when there every on-time job committed still meets its
    planned deadline, in deadline order. The instance it leaves only gets earlier."""
    margin = policy.deadline_margin_frac
    due = {k: jobs[k].deadline_ms - margin * jobs[k].request.ttft_slo_ms for k in range(len(jobs))}
    by_instance: dict[int, list[int]] = {}
    for i, k, _ in decision.commits:
        by_instance.setdefault(i, []).append(k)
    horizon_ms = now_ms + policy.lookahead_ms if policy.is_late_binding else inf
    near = {i for i, available in enumerate(available_ms) if available <= horizon_ms}
    moved = False
    for i, k, _ in list(decision.commits):
        hits = affinity.held.get(k)
        if jobs[k].is_late or not hits:
            continue
        for h in sorted(hits, key=lambda h: (-hits[h], h)):
            if h not in near or not affinity.holds_more(k, h, i):
                continue
            planned = by_instance.get(h, [])
            if any(jobs[j].is_late for j in planned):
                continue
            order = sorted(planned + [k], key=lambda j: (due[j], j))
            t = available_ms[h]
            feasible = True
            for j in order:
                t += rows[h][j]
                if t > due[j] + FEASIBILITY_EPS_MS:
                    feasible = False
                    break
            if feasible:
                by_instance[i].remove(k)
                by_instance[h] = order
                moved = True
                break
    if moved:
        decision.commits = [(i, k, rows[i][k]) for i in sorted(by_instance, key=lambda i: (available_ms[i], i))
                            for k in by_instance[i]]


def plan_round_general(now_ms: float, jobs: list[Job], available_ms: list[float],
                       proc_ms: np.ndarray | Sequence[list[float]], policy: DispatchPolicy,
                       affinity: Affinity | None = None) -> RoundDecision:
    """`plan_round` for any queue (the lone-job shortcut's reference), before the moves to prefix holders."""
    rows = shared_rows(proc_ms) if isinstance(proc_ms, np.ndarray) else proc_ms
    decision = RoundDecision()
    num_instances = len(available_ms)
    frac = policy.deadline_margin_frac
    deadline = [job.deadline_ms for job in jobs]
    margin_ms = [frac * job.request.ttft_slo_ms for job in jobs]
    num_relax = [job.num_relaxations for job in jobs]
    on_time = [k for k, job in enumerate(jobs) if not job.is_late]
    late = [k for k, job in enumerate(jobs) if job.is_late]

    on_time_rows = rows if len(on_time) == len(jobs) else _columns(rows, on_time)
    plan_on_time = lst_imh_rows(available_ms, on_time_rows, [deadline[k] - margin_ms[k] for k in on_time])
    distinct_rows = list({id(row): row for row in rows}.values()) if plan_on_time.unassigned or late else []
    for p in plan_on_time.unassigned:
        k = on_time[p]
        relaxed = _relax(jobs[k], deadline[k], num_relax[k], policy)
        if relaxed is None:
            if min(row[k] for row in distinct_rows) <= _relaxed_budget_ms(jobs[k], policy):
                decision.rejected.append(k)
                continue
            relaxed = (deadline[k], num_relax[k])  # oversized: late as it is, never refused for its size
        deadline[k], num_relax[k] = relaxed
        decision.relaxed[k] = relaxed
        late.append(k)

    due = [d - m for d, m in zip(deadline, margin_ms)]
    oversize_ms: dict[int, float] = {}
    if late:
        fastest_ms = {k: min(row[k] for row in distinct_rows) for k in late}
        for k in late:  # oversized (module docstring): its deadline moves out by its prefill
            if fastest_ms[k] > _relaxed_budget_ms(jobs[k], policy):
                oversize_ms[k] = fastest_ms[k]
                due[k] += fastest_ms[k]
        # the late requests plan on the time the on-time plan leaves over (numpy's sum, as the matrix version had)
        planned_ms = [float(np.array([rows[i][on_time[p]] for p in picked]).sum()) if picked else 0.0
                      for i, picked in enumerate(plan_on_time.assigned)]
        plan_late = lst_imh_rows([a + s for a, s in zip(available_ms, planned_ms)], _columns(rows, late),
                                 [due[k] for k in late])
    else:  # the usual round: nothing late, and the instances' availabilities need not be shifted
        plan_late = LstImhPlan(assigned=((),) * num_instances, unassigned=())
        fastest_ms = {}
    for p in plan_late.unassigned:
        k = late[p]
        # Not placed this round, but it may be on a later one until even a free instance cannot make it.
        # Hopeless from the moment even a free instance would only just make it (>=: a wakeup at exactly
        # hopeless_at_ms must resolve the request, not find it still pending). Compared as due - fastest, the very
        # expression hopeless_at_ms is: now + fastest >= due can round the other way at now == hopeless_at_ms, and
        # the wakeup then found the request pending and asked for the same instant again, forever.
        while now_ms >= due[k] - fastest_ms[k]:
            relaxed = _relax(jobs[k], deadline[k], num_relax[k], policy)
            if relaxed is None:
                break
            deadline[k], num_relax[k] = relaxed
            due[k] = deadline[k] - margin_ms[k] + oversize_ms.get(k, 0.0)
            decision.relaxed[k] = relaxed
        if now_ms >= due[k] - fastest_ms[k]:
            decision.rejected.append(k)
            decision.relaxed.pop(k, None)
    rejected = set(decision.rejected)
    for k in late:
        if k not in rejected:
            decision.hopeless_at_ms[k] = due[k] - fastest_ms[k]

    horizon_ms = now_ms + policy.lookahead_ms if policy.is_late_binding else float("inf")
    near = sorted((i for i in range(num_instances) if available_ms[i] <= horizon_ms),
                  key=lambda i: (available_ms[i], i))
    far = [i for i in range(num_instances) if available_ms[i] > horizon_ms]
    on_time_donors: list[tuple[int, int]] | None = None  # built only when a near-free instance has nothing planned
    late_donors: list[tuple[int, int]] | None = None
    for i in near:
        row = rows[i]
        if plan_on_time.assigned[i]:
            decision.commits.extend((i, on_time[p], row[on_time[p]]) for p in plan_on_time.assigned[i])
            continue
        k = None
        if policy.is_work_conserving:
            if on_time_donors is None:
                on_time_donors = _edf_donors(plan_on_time.assigned, on_time, far, due)
            k = _take_feasible(on_time_donors, i, available_ms, rows, due, affinity)
        if k is None and plan_late.assigned[i]:
            k = late[plan_late.assigned[i][0]]
        if k is None and policy.is_work_conserving:
            if late_donors is None:
                late_donors = _edf_donors(plan_late.assigned, late, far, due)
            k = _take_feasible(late_donors, i, available_ms, rows, due, affinity)
        if k is not None:
            decision.commits.append((i, k, row[k]))
    return decision


def _plan_lone_on_time_job(now_ms: float, job: Job, available_ms: list[float], rows: Sequence[list[float]],
                           policy: DispatchPolicy, affinity: Affinity | None = None) -> RoundDecision | None:
    """The usual round of a lightly loaded model: one queued request, still on time. The same decision as the
    general path (LST-IMH over one job: the latest-free instance that makes the deadline takes it; then late
    binding and work conservation), without building its arrays. None when no instance makes the deadline: the
    general path relaxes or rejects."""
    due_ms = job.deadline_ms - policy.deadline_margin_frac * job.request.ttft_slo_ms
    column = [row[0] for row in rows]
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
        # makes the deadline takes the job from the far one, unless the far one holds more of its prefix and gives
        # the earlier first token; then the next near-free one is asked, as the general path asks each in turn.
        taker = None
        for i, available in enumerate(available_ms):
            if (available <= horizon_ms and available + column[i] <= due_ms + FEASIBILITY_EPS_MS
                    and (taker is None or available < available_ms[taker])
                    and not (affinity and affinity.waits_for_holder(0, chosen, i, available_ms, rows))):
                taker = i
        if taker is not None:
            decision.commits.append((taker, 0, float(column[taker])))
    return decision

"""The lone on-time request shortcut of an LST-IMH round makes exactly the general path's decision."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.core.jobs import Job
from dispatcher.core.round import Affinity, _move_to_holders, plan_round, plan_round_general
from dispatcher.core.policy import DispatchPolicy, OverloadPolicy

from .helpers import request

# Coarse values so that ties (equal availabilities, a deadline met exactly) come up often.
times_ms = st.integers(0, 40).map(float)


@settings(max_examples=400, deadline=None)
@given(
    now_ms=times_ms,
    offsets_ms=st.lists(times_ms, min_size=1, max_size=6),
    proc=st.lists(st.integers(1, 30).map(float), min_size=6, max_size=6),
    slo_ms=st.integers(1, 60).map(float),
    margin=st.sampled_from([0.0, 0.05, 0.25]),
    lookahead_ms=st.sampled_from([0.0, 5.0, 20.0]),
    is_late_binding=st.booleans(),
    is_work_conserving=st.booleans(),
    overload=st.sampled_from(list(OverloadPolicy)),
    held_by=st.lists(st.integers(0, 5), max_size=3, unique=True),
)
def test_the_lone_job_shortcut_decides_as_the_general_round(now_ms, offsets_ms, proc, slo_ms, margin, lookahead_ms,
                                                           is_late_binding, is_work_conserving, overload, held_by):
    policy = DispatchPolicy(deadline_margin_frac=margin, lookahead_ms=lookahead_ms, is_late_binding=is_late_binding,
                            is_work_conserving=is_work_conserving, overload=overload)
    available_ms = [now_ms + o for o in offsets_ms]
    proc_ms = np.array(proc[: len(available_ms)]).reshape(len(available_ms), 1)
    job = Job.from_request(request("r", now_ms, slo_ms=slo_ms))
    # prefix affinity: instances holding 16, 32, ... of the prompt's tokens
    affinity = Affinity({0: {i: 16 * (n + 1) for n, i in enumerate(held_by) if i < len(available_ms)}}) \
        if held_by else None
    shortcut = plan_round(now_ms, [job], available_ms, proc_ms, policy, affinity)
    general = plan_round_general(now_ms, [job], available_ms, proc_ms, policy, affinity)
    if affinity:
        _move_to_holders(now_ms, general, [job], available_ms, [row.tolist() for row in proc_ms], policy, affinity)
    assert shortcut == general


def test_the_latest_free_instance_that_makes_the_deadline_gets_a_lone_request():
    # LST-IMH keeps the earliest-free instance for work that needs it: the lone request is planned on the later
    # one, and late binding commits it nowhere yet (that instance is 50 ms from free; lookahead 20 ms) -- unless
    # work conservation lets the idle one take it.
    job = Job.from_request(request("r", 0.0, slo_ms=100.0))
    proc_ms = np.array([[10.0], [10.0]])
    idle_keeps = DispatchPolicy(is_work_conserving=False, deadline_margin_frac=0.0)
    assert plan_round(0.0, [job], [0.0, 50.0], proc_ms, idle_keeps).commits == []
    conserving = DispatchPolicy(deadline_margin_frac=0.0)
    assert plan_round(0.0, [job], [0.0, 50.0], proc_ms, conserving).commits == [(0, 0, 10.0)]
    assert plan_round(0.0, [job], [0.0, 15.0], proc_ms, idle_keeps).commits == [(1, 0, 10.0)]


@settings(max_examples=300, deadline=None)
@given(
    now_ms=times_ms,
    offsets_ms=st.lists(times_ms, min_size=1, max_size=5),
    jobs=st.lists(st.tuples(st.integers(1, 60).map(float), st.booleans(), st.integers(0, 1)), min_size=1,
                  max_size=8),
    proc=st.lists(st.integers(1, 30).map(float), min_size=8, max_size=8),
    alike=st.booleans(),
    margin=st.sampled_from([0.0, 0.05]),
    overload=st.sampled_from(list(OverloadPolicy)),
)
def test_instances_sharing_one_row_decide_as_separate_rows(now_ms, offsets_ms, jobs, proc, alike, margin, overload):
    """The core hands alike instances one shared row of p_ij (the planner sorts it once); the decision must be the
    one separate rows, or the matrix, give. Late jobs (requeue) included: they plan on per-instance leftovers."""
    policy = DispatchPolicy(deadline_margin_frac=margin, overload=overload)
    available_ms = [now_ms + o for o in offsets_ms]
    job_list = []
    for n, (slo_ms, is_late, num_relaxations) in enumerate(jobs):
        job = Job.from_request(request(f"r{n}", now_ms, slo_ms=slo_ms))
        job.is_late, job.num_relaxations = is_late, num_relaxations if is_late else 0
        job_list.append(job)
    row = proc[: len(job_list)]
    if alike:
        matrix = np.array([row] * len(available_ms))
    else:  # rows differ per instance: a rotation of the same times
        matrix = np.array([row[i % len(row):] + row[: i % len(row)] for i in range(len(available_ms))])
    shared = [matrix[0].tolist()] * len(available_ms) if alike else [r.tolist() for r in matrix]
    separate = [list(r) for r in shared]
    decisions = [plan_round(now_ms, job_list, available_ms, p, policy) for p in (matrix, shared, separate)]
    assert decisions[0] == decisions[1] == decisions[2]


def test_a_near_free_instance_the_holder_beats_passes_the_job_to_the_next_one():
    # Instances 0-3 free now, 4 (holding the prefix) at 1 ms; the prompt takes 3 ms on 0 and 1 ms elsewhere. The
    # holder's first token (2 ms) beats instance 0's (3 ms) but not instance 1's (1 ms): instance 1 takes it, on both
    # paths (the shortcut used to ask instance 0 alone and leave the job queued).
    policy = DispatchPolicy(deadline_margin_frac=0.0, lookahead_ms=0.0, is_late_binding=True, is_work_conserving=True,
                            overload=OverloadPolicy.REJECT)
    available_ms = [0.0, 0.0, 0.0, 0.0, 1.0]
    proc_ms = np.array([[3.0], [1.0], [1.0], [1.0], [1.0]])
    job = Job.from_request(request("r", 0.0, slo_ms=3.0))
    affinity = Affinity({0: {4: 16}})
    shortcut = plan_round(0.0, [job], available_ms, proc_ms, policy, affinity)
    assert shortcut.commits == [(1, 0, 1.0)]
    general = plan_round_general(0.0, [job], available_ms, proc_ms, policy, affinity)
    _move_to_holders(0.0, general, [job], available_ms, [row.tolist() for row in proc_ms], policy, affinity)
    assert shortcut == general

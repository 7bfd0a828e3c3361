"""The transition table, the state machine and the command routes: pure, exhaustive over states and actions."""
from __future__ import annotations

import itertools

import pytest

from contracts import LifecycleAction, ModelState
from worker.core.lifecycle import (
    STEADY_STATES,
    TRANSITIONS,
    IllegalTransitionError,
    InstanceLifecycle,
    Step,
    drain_deadline_unix_ms,
    drain_decision,
    route,
)

S = ModelState
A = LifecycleAction


def test_every_state_has_a_row_and_only_names_states():
    assert set(TRANSITIONS) == set(ModelState)
    for targets in TRANSITIONS.values():
        assert targets <= set(ModelState)


@pytest.mark.parametrize("from_state,to_state", list(itertools.product(ModelState, ModelState)))
def test_a_transition_happens_exactly_when_the_table_allows_it(from_state, to_state):
    machine = InstanceLifecycle("w", "m", "i", state=from_state, entered_unix_ms=1000.0)
    if to_state in TRANSITIONS[from_state]:
        event = machine.transition(to_state, now_unix_ms=1250.0, reason="r", via="fork", command_id="c")
        assert machine.state == to_state
        assert (event.from_state, event.to_state, event.duration_ms, event.command_id) == (from_state, to_state,
                                                                                             250.0, "c")
    else:
        with pytest.raises(IllegalTransitionError) as err:
            machine.transition(to_state, now_unix_ms=1250.0)
        assert machine.state == from_state and not machine.history
        assert from_state.value in str(err.value) and to_state.value in str(err.value)


def test_active_is_reached_only_through_verifying_and_left_only_through_draining_or_failure():
    assert [s for s, targets in TRANSITIONS.items() if S.ACTIVE in targets] == [S.VERIFYING, S.DRAINING]
    assert TRANSITIONS[S.ACTIVE] == {S.DRAINING, S.FAILED}
    # and DRAINING -> ACTIVE only resumes an instance whose weights never left (no route uses it otherwise)
    for action, state in itertools.product(A, STEADY_STATES | {S.FAILED}):
        r = route(action, state, has_host_copy=True, has_fork_source=True)
        assert Step.RESUME not in r.steps


def test_events_carry_timings_and_durations_and_history_is_bounded():
    machine = InstanceLifecycle("w", "m", "i", max_num_history=3)
    t = 1_000.0
    for to_state in (S.LOADING, S.VERIFYING, S.ACTIVE, S.DRAINING, S.WARM):
        t += 10.0
        event = machine.transition(to_state, now_unix_ms=t, timings_ms={"x_ms": t})
        assert event.timings_ms == {"x_ms": t} and event.unix_ms == t
    assert [e.to_state for e in machine.history] == [S.ACTIVE, S.DRAINING, S.WARM]
    assert all(e.duration_ms == 10.0 for e in machine.history)


def _walk(r, start: ModelState) -> ModelState:
    """Where the route's steps lead when every step succeeds: each must be legal from where the previous ended."""
    ends = {Step.CLEANUP: [S.COLD], Step.DRAIN: [S.DRAINING], Step.RESUME: [S.ACTIVE], Step.TO_WARM: [S.WARM],
            Step.RELEASE: [S.COLD], Step.LOAD_HOST: [S.LOADING, S.WARM],
            Step.COLD_LOAD: [S.LOADING, S.VERIFYING, S.ACTIVE], Step.WAKE: [S.WAKING, S.VERIFYING, S.ACTIVE],
            Step.FORK: [S.FORKING, S.VERIFYING, S.ACTIVE]}
    machine = InstanceLifecycle("w", "m", "i", state=start)
    for step in r.steps:
        for state in ends[step]:
            machine.transition(state, now_unix_ms=1.0)
    return machine.state


@pytest.mark.parametrize("action,state,has_host_copy,has_fork_source", [
    (a, s, h, f) for a, s, h, f in itertools.product(A, sorted(STEADY_STATES | {S.DRAINING, S.FAILED}),
                                                     (False, True), (False, True))
    if not (s == S.WARM and not h)  # warm means a host copy
])
def test_every_route_is_a_legal_walk_to_its_target(action, state, has_host_copy, has_fork_source):
    r = route(action, state, has_host_copy=has_host_copy, has_fork_source=has_fork_source)
    assert _walk(r, state) == r.target
    if r.fallbacks:  # each fallback is reachable from where a failed fork or verification leaves the instance
        for fb in r.fallbacks:
            entry = {Step.WAKE: S.WAKING, Step.COLD_LOAD: S.LOADING}[fb]
            assert entry in TRANSITIONS[S.FORKING] and entry in TRANSITIONS[S.VERIFYING]


def test_routes_pick_the_fastest_way_and_drain_before_leaving_active():
    assert route(A.ACTIVATE, S.WARM, has_host_copy=True, has_fork_source=False).steps == (Step.WAKE,)
    assert route(A.ACTIVATE, S.COLD, has_host_copy=False, has_fork_source=False).steps == (Step.COLD_LOAD,)
    fork = route(A.FORK_FROM, S.WARM, has_host_copy=True, has_fork_source=True)
    assert fork.steps == (Step.FORK,) and fork.fallbacks == (Step.WAKE, Step.COLD_LOAD)
    assert route(A.FORK_FROM, S.COLD, has_host_copy=False, has_fork_source=True).fallbacks == (Step.COLD_LOAD,)
    # a fork without a source is an activation
    assert route(A.FORK_FROM, S.COLD, has_host_copy=False, has_fork_source=False).steps == (Step.COLD_LOAD,)
    assert route(A.WARM, S.ACTIVE, has_host_copy=False, has_fork_source=False).steps == (Step.DRAIN, Step.TO_WARM)
    assert route(A.COLD, S.ACTIVE, has_host_copy=True, has_fork_source=False).steps == (Step.DRAIN, Step.RELEASE)
    assert route(A.WARM, S.COLD, has_host_copy=False, has_fork_source=False).steps == (Step.LOAD_HOST,)
    assert route(A.ACTIVATE, S.FAILED, has_host_copy=False, has_fork_source=False).steps == (Step.CLEANUP,
                                                                                              Step.COLD_LOAD)


@pytest.mark.parametrize("action,state", [(A.ACTIVATE, S.ACTIVE), (A.FORK_FROM, S.ACTIVE), (A.WARM, S.WARM),
                                          (A.COLD, S.COLD), (A.DRAIN, S.DRAINING), (A.DRAIN, S.WARM)])
def test_commands_already_satisfied_are_noops(action, state):
    assert route(action, state, has_host_copy=state == S.WARM, has_fork_source=True).is_noop


@pytest.mark.parametrize("state", [S.LOADING, S.WAKING, S.FORKING, S.VERIFYING])
def test_no_command_starts_mid_transition(state):
    with pytest.raises(ValueError, match=state.value):
        route(A.ACTIVATE, state, has_host_copy=False, has_fork_source=False)


def test_drain_hands_back_what_has_no_first_token_and_finishes_the_rest():
    decision = drain_decision({"a": False, "b": True, "c": False})
    assert decision.hand_back_ids == ("a", "c") and decision.finish_ids == ("b",)
    assert drain_decision({}).hand_back_ids == ()


def test_a_drain_waits_for_a_stream_until_its_client_would_stop_waiting():
    now_ms = 1_000_000.0
    # a stream that started 10 s ago, with the gateway's 300 s: 290 s more, far past the 30 s of reservations
    assert drain_deadline_unix_ms(now_ms, [now_ms - 10_000], request_timeout_s=300, min_drain_s=30) == \
        now_ms + 290_000
    # the latest client decides; one whose client gave up long ago does not shorten it
    assert drain_deadline_unix_ms(now_ms, [now_ms - 400_000, now_ms - 1_000], request_timeout_s=300,
                                  min_drain_s=30) == now_ms + 299_000
    # nothing streaming (reservations only), or streams whose clients gave up: the minimum
    assert drain_deadline_unix_ms(now_ms, [], request_timeout_s=300, min_drain_s=30) == now_ms + 30_000
    assert drain_deadline_unix_ms(now_ms, [now_ms - 290_000], request_timeout_s=300, min_drain_s=30) == \
        now_ms + 30_000

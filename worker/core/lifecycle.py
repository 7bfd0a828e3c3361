"""Model lifecycle on a worker: the one transition table, the state machine of one instance, and the route a
lifecycle command takes from the state an instance is in.

Pure: no I/O, no torch, no clock. The shell passes the wall-clock reading in; every transition returns the
`contracts.LifecycleEvent` the shell publishes on janus.event.lifecycle.

Steady states are COLD (only the description; weights on disk), WARM (weights in pinned host memory, engine
metadata and transfer-engine registration kept) and ACTIVE (weights in device pages, serving). Everything else is a
transition in progress. Leaving ACTIVE always goes through DRAINING; reaching ACTIVE always goes through VERIFYING
(checksums and a canary step), so the registry never marks an unverified instance ready.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Iterable, Literal

from contracts import ErrorCode, LifecycleAction, LifecycleEvent, ModelState

S = ModelState

# from -> the states it may go to. Nothing outside this table happens.
TRANSITIONS: dict[ModelState, frozenset[ModelState]] = {
    S.COLD: frozenset({S.LOADING, S.FORKING}),
    # disk -> host (to WARM) or disk -> device (to VERIFYING); COLD when a load is abandoned
    S.LOADING: frozenset({S.WARM, S.VERIFYING, S.FAILED, S.COLD}),
    S.WARM: frozenset({S.WAKING, S.FORKING, S.COLD}),
    # host -> device; back to WARM when the device has no room
    S.WAKING: frozenset({S.VERIFYING, S.FAILED, S.WARM}),
    # a failed pull falls back to the warm copy (WAKING) or a cold load (LOADING)
    S.FORKING: frozenset({S.VERIFYING, S.WAKING, S.LOADING, S.FAILED}),
    # a failed verification falls back the same way
    S.VERIFYING: frozenset({S.ACTIVE, S.WAKING, S.LOADING, S.FAILED}),
    S.ACTIVE: frozenset({S.DRAINING, S.FAILED}),
    # a drained instance stays resident: it may serve again, or give its pages back
    S.DRAINING: frozenset({S.ACTIVE, S.WARM, S.COLD, S.FAILED}),
    S.FAILED: frozenset({S.COLD}),
}

STEADY_STATES = frozenset({S.COLD, S.WARM, S.ACTIVE})

Via = Literal["", "warm_copy", "cold_load", "fork", "remote_warm", "drain", "release"]


class IllegalTransitionError(ValueError):
    """A transition the table does not allow (a bug in the caller, or a command that makes no sense now)."""

    code = ErrorCode.ILLEGAL_TRANSITION

    def __init__(self, instance_id: str, from_state: ModelState, to_state: ModelState) -> None:
        allowed = ", ".join(sorted(s.value for s in TRANSITIONS[from_state])) or "nothing"
        super().__init__(f"{instance_id}: {from_state.value} -> {to_state.value} is not a lifecycle transition "
                         f"(from {from_state.value}: {allowed})")
        self.instance_id = instance_id
        self.from_state = from_state
        self.to_state = to_state


def is_allowed(from_state: ModelState, to_state: ModelState) -> bool:
    return to_state in TRANSITIONS[from_state]


@dataclass
class InstanceLifecycle:
    """The state of one model instance on a worker. `transition` is the only way to change it."""

    worker_id: str
    model: str
    instance_id: str
    state: ModelState = S.COLD
    entered_unix_ms: float = 0.0
    history: list[LifecycleEvent] = field(default_factory=list)
    max_num_history: int = 64

    def transition(self, to_state: ModelState, *, now_unix_ms: float, reason: str = "", via: Via = "",
                   timings_ms: dict[str, float] | None = None, command_id: str = "") -> LifecycleEvent:
        """Move to `to_state` or raise IllegalTransitionError. The event's duration is the time spent in the state
        being left (the length of the step that just ended)."""
        if not is_allowed(self.state, to_state):
            raise IllegalTransitionError(self.instance_id, self.state, to_state)
        duration_ms = max(0.0, now_unix_ms - self.entered_unix_ms) if self.entered_unix_ms else 0.0
        event = LifecycleEvent(worker_id=self.worker_id, model=self.model, instance_id=self.instance_id,
                               from_state=self.state, to_state=to_state, reason=reason, via=via,
                               duration_ms=duration_ms, timings_ms=dict(timings_ms or {}), unix_ms=now_unix_ms,
                               command_id=command_id)
        self.state = to_state
        self.entered_unix_ms = now_unix_ms
        self.history.append(event)
        del self.history[:-self.max_num_history]
        return event


class Step(StrEnum):
    """One stage of carrying out a command; the shell runs each with the device and the bus."""

    CLEANUP = "cleanup"  # FAILED -> COLD: forget whatever is left
    DRAIN = "drain"  # ACTIVE -> DRAINING: stop admitting, finish or hand back what is in flight
    RESUME = "resume"  # DRAINING -> ACTIVE: admit again (the weights never left)
    TO_WARM = "to_warm"  # DRAINING -> WARM: device -> pinned host copy, release the device pages
    RELEASE = "release"  # DRAINING or WARM -> COLD: release pages and the host copy
    LOAD_HOST = "load_host"  # COLD -> LOADING -> WARM
    COLD_LOAD = "cold_load"  # COLD -> LOADING -> VERIFYING -> ACTIVE
    WAKE = "wake"  # WARM -> WAKING -> VERIFYING -> ACTIVE
    FORK = "fork"  # COLD or WARM -> FORKING -> VERIFYING -> ACTIVE


UP_STEPS = frozenset({Step.COLD_LOAD, Step.WAKE, Step.FORK})


@dataclass(frozen=True)
class Route:
    """How a command is carried out from the current state: `steps` in order; when the last (up) step fails, the
    `fallbacks` are tried in order. Empty steps: nothing to do (a repeat, or already there)."""

    steps: tuple[Step, ...]
    fallbacks: tuple[Step, ...] = ()
    target: ModelState | None = None

    @property
    def is_noop(self) -> bool:
        return not self.steps


def route(action: LifecycleAction, state: ModelState, *, has_host_copy: bool, has_fork_source: bool) -> Route:
    """The steps that take an instance in `state` where `action` wants it. Raises IllegalTransitionError-style
    ValueError for a state that is mid-transition (the shell serialises commands per instance, so it only asks
    from a steady state, DRAINING or FAILED)."""
    if state not in STEADY_STATES | {S.DRAINING, S.FAILED}:
        raise ValueError(f"no command starts while an instance is {state.value}")
    A = LifecycleAction
    cleanup: tuple[Step, ...] = (Step.CLEANUP,) if state == S.FAILED else ()
    base = S.COLD if state == S.FAILED else state
    up_fallbacks = ((Step.WAKE,) if has_host_copy else ()) + (Step.COLD_LOAD,)
    if action in (A.ACTIVATE, A.FORK_FROM):
        if base == S.ACTIVE:
            return Route((), target=S.ACTIVE)
        if base == S.DRAINING:
            return Route((Step.RESUME,), target=S.ACTIVE)
        if action == A.FORK_FROM and has_fork_source:
            return Route(cleanup + (Step.FORK,), up_fallbacks, S.ACTIVE)
        if base == S.WARM:
            return Route((Step.WAKE,), (Step.COLD_LOAD,), S.ACTIVE)
        return Route(cleanup + (Step.COLD_LOAD,), target=S.ACTIVE)
    if action == A.WARM:
        if base == S.WARM:
            return Route((), target=S.WARM)
        if base == S.ACTIVE:
            return Route((Step.DRAIN, Step.TO_WARM), target=S.WARM)
        if base == S.DRAINING:
            return Route((Step.TO_WARM,), target=S.WARM)
        return Route(cleanup + (Step.LOAD_HOST,), target=S.WARM)
    if action == A.COLD:
        if base == S.COLD:
            return Route(cleanup, target=S.COLD)
        if base == S.ACTIVE:
            return Route((Step.DRAIN, Step.RELEASE), target=S.COLD)
        return Route((Step.RELEASE,), target=S.COLD)
    if action == A.DRAIN:
        if base == S.ACTIVE:
            return Route((Step.DRAIN,), target=S.DRAINING)
        return Route((), target=state)  # nothing is in flight there
    raise ValueError(f"unknown lifecycle action {action!r}")


@dataclass(frozen=True)
class DrainDecision:
    """What to do with the requests in flight on an instance that stops admitting."""

    hand_back_ids: tuple[str, ...]  # not past the first token: the dispatchers re-queue them
    finish_ids: tuple[str, ...]  # the client already has tokens: let them finish (or fail them at the deadline)


def drain_decision(first_token_seen: dict[str, bool]) -> DrainDecision:
    """request id -> whether its first token reached the client. Before the first token a request can still move
    to another instance at no cost to the client; after it, only this instance has its KV cache."""
    back = tuple(rid for rid, seen in first_token_seen.items() if not seen)
    finish = tuple(rid for rid, seen in first_token_seen.items() if seen)
    return DrainDecision(back, finish)


def drain_deadline_unix_ms(now_unix_ms: float, started_unix_ms: Iterable[float], *, request_timeout_s: float,
                           min_drain_s: float) -> float:
    """When a drain stops waiting and fails what is still in flight. A request that streams already can only finish
    here (its KV cache is only here), so it gets until its client stops waiting anyway: its start plus the gateway's
    request timeout. However long it runs, a plan that removes its instance (a consolidation, a scale-in) does not
    cut it; the simulator's drains, which finish everything they hold, follow the same rule. What has no start of its
    own here (P/D reservations) gets `min_drain_s`.

    Until 2026-12, a fixed 30 s: on a slow host, 4 of 8 streams of 4,000 tokens on an instance a plan took away
    ended in `instance_failed` (docs/reliability.md, "a drain deadline shorter than the streams")."""
    client_gives_up = (started + request_timeout_s * 1e3 for started in started_unix_ms)
    return max([now_unix_ms + min_drain_s * 1e3, *client_gives_up])

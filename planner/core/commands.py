"""The reconciler's bookkeeping of the lifecycle commands it has in flight, and the effects it returns."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from contracts import (
    ErrorInfo,
    InstanceRecord,
    InstanceRole,
    LifecycleAction,
    LifecycleCommand,
    PlanAction,
    PlanStatus,
    Pool,
)

UP_ACTIONS = frozenset({LifecycleAction.ACTIVATE, LifecycleAction.FORK_FROM})


@dataclass(frozen=True)
class ReconcileEffects:
    """What the shell must do: send the commands, publish the actions and plan statuses, write the records."""

    commands: tuple[LifecycleCommand, ...] = ()
    actions: tuple[PlanAction, ...] = ()
    registry_updates: tuple[InstanceRecord, ...] = ()
    plan_statuses: tuple[PlanStatus, ...] = ()

    @property
    def is_empty(self) -> bool:
        return not (self.commands or self.actions or self.registry_updates or self.plan_statuses)


@dataclass
class EffectsBuilder:
    commands: list[LifecycleCommand] = field(default_factory=list)
    actions: list[PlanAction] = field(default_factory=list)
    registry_updates: list[InstanceRecord] = field(default_factory=list)
    plan_statuses: list[PlanStatus] = field(default_factory=list)

    def build(self) -> ReconcileEffects:
        return ReconcileEffects(
            tuple(self.commands), tuple(self.actions), tuple(self.registry_updates), tuple(self.plan_statuses)
        )


@dataclass
class Op:
    """One instance's command in flight (at most one per instance), across its retries."""

    instance_id: str
    model: str
    worker_id: str
    role: InstanceRole
    pool: Pool
    action: LifecycleAction
    plan_id: str
    attempt: int
    command_id: str
    issued_ms: float
    phase: Literal["sent", "acked", "backoff"] = "sent"
    acked_ms: float | None = None
    retry_at_ms: float = 0.0
    is_fork_failed: bool = False  # a failed fork falls back to a plain activate on the retry
    peer_worker_ids: tuple[str, ...] = ()  # a tensor-parallel group's other devices

    @property
    def worker_ids(self) -> tuple[str, ...]:
        return (self.worker_id, *self.peer_worker_ids)

    @property
    def is_up(self) -> bool:
        return self.action in UP_ACTIONS

    def action_event(
        self, status: str, unix_ms: float, reason: str = "", error: ErrorInfo | None = None
    ) -> PlanAction:
        return PlanAction(
            plan_id=self.plan_id,
            command_id=self.command_id,
            worker_id=self.worker_id,
            model=self.model,
            instance_id=self.instance_id,
            action=self.action,
            status=status,  # type: ignore[arg-type]
            attempt=self.attempt,
            reason=reason,
            error=error,
            unix_ms=unix_ms,
        )


def command_id_for(plan_id: str, instance_id: str, action: LifecycleAction, attempt: int) -> str:
    """Unique per attempt: a retry is a new command, a repeat of the same attempt is the same one (idempotent)."""
    return f"{plan_id}/{instance_id}/{action.value}/{attempt}"

"""Plans as auditable events (JetStream stream PLANS): inputs, predictions, decisions, reasons, commands."""
from __future__ import annotations

import hashlib
from typing import Literal

from pydantic import Field

from .base import ErrorInfo, Message
from .lifecycle import LifecycleAction
from .oracle import CapacityPrediction, ElasticityPrediction, NeedVector
from .telemetry import ModelLoadWindow


def audit_digest(subject: str, data: bytes) -> str:
    """The SHA-256 (hex) of a PLANS event as stored: its subject and its payload bytes. The next event carries it, so
    an event altered, removed or inserted later breaks the chain at that point (`janus audit --verify`)."""
    return hashlib.sha256(subject.encode() + b"\n" + data).hexdigest()


class AuditEvent(Message):
    """An event of the PLANS stream, chained to the one stored before it."""

    prev_event_sha256: str = Field(default="", description="audit_digest of the event before this one in PLANS (set "
                                   "when published); empty for the first event of the stream")


class BinAssignment(Message):
    """One steady-pool device and the models packed on it."""

    worker_id: str
    models: tuple[str, ...]
    used: NeedVector


class Move(Message):
    model: str
    from_worker_id: str | None
    to_worker_id: str | None
    reason: str


class SteadyPlan(AuditEvent):
    plan_id: str
    created_unix_ms: float
    trigger: Literal["periodic", "arrival", "departure", "consolidation", "startup", "overflow"]
    steady_models: tuple[str, ...]
    elastic_models: tuple[str, ...] = Field(description="isolated to the elastic pool up front")
    bins: tuple[BinAssignment, ...]
    moves: tuple[Move, ...] = ()
    loads: tuple[ModelLoadWindow, ...] = ()
    predictions: tuple[CapacityPrediction, ...] = ()
    unplaced_models: tuple[str, ...] = Field(default=(), description="wanted in the steady pool, no device left")
    pool_reasons: dict[str, str] = Field(default_factory=dict, description="model -> why it is in its pool")
    reason: str = ""
    decision_ms: float = Field(default=0.0, ge=0)
    is_observe_only: bool = False
    epoch: int = Field(default=0, ge=0, description="the planner leader's term (planner/leader.py); 0: unelected")


class ElasticTarget(Message):
    model: str
    num_prefill: int = Field(ge=0)
    num_decode: int = Field(ge=0)
    desired_replicas: int = Field(ge=0, description="m* before the budget")
    num_devices_per_instance: int = Field(default=1, ge=1, description="devices one instance takes (its "
                                          "tensor-parallel group); the budget counts devices")
    prediction: ElasticityPrediction | None = None
    reason: str = ""


class ElasticPlan(AuditEvent):
    plan_id: str
    created_unix_ms: float
    budget_devices: int = Field(ge=0, description="what the steady pool leaves")
    num_devices_used: int = Field(ge=0)
    targets: tuple[ElasticTarget, ...]
    is_scaled_down: bool = False
    is_debounced: bool = Field(default=False, description="held: the last two plans disagreed")
    loads: tuple[ModelLoadWindow, ...] = ()
    reason: str = ""
    decision_ms: float = Field(default=0.0, ge=0)
    is_observe_only: bool = False
    epoch: int = Field(default=0, ge=0, description="the planner leader's term (planner/leader.py); 0: unelected")


class PlanAction(AuditEvent):
    """The reconciler's record of a command it issued for a plan, and later its outcome."""

    plan_id: str
    command_id: str
    worker_id: str
    model: str
    instance_id: str
    action: LifecycleAction
    status: Literal["issued", "succeeded", "failed", "retrying", "timed_out", "cancelled"]
    attempt: int = Field(default=1, ge=1)
    reason: str = ""
    error: ErrorInfo | None = None
    unix_ms: float


class PlanStatus(AuditEvent):
    """A plan's progress (janus.plan.status): done (every instance it wants is ready), superseded (a newer plan of
    its kind came first), blocked (something it wants cannot be issued now: the detail says what), ignored
    (observe-only)."""

    plan_id: str
    kind: Literal["steady", "elastic"]
    status: Literal["done", "superseded", "blocked", "ignored"]
    unix_ms: float
    detail: str = ""

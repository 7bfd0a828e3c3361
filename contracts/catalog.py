"""Every subject with its payload (and reply) type: what `janus contracts` prints and the tests check."""
from __future__ import annotations

from dataclasses import dataclass

from pydantic import TypeAdapter

from . import subjects as s
from .health import DispatcherHeartbeat, HealthReply
from .lifecycle import LifecycleCommand, LifecycleEvent, LifecycleReply
from .oracle import CapacityQuery, CapacityReply, ElasticityQuery, ElasticityReply
from .plans import ElasticPlan, PlanAction, PlanStatus, SteadyPlan
from .registry import InstanceRecord
from .requests import CancelRequest, GenerateRequest, SubmitAck
from .stream import ResendReply, ResendRequest, StreamEvent
from .telemetry import ModelLoadWindow
from .worker import MoveDecodes, MoveDecodesAck, PrefillDone, RequestOutcome, RunAssignment, WorkerHeartbeat


@dataclass(frozen=True)
class Route:
    subject: str
    sender: str
    receivers: str
    payload: object
    reply: object | None = None


ROUTES: tuple[Route, ...] = (
    Route(f"{s.PREFIX}.req.<model>", "gateway", "dispatcher (queue group)", GenerateRequest, SubmitAck),
    Route(s.CANCEL, "gateway", "dispatchers, workers", CancelRequest),
    Route(f"{s.PREFIX}.worker.<worker>.run", "dispatcher", "worker", RunAssignment),
    Route(f"{s.PREFIX}.worker.<worker>.move", "dispatcher", "worker", MoveDecodes, MoveDecodesAck),
    Route(f"{s.REPLY_PREFIX}.<gateway>.<request>", "worker", "gateway", StreamEvent),
    Route(f"{s.PREFIX}.worker.<worker>.resend", "gateway", "worker", ResendRequest, ResendReply),
    Route(s.PREFILL_DONE, "worker", "dispatchers", PrefillDone),
    Route(s.REQUEST_OUTCOME, "worker", "dispatchers", RequestOutcome),
    Route(f"{s.PREFIX}.telemetry.worker.<worker>", "worker", "all", WorkerHeartbeat),
    Route(f"{s.PREFIX}.telemetry.dispatcher.<dispatcher>", "dispatcher", "gateways", DispatcherHeartbeat),
    Route(f"{s.PREFIX}.telemetry.model.<model>", "dispatcher", "oracle, planners", ModelLoadWindow),
    Route(s.ORACLE_CAPACITY, "planners", "oracle (queue group)", CapacityQuery, CapacityReply),
    Route(s.ORACLE_ELASTICITY, "planners", "oracle (queue group)", ElasticityQuery, ElasticityReply),
    Route(s.PLAN_STEADY, "steady planner", "reconciler, auditors (stream PLANS)", SteadyPlan),
    Route(s.PLAN_ELASTIC, "elastic scaler", "reconciler, auditors (stream PLANS)", ElasticPlan),
    Route(s.PLAN_ACTION, "reconciler", "auditors (stream PLANS)", PlanAction),
    Route(s.PLAN_STATUS, "reconciler", "auditors (stream PLANS)", PlanStatus),
    Route(f"{s.PREFIX}.worker.<worker>.cmd", "reconciler", "worker", LifecycleCommand, LifecycleReply),
    Route(s.LIFECYCLE_EVENT, "worker", "all", LifecycleEvent),
    Route(f"KV {s.INSTANCES_BUCKET}/<instance>", "reconciler, workers", "dispatcher", InstanceRecord),
    Route(s.HEALTH_ALL, "anyone", "every service", None, HealthReply),
)


def json_schema(tp: object) -> dict:
    return TypeAdapter(tp).json_schema()

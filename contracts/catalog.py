"""Every subject with its payload (and reply) type: what `janus contracts` prints and the tests check."""
from __future__ import annotations

from dataclasses import dataclass

from pydantic import TypeAdapter

from . import subjects as s
from .health import HealthReply
from .lifecycle import LifecycleCommand, LifecycleEvent, LifecycleReply
from .oracle import CapacityQuery, CapacityReply, ElasticityQuery, ElasticityReply
from .plans import ElasticPlan, PlanAction, SteadyPlan
from .registry import InstanceRecord
from .requests import CancelRequest, GenerateRequest, SubmitAck
from .stream import StreamEvent
from .telemetry import ModelLoadWindow
from .worker import PrefillDone, RunAssignment, WorkerHeartbeat


@dataclass(frozen=True)
class Route:
    subject: str
    sender: str
    receivers: str
    payload: object
    reply: object | None = None


ROUTES: tuple[Route, ...] = (
    Route(s.req("<model>"), "gateway", "dispatcher (queue group)", GenerateRequest, SubmitAck),
    Route(s.CANCEL, "gateway", "dispatchers, workers", CancelRequest),
    Route(s.worker_run("<worker>"), "dispatcher", "worker", RunAssignment),
    Route(f"{s.REPLY_PREFIX}.<gateway>.<request>", "worker", "gateway", StreamEvent),
    Route(s.PREFILL_DONE, "worker", "dispatchers", PrefillDone),
    Route(s.worker_telemetry("<worker>"), "worker", "all", WorkerHeartbeat),
    Route(s.model_telemetry("<model>"), "dispatcher", "oracle, planners", ModelLoadWindow),
    Route(s.ORACLE_CAPACITY, "planners", "oracle (queue group)", CapacityQuery, CapacityReply),
    Route(s.ORACLE_ELASTICITY, "planners", "oracle (queue group)", ElasticityQuery, ElasticityReply),
    Route(s.PLAN_STEADY, "steady planner", "reconciler, auditors (stream PLANS)", SteadyPlan),
    Route(s.PLAN_ELASTIC, "elastic scaler", "reconciler, auditors (stream PLANS)", ElasticPlan),
    Route(s.PLAN_ACTION, "reconciler", "auditors (stream PLANS)", PlanAction),
    Route(s.worker_cmd("<worker>"), "reconciler", "worker", LifecycleCommand, LifecycleReply),
    Route(s.LIFECYCLE_EVENT, "worker", "all", LifecycleEvent),
    Route(f"KV {s.INSTANCES_BUCKET}/<instance>", "reconciler, workers", "dispatcher", InstanceRecord),
    Route(s.HEALTH_ALL, "anyone", "every service", None, HealthReply),
)


def json_schema(tp: object) -> dict:
    return TypeAdapter(tp).json_schema()

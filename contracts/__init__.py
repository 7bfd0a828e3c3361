"""Pydantic contracts of every message on the bus, the subject names, and the few config models two layers share
(TenantLimits). No I/O; everything may import it."""
from .base import SCHEMA_VERSION, ErrorCode, ErrorInfo, Message
from .health import DispatcherHeartbeat, HealthReply
from .limits import TenantLimits
from .lifecycle import (
    ForkSource,
    HostCopy,
    InstanceRole,
    LifecycleAction,
    LifecycleCommand,
    LifecycleEvent,
    LifecycleReply,
    ModelState,
    Pool,
    WeightSegment,
)
from .oracle import (
    CapacityItem,
    CapacityPrediction,
    CapacityQuery,
    CapacityReply,
    ElasticityItem,
    ElasticityPrediction,
    ElasticityQuery,
    ElasticityReply,
    NeedVector,
)
from .plans import BinAssignment, ElasticPlan, ElasticTarget, Move, PlanAction, PlanStatus, SteadyPlan
from .registry import InstanceRecord
from .requests import CancelRequest, GenerateRequest, GuidedDecoding, SamplingParams, SubmitAck
from .stream import STREAM_EVENT, RequestDone, RequestFailed, ResendReply, ResendRequest, StreamEvent, TokenChunk
from .telemetry import LoadFeatures, ModelLoadWindow
from .worker import (
    DeviceInfo,
    HoldsQuery,
    HoldsReply,
    InstanceStatus,
    KVTarget,
    MovedStream,
    MoveDecodes,
    MoveDecodesAck,
    PageCounters,
    PrefillDone,
    RequestOutcome,
    RunAssignment,
    WorkerHeartbeat,
)

__all__ = [name for name in dir() if not name.startswith("_")]

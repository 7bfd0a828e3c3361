"""The dispatcher core: pure policy (no I/O, time passed in). See docs/dispatcher.md."""
from .core import DispatcherCore
from .effects import Assign, Effect, PublishLoad, Reject, Relaxed, Requeued
from .policy import Algorithm, DispatchPolicy, OverloadPolicy
from .prefill_time import FunctionPrefillModel, PrefillTimeModel, ThroughputPrefillModel
from .requests import DispatchRequest
from .scheduling import LstImhPlan, lst_imh, moore_hodgson

__all__ = [
    "Algorithm",
    "Assign",
    "DispatchPolicy",
    "DispatchRequest",
    "DispatcherCore",
    "Effect",
    "FunctionPrefillModel",
    "LstImhPlan",
    "OverloadPolicy",
    "PrefillTimeModel",
    "PublishLoad",
    "Reject",
    "Relaxed",
    "Requeued",
    "ThroughputPrefillModel",
    "lst_imh",
    "moore_hodgson",
]

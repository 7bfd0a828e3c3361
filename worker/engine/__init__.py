"""The inference engine: the only place that runs model math.

Importing this package does not import torch: the demo checkpoints and the engine's plain data types load eagerly,
`LLMEngine` and the torch-backed parts on first use. The tokenizer the engine and the gateway share is
`runtime/tokenizer.py` (re-exported here).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .config import EngineConfig, ModelConfig
from .demo import DEMO_MODELS, DemoSpec, make_demo_models
from .outputs import DetachedDecode, EngineOutput, EngineStats, StepRecord
from runtime.tokenizer import IncrementalDetokenizer, TextTokenizer

if TYPE_CHECKING:
    from .engine import LLMEngine
    from .kv_pool import PlainKVPageSource, PlainWeightPageSource
    from .verify import CanaryResult

_LAZY = {
    "LLMEngine": ".engine",
    "PlainKVPageSource": ".kv_pool",
    "PlainWeightPageSource": ".kv_pool",
    "CanaryResult": ".verify",
}

__all__ = [
    "DEMO_MODELS", "DemoSpec", "DetachedDecode", "EngineConfig", "EngineOutput", "EngineStats",
    "IncrementalDetokenizer",
    "ModelConfig", "StepRecord", "TextTokenizer", "make_demo_models", *_LAZY,
]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

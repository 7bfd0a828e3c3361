"""Predicted prefill time of a request on an instance: the p_j of LST-IMH and the unit of every EPDT.

Two sources, one protocol: the engine's measured prefill throughput (`InstanceRecord.prefill_tokens_per_s`, from
heartbeats) with a configured fallback, or any function such as the oracle's roofline model wrapped by
`FunctionPrefillModel`.
"""
from __future__ import annotations

import math
from typing import Callable, Mapping, Protocol, runtime_checkable

import numpy as np

from contracts import InstanceRecord


@runtime_checkable
class PrefillTimeModel(Protocol):
    """Predicts how long one prefill takes on one instance."""

    def predict_ms(self, instance: InstanceRecord, num_prompt_tokens: int) -> float:
        """Milliseconds to prefill `num_prompt_tokens` on `instance` (> 0)."""
        ...

    def predict_many_ms(self, instance: InstanceRecord, num_prompt_tokens: np.ndarray) -> np.ndarray:
        """The same for many prompt lengths at once (float64 array of the same shape); the scheduler calls this
        once per instance and round, so it should be vectorised.

        Optional: `predict_rows_ms(instances, num_prompt_tokens)`, the same for all of one model's routable
        instances at once, shape (len(instances), n) or (1, n) when they are all alike. The scheduler uses it
        when present (a predictor that knows its instances are alike saves a call per instance and round)."""
        ...


class ThroughputPrefillModel:
    """p = overhead_ms + num_prompt_tokens / tokens_per_s, with tokens_per_s the instance's measured figure when the
    registry has one, else the model's configured figure, else `default_tokens_per_s`."""

    def __init__(
        self,
        default_tokens_per_s: float,
        *,
        overhead_ms: float = 0.0,
        tokens_per_s_by_model: Mapping[str, float] | None = None,
    ) -> None:
        if not (default_tokens_per_s > 0 and math.isfinite(default_tokens_per_s)):
            raise ValueError(f"default_tokens_per_s must be a positive number, got {default_tokens_per_s!r}")
        if not (overhead_ms >= 0 and math.isfinite(overhead_ms)):
            raise ValueError(f"overhead_ms must be >= 0, got {overhead_ms!r}")
        by_model = dict(tokens_per_s_by_model or {})
        for model, tps in by_model.items():
            if not (tps > 0 and math.isfinite(tps)):
                raise ValueError(f"tokens_per_s for model {model!r} must be positive, got {tps!r}")
        self._default_tps = float(default_tokens_per_s)
        self._overhead_ms = float(overhead_ms)
        self._tps_by_model = by_model

    def tokens_per_s(self, instance: InstanceRecord) -> float:
        measured = instance.prefill_tokens_per_s
        if measured is not None and measured > 0 and math.isfinite(measured):
            return measured
        return self._tps_by_model.get(instance.model, self._default_tps)

    def predict_ms(self, instance: InstanceRecord, num_prompt_tokens: int) -> float:
        return self._overhead_ms + 1000.0 * num_prompt_tokens / self.tokens_per_s(instance)

    def predict_many_ms(self, instance: InstanceRecord, num_prompt_tokens: np.ndarray) -> np.ndarray:
        tokens = np.asarray(num_prompt_tokens, dtype=np.float64)
        return self._overhead_ms + tokens * (1000.0 / self.tokens_per_s(instance))


class FunctionPrefillModel:
    """Adapts any `fn(instance, num_prompt_tokens) -> ms` (e.g. the oracle's roofline model) to the protocol."""

    def __init__(self, fn: Callable[[InstanceRecord, int], float]) -> None:
        self._fn = fn

    def predict_ms(self, instance: InstanceRecord, num_prompt_tokens: int) -> float:
        return float(self._fn(instance, int(num_prompt_tokens)))

    def predict_many_ms(self, instance: InstanceRecord, num_prompt_tokens: np.ndarray) -> np.ndarray:
        tokens = np.asarray(num_prompt_tokens)
        return np.fromiter((self._fn(instance, int(n)) for n in tokens.ravel()), np.float64, tokens.size).reshape(
            tokens.shape
        )

"""How far the oracle's attainment predictions are from what the dispatchers measure: the oracle's own error,
rolling, per model (docs/oracle.md, "The oracle reports itself").

For each model load window with requests, a measured attainment and a known replica count m, the oracle predicts
the attainment of those features at m (the mean and std its Elasticity answer gives a planner) BEFORE it learns from
the window, and the tracker keeps the last `max_windows` (prediction, measurement) pairs of the model: their mean
absolute error, mean signed error (bias: > 0, the oracle is optimistic) and coverage (the share of measurements
inside mean +- k_sigma * std).

What is compared: the oracle predicts token-level attainment (what profiles measure); a window carries it where the
workers' outcomes of its requests reached the dispatcher (contracts.RequestOutcome), else only its TTFT attainment
(the share of first tokens on time), and then the error mixes the oracle's error with the gap between the two
measures.

Pure: no I/O, no clock (times are passed in), no threads; the caller serialises calls.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Protocol

from contracts import ElasticityItem, ElasticityQuery, ElasticityReply, ModelLoadWindow

from .oracle import measured_attainment

DEFAULT_MAX_WINDOWS = 50
DEFAULT_K_SIGMA = 2.0


class ElasticityOracle(Protocol):
    def elasticity(self, query: ElasticityQuery) -> ElasticityReply: ...


@dataclass(frozen=True)
class WindowScore:
    """One window: what the oracle predicted for it and what was measured."""

    model: str
    num_replicas: int
    measured: float
    predicted_mean: float
    predicted_std: float
    k_sigma: float
    source: str  # gp | roofline: what answered
    model_version: str
    at_s: float

    @property
    def error(self) -> float:
        """predicted - measured: > 0 when the oracle was optimistic."""
        return self.predicted_mean - self.measured

    @property
    def is_covered(self) -> bool:
        """The measurement fell inside predicted mean +- k_sigma * std."""
        return abs(self.error) <= self.k_sigma * self.predicted_std


@dataclass(frozen=True)
class DriftSummary:
    """A model's rolling figures over its last `num_windows` scored windows."""

    model: str
    num_windows: int  # in the rolling figures (<= max_windows)
    num_scored: int  # ever, for this model
    mean_abs_error: float
    bias: float  # mean of predicted - measured
    coverage: float  # share within mean +- k_sigma * std
    last: WindowScore
    # the same figures over the rolling windows that the version answering last predicted (after a refit, how the
    # new fit does, before the rolling window has turned over)
    num_windows_current: int
    mean_abs_error_current: float


class DriftTracker:
    def __init__(self, max_windows: int = DEFAULT_MAX_WINDOWS, k_sigma: float = DEFAULT_K_SIGMA) -> None:
        if max_windows < 1 or k_sigma < 0:
            raise ValueError("DriftTracker: max_windows >= 1 and k_sigma >= 0")
        self.max_windows = max_windows
        self.k_sigma = k_sigma
        self._scores: dict[str, deque[WindowScore]] = {}
        self._num_scored: dict[str, int] = {}

    @staticmethod
    def measured(window: ModelLoadWindow, num_replicas: int, attainment: float | None = None) -> float | None:
        """The window's measured attainment when it can be scored (requests, a replica, an attainment), else None."""
        value = measured_attainment(window) if attainment is None else attainment
        if window.num_requests == 0 or num_replicas < 1 or value is None:
            return None
        return float(value)

    def score(self, oracle: ElasticityOracle, window: ModelLoadWindow, num_replicas: int, now_s: float,
              attainment: float | None = None) -> WindowScore | None:
        """Predict the window's attainment at `num_replicas` and record it against the measurement (call this
        before the oracle learns from the window). None when the window cannot be scored, or the oracle does not
        know the model (no GP and no roofline) or refuses the question."""
        measured = self.measured(window, num_replicas, attainment)
        if measured is None:
            return None
        query = ElasticityQuery(items=(ElasticityItem(model=window.model, features=window.features,
                                                      replicas=(num_replicas,)),), k_sigma=self.k_sigma)
        try:
            (prediction,) = oracle.elasticity(query).predictions
        except (KeyError, ValueError):  # UnknownModelError is a KeyError
            return None
        score = WindowScore(model=window.model, num_replicas=num_replicas, measured=measured,
                            predicted_mean=float(prediction.attainment_mean[0]),
                            predicted_std=float(prediction.attainment_std[0]), k_sigma=self.k_sigma,
                            source=prediction.source, model_version=prediction.model_version, at_s=now_s)
        self.record(score)
        return score

    def record(self, score: WindowScore) -> None:
        scores = self._scores.get(score.model)
        if scores is None:
            scores = self._scores[score.model] = deque(maxlen=self.max_windows)
        scores.append(score)
        self._num_scored[score.model] = self._num_scored.get(score.model, 0) + 1

    @property
    def models(self) -> list[str]:
        return sorted(self._scores)

    def summary(self, model: str) -> DriftSummary | None:
        scores = self._scores.get(model)
        if not scores:
            return None
        n = len(scores)
        last = scores[-1]
        current = [abs(s.error) for s in scores if s.model_version == last.model_version]
        return DriftSummary(
            model=model, num_windows=n, num_scored=self._num_scored[model],
            mean_abs_error=sum(abs(s.error) for s in scores) / n, bias=sum(s.error for s in scores) / n,
            coverage=sum(s.is_covered for s in scores) / n, last=last, num_windows_current=len(current),
            mean_abs_error_current=sum(current) / len(current))

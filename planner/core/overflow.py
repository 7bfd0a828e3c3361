"""Steady-pool overflow: a steady model whose requests queue up is planned again now, not at the next period.

The steady planner runs every 30 s. A steady model whose traffic jumps between two plans (a small app's burst) is
served by its share of a shared device until then, and its burst queues at the dispatchers and is rejected. The
dispatchers' load windows carry their queue depth every 0.5 s; a steady model with requests queued in
`overflow_num_windows` windows in a row asks for an early steady plan (trigger "overflow"), and so does one whose
window's token rate is `overflow_rate_factor` times what its plan was made for (a burst that its shared device admits
into its batch misses its TPOT long before a queue forms). That plan sees the new
load: the pool assigner sends a volatile or large model to the elastic pool, where the scaler forks it replicas
within the next tick; otherwise refit gives it a bin with room. A model triggers an early plan at most every
`overflow_min_interval_s`, and any two early plans are at least `overflow_min_gap_s` apart, so a fleet where everyone
queues does not plan continuously. The interval is per model: when it was global, models that kept overflowing
triggered a plan every 15 s and a model whose burst began just after one waited up to 15 s (a 7B app lost 155
requests so on the headline's seed 1, docs/bench/sim.md run 22)."""
from __future__ import annotations

from collections.abc import Iterable

from contracts import ModelLoadWindow, SteadyPlan

from .policy import SteadyPolicy


class OverflowWatch:
    """Feed it every load window (`observe`); ask it every tick (`due`). Time is passed in."""

    def __init__(self, policy: SteadyPolicy) -> None:
        self.policy = policy
        # (model, dispatcher) -> windows in a row with requests queued: each dispatcher's windows are a series of
        # their own (a model whose requests queue at one of two dispatchers still overflows)
        self._queued_in_a_row: dict[tuple[str, str], int] = {}
        self._last_trigger_ms: float | None = None
        self._model_trigger_ms: dict[str, float] = {}  # a model's last early plan
        self._planned_tps: dict[str, float] = {}  # per model, the token rate the latest steady plan was made for

    def planned(self, plan: SteadyPlan) -> None:
        """The latest steady plan: the rates it sized its models for (the surge rule's reference)."""
        self._planned_tps = {w.model: w.features.token_rate_tps for w in plan.loads}

    def is_surging(self, window: ModelLoadWindow) -> bool:
        """Its rate is `overflow_rate_factor` times what its plan was made for: a burst lands on a shared device and
        misses its TPOT before a queue forms at the dispatchers (the instance admits it into its batch)."""
        factor = self.policy.overflow_rate_factor
        if factor <= 0:
            return False
        planned = max(self._planned_tps.get(window.model, 0.0), self.policy.overflow_min_rate_tps)
        return window.features.token_rate_tps >= factor * planned

    @property
    def is_enabled(self) -> bool:
        return self.policy.overflow_queue_depth > 0

    def observe(self, window: ModelLoadWindow) -> None:
        key = (window.model, window.dispatcher_id)
        if window.queue_depth >= self.policy.overflow_queue_depth > 0 or (self.is_enabled and self.is_surging(window)):
            self._queued_in_a_row[key] = self._queued_in_a_row.get(key, 0) + 1
        else:
            self._queued_in_a_row.pop(key, None)

    def overflowing(self, steady_models: Iterable[str]) -> list[str]:
        """The steady models whose requests queued in enough windows in a row."""
        need = self.policy.overflow_num_windows
        steady = set(steady_models)
        return sorted({m for (m, _), n in self._queued_in_a_row.items() if m in steady and n >= need})

    def due(self, now_ms: float, steady_models: Iterable[str]) -> list[str]:
        """The overflowing steady models when an early plan may run now (empty otherwise): each model at most every
        `overflow_min_interval_s`, any plan at least `overflow_min_gap_s` after the last. Calling it with a
        non-empty answer counts as a trigger for those models."""
        if not self.is_enabled:
            return []
        p = self.policy
        last = self._last_trigger_ms
        if last is not None and now_ms - last < p.overflow_min_gap_s * 1000.0:
            return []
        interval_ms = p.overflow_min_interval_s * 1000.0
        models = [m for m in self.overflowing(steady_models)
                  if now_ms - self._model_trigger_ms.get(m, float("-inf")) >= interval_ms]
        if models:
            self._last_trigger_ms = now_ms
            for m in models:
                self._model_trigger_ms[m] = now_ms
            for key in [k for k in self._queued_in_a_row if k[0] in models]:
                del self._queued_in_a_row[key]
        return models

"""What the oracle does with a dispatcher's load window, one rule for the live service (oracle/service.py) and the
simulated Janus (sim/systems/janus.py `_learn`).

Each dispatcher sees only the requests its queue group handed it, while every replica of the model serves all of
them: a window of one dispatcher out of two carries half the model's load against the full replica count, and learnt
as it is, it teaches the GP that a replica serves twice what it does. So windows are merged per model across the
dispatchers first, as the planners merge them (`contracts.load_book`: the latest window of each dispatcher not
silent for three window lengths), and a merged window is scored and learnt only when those windows cover about the
same stretch of time (they end within `ALIGNED_WITHIN_WINDOWS` of a window length of each other; windows slide and
are published every 0.5 s, so live dispatchers always do): a dispatcher seconds late would mix two stretches of
load."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from contracts import ModelLoadWindow
from contracts.load_book import LoadBook, merge_windows

from .drift import DriftTracker, ElasticityOracle, WindowScore
from .replicas import ReplicaCounts

ALIGNED_WITHIN_WINDOWS = 0.5


class Learner(Protocol):
    def observe(self, window: ModelLoadWindow, num_replicas: int, attainment: float | None = None,
                needs_per_replica=None, replicas_since_ms: float | None = None) -> bool: ...


@dataclass(frozen=True)
class Intake:
    window: ModelLoadWindow | None  # the merged window taken (None: waiting for the other dispatchers)
    score: WindowScore | None
    is_learnt: bool


class WindowIntake:
    def __init__(self, drift: DriftTracker, replica_counts: ReplicaCounts, stale_after_windows: float = 3.0) -> None:
        self.drift = drift
        self.replica_counts = replica_counts
        self.loads = LoadBook(stale_after_windows)

    def take(self, window: ModelLoadWindow, predictor: ElasticityOracle, learner: Learner, now_s: float) -> Intake:
        """Merge `window` with the model's other dispatchers' latest; when they cover the same stretch, score the
        merged window with `predictor` (before it is learnt) and hand it to `learner` against the replicas serving."""
        self.loads.record(window)
        windows = self.loads.fresh(window.model, window.end_unix_ms)
        newest_ms = max(w.end_unix_ms for w in windows)
        slack_ms = ALIGNED_WITHIN_WINDOWS * window.window_s * 1e3
        if any(newest_ms - w.end_unix_ms > slack_ms for w in windows):
            return Intake(None, None, False)  # a dispatcher has not reported this stretch yet
        merged = merge_windows(windows)
        num_replicas = self.replica_counts.count(merged.model)
        score = self.drift.score(predictor, merged, num_replicas, now_s)
        is_learnt = learner.observe(merged, num_replicas, replicas_since_ms=self.replica_counts.since_ms(merged.model))
        return Intake(merged, score, is_learnt)

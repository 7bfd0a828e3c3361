"""Refits off the prediction path, in the oracle service: a daemon thread that asks the oracle which models are due
and refits them one at a time, and the lock that lets it share the pure core (oracle.core.Oracle, which holds none)
with the service's event loop. The clock is injected (the service passes time.monotonic; tests pass their own).

The thread and the lock live here, in the service's layer, not in the core: a core takes its inputs and time as
arguments and runs no thread, no clock and no log (docs/architecture.md, "Layers")."""
from __future__ import annotations

import logging
import threading
from typing import Callable, Protocol, Sequence

from contracts import ModelLoadWindow, NeedVector

from .core import Oracle, TrainingSet
from .core.dataset import CapacitySample, ElasticitySample

log = logging.getLogger(__name__)


class SharedOracle:
    """The core Oracle shared by the service's event loop (samples in) and the refit thread. One lock guards the
    samples and the refit bookkeeping, never a prediction: a refit takes a snapshot of the samples under the lock,
    trains outside it (seconds), swaps the new predictor in with one assignment and records the fit under the lock.
    Predictions and reports go to `oracle` directly, from the event loop: they read one dict entry or a length, and
    the refit thread writes single entries (a predictor, a fit's bookkeeping)."""

    def __init__(self, oracle: Oracle) -> None:
        self.oracle = oracle
        self._lock = threading.Lock()

    def add_training_set(self, training_set: TrainingSet) -> None:
        with self._lock:
            self.oracle.add_training_set(training_set)

    def add_samples(self, model: str, capacity: Sequence[CapacitySample] = (),
                    elasticity: Sequence[ElasticitySample] = ()) -> None:
        with self._lock:
            self.oracle.add_samples(model, capacity, elasticity)

    def observe(self, window: ModelLoadWindow, num_replicas: int, attainment: float | None = None,
                needs_per_replica: NeedVector | None = None, replicas_since_ms: float | None = None) -> bool:
        with self._lock:
            return self.oracle.observe(window, num_replicas, attainment, needs_per_replica, replicas_since_ms)

    def due_for_refit(self, now_s: float) -> list[tuple[str, str]]:
        with self._lock:
            return self.oracle.due_for_refit(now_s)

    def refit(self, model: str, kind, now_s: float) -> str:
        """Oracle.refit's three steps, the training outside the lock. Returns the new version."""
        with self._lock:
            samples = self.oracle.refit_samples(model, kind, now_s)
        version = self.oracle.fit(model, kind, samples)
        with self._lock:
            self.oracle.fitted(model, kind, len(samples))
        return version


class Refittable(Protocol):
    """What the refitter calls: a SharedOracle wherever another thread adds samples meanwhile (a bare Oracle for
    a single thread)."""

    def due_for_refit(self, now_s: float) -> list[tuple[str, str]]: ...

    def refit(self, model: str, kind, now_s: float) -> str: ...


class BackgroundRefitter:
    def __init__(self, oracle: Refittable, clock: Callable[[], float], poll_s: float = 1.0,
                 on_refit: Callable[[str, str, str], None] | None = None):
        if poll_s <= 0:
            raise ValueError("poll_s must be > 0")
        self.oracle = oracle
        self.clock = clock
        self.poll_s = poll_s
        self.on_refit = on_refit  # (model, kind, version): the shell logs or publishes it
        self.num_refits = 0
        self.num_failures = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> list[str]:
        """Refit every (model, kind) due now; returns the new versions. A failed fit keeps the old predictor."""
        versions = []
        for model, kind in self.oracle.due_for_refit(self.clock()):
            if self._stop.is_set():
                break
            try:
                version = self.oracle.refit(model, kind, self.clock())
            except Exception:  # noqa: BLE001 - a bad fit must not kill the thread; the old model keeps serving
                self.num_failures += 1
                log.exception("refit of %s %s failed; keeping the previous model", model, kind)
                continue
            self.num_refits += 1
            versions.append(version)
            if self.on_refit:
                self.on_refit(model, kind, version)
        return versions

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("already started")
        self._thread = threading.Thread(target=self._loop, name="oracle-refit", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Check for due refits now rather than at the next poll."""
        self._wake.set()

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.run_once()
            self._wake.wait(self.poll_s)
            self._wake.clear()

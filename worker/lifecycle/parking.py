"""Parking an engine: take it out of the worker's engine loop and be sure no step of it is still running.

The engine loop steps engines from its own thread. Before a lifecycle operation releases or refills an engine's
pages, that thread must be done with the engine: a step running over unmapped pages faults (on the CPU backend, the
process dies). `SteppedEngine` wraps the engine the loop sees; `park()` waits for a step in progress and makes the
loop skip the engine from then on.
"""
from __future__ import annotations

import threading
from typing import Any, Callable


class SteppedEngine:
    """What the engine loop holds for one instance: the engine, behind a lock that a step holds throughout."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._step_lock = threading.Lock()
        self._is_parked = False

    def has_unfinished(self) -> bool:
        return not self._is_parked and self.engine.has_unfinished()

    def step(self):
        with self._step_lock:
            if self._is_parked:
                return []
            return self.engine.step()

    def between_steps(self, fn: Callable[[Any], Any]) -> Any:
        """Run `fn(engine)` with no step running and none starting meanwhile; skipped (None) once parked."""
        with self._step_lock:
            if self._is_parked:
                return None
            return fn(self.engine)

    def park(self) -> None:
        """Returns once no step is running and none will start."""
        with self._step_lock:
            self._is_parked = True

    @property
    def is_parked(self) -> bool:
        return self._is_parked

    def __getattr__(self, name: str) -> Any:
        # add_request, abort, stats, ...: straight to the engine (they are thread-safe there)
        return getattr(self.engine, name)

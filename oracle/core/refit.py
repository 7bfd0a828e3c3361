"""Refits off the prediction path: a daemon thread that asks the oracle which models are due and refits them one
at a time. The clock is injected (the service passes time.monotonic; tests pass their own)."""
from __future__ import annotations

import logging
import threading
from typing import Callable

from .oracle import Oracle

log = logging.getLogger(__name__)


class BackgroundRefitter:
    def __init__(self, oracle: Oracle, clock: Callable[[], float], poll_s: float = 1.0,
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

"""One thread that steps every resident engine of the worker.

The asyncio side (the service) adds requests and publishes outputs; model math stays off the event loop. Engines
are stepped in turn, so co-located models share the device fairly; a failing engine fails its own requests only.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable

log = logging.getLogger("janus.worker.loop")

OutputSink = Callable[[str, list[Any]], None]
FailureSink = Callable[[str, BaseException], None]
BetweenSteps = Callable[[str, Any], None]  # (instance id, engine): maintenance after the engine's turn


class EngineLoop:
    def __init__(self, on_outputs: OutputSink, on_failure: FailureSink, *, idle_wait_s: float = 0.05,
                 between_steps: BetweenSteps | None = None) -> None:
        self._engines: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._on_outputs = on_outputs
        self._on_failure = on_failure
        self._idle_wait_s = idle_wait_s
        self._between_steps = between_steps
        self._thread: threading.Thread | None = None
        self.num_steps = 0

    def add(self, instance_id: str, engine: Any) -> None:
        with self._lock:
            self._engines[instance_id] = engine
        self.wake()

    def remove(self, instance_id: str) -> Any | None:
        with self._lock:
            return self._engines.pop(instance_id, None)

    def get(self, instance_id: str) -> Any | None:
        with self._lock:
            return self._engines.get(instance_id)

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="janus-engine-loop", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                engines = list(self._engines.items())
            did_work = False
            for instance_id, engine in engines:
                try:
                    if engine.has_unfinished():
                        outputs = engine.step()
                        did_work = True
                        self.num_steps += 1
                        if outputs:
                            self._on_outputs(instance_id, outputs)
                    # between two steps of this engine (also while it idles: its weights may still have to move)
                    if self._between_steps is not None:
                        self._between_steps(instance_id, engine)
                except BaseException as exc:  # noqa: BLE001 - reported, the loop goes on for other engines
                    log.exception("engine of %s failed", instance_id)
                    self.remove(instance_id)
                    self._on_failure(instance_id, exc)
            if not did_work:
                self._wake.wait(self._idle_wait_s)
                self._wake.clear()

"""The per-model mapped-page cache for KV: the watermark rule, and the thread that applies it in the background.

Each model keeps a few KV pages mapped into its view but not handed out. `acquire_kv_pages` takes from there (no
driver call); when the cache falls below the low watermark the thread maps pages up to the high watermark, and when
released pages push it above the high watermark the thread unmaps the excess (highest physical pages first, so KV
stays packed at the low end of the pool) and returns it to the pool. The rule itself is applied, owner by owner, in
`KvPagesMixin._kv_maintenance_pass` (kv_pages.py), which this thread runs.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

log = logging.getLogger(__name__)


class KvRefillThread:
    """Runs `run_pass` (one maintenance pass over every model; True when it did work) whenever woken, and every
    `poll_s` seconds in any case. A failing pass is logged and kept in `last_error`; the thread keeps running."""

    def __init__(self, run_pass: Callable[[], bool], poll_s: float, name: str = "xtensor-kv-refill") -> None:
        self._run_pass = run_pass
        self._poll_s = poll_s
        self._wake_event = threading.Event()
        self._is_stopping = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.last_error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive()

    def wake(self) -> None:
        if not self._wake_event.is_set():  # is_set is a plain read; set() takes a lock: keep it off the hot path
            self._wake_event.set()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._is_stopping = True
        self._wake_event.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _loop(self) -> None:
        while not self._is_stopping:
            self._wake_event.wait(self._poll_s)
            self._wake_event.clear()
            try:
                while not self._is_stopping and self._run_pass():
                    pass
            except Exception as exc:  # keep serving: the request path falls back to mapping on demand
                self.last_error = exc
                log.exception("xTensor KV refill pass failed")

"""Stop strings on a text stream: never let a stop string (or any part of one) reach the client."""
from __future__ import annotations

from typing import Sequence


class StopStringMatcher:
    """Push text deltas in, get text that is safe to emit out.

    Text that could still grow into a stop string is held back; when a stop string appears, everything before it
    is emitted and the stop string itself never is. Because every suffix that is a prefix of a stop string is held,
    a stop string can never begin inside text already emitted.
    """

    def __init__(self, stop: Sequence[str]) -> None:
        if any(not s for s in stop):
            raise ValueError("stop strings must not be empty")
        self._stop = tuple(stop)
        self._held = ""
        self.is_stopped = False

    @property
    def held_text(self) -> str:
        return self._held

    def push(self, delta: str) -> str:
        """Add `delta`; return the text now safe to emit. After a stop string, `is_stopped` is True and all
        further text is dropped."""
        if self.is_stopped:
            return ""
        if not self._stop:
            return delta
        pending = self._held + delta
        cut = min((i for i in (pending.find(s) for s in self._stop) if i >= 0), default=-1)
        if cut >= 0:
            self.is_stopped = True
            self._held = ""
            return pending[:cut]
        num_hold = self._longest_stop_prefix_suffix(pending)
        self._held = pending[len(pending) - num_hold :] if num_hold else ""
        return pending[: len(pending) - num_hold]

    def flush(self) -> str:
        """The stream ends for another reason: the held text was not a stop string after all."""
        held, self._held = self._held, ""
        return "" if self.is_stopped else held

    def _longest_stop_prefix_suffix(self, text: str) -> int:
        best = 0
        for s in self._stop:
            for k in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:k]):
                    best = k
                    break
        return best

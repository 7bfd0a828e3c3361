"""EPDT (expected prefill-done time) of one prefill instance, kept from predictions and corrected by completions.

The instance is modelled as running its prefills in the order they were assigned. Invariants after an event at
time t (checked by the property tests): with pending work, t <= epdt_ms <= t + pending_ms; without, epdt_ms <= t.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class _Outstanding:
    predicted_ms: float
    seq: int  # assignment order on this instance
    # A later-assigned request finished first, so this one has surely started: its time is no longer ahead of us,
    # but it stays outstanding (its first token has not been reported) in case the instance dies.
    is_presumed_started: bool = False


class PrefillLedger:
    """Outstanding prefills of one instance (assigned, first token not yet reported) and its EPDT."""

    def __init__(self, instance_id: str) -> None:
        self.instance_id = instance_id
        self.epdt_ms = float("-inf")
        self._outstanding: dict[str, _Outstanding] = {}  # insertion order = assignment order
        self._pending_ms = 0.0  # predicted time of outstanding prefills not presumed started
        self._next_seq = 0
        # an index keeping instances in order (least_load.LeastLoadIndex): told of every change by this position
        self._watcher: list[int] | None = None
        self._slot = 0

    def watch(self, dirty: list[int], slot: int) -> None:
        """Append `slot` to `dirty` whenever the EPDT or the outstanding count may have changed."""
        self._watcher, self._slot = dirty, slot

    def unwatch(self, dirty: list[int]) -> None:
        if self._watcher is dirty:
            self._watcher = None

    def _changed(self) -> None:
        if self._watcher is not None:
            self._watcher.append(self._slot)

    @property
    def pending_ms(self) -> float:
        """Predicted prefill time still ahead of the instance."""
        return self._pending_ms

    @property
    def num_outstanding(self) -> int:
        return len(self._outstanding)

    def outstanding_ids(self) -> list[str]:
        """Requests sent here whose first token has not been reported, in assignment order."""
        return list(self._outstanding)

    def is_outstanding(self, request_id: str) -> bool:
        return request_id in self._outstanding

    def available_ms(self, now_ms: float) -> float:
        """T_i: when the instance is expected to be free for new work."""
        return max(now_ms, self.epdt_ms)

    def assign(self, now_ms: float, request_id: str, predicted_ms: float) -> float:
        """Queue a prefill behind the outstanding ones; returns its expected completion time."""
        if request_id in self._outstanding:
            raise ValueError(f"request {request_id!r} is already outstanding on {self.instance_id!r}")
        if not predicted_ms >= 0:
            raise ValueError(f"predicted prefill time must be >= 0, got {predicted_ms!r}")
        self._outstanding[request_id] = _Outstanding(predicted_ms, self._next_seq)
        self._next_seq += 1
        self._pending_ms += predicted_ms
        self.epdt_ms = max(self.epdt_ms, now_ms) + predicted_ms
        self._changed()
        return self.epdt_ms

    def complete(self, now_ms: float, request_id: str) -> bool:
        """A prefill finished (or failed) at now_ms: correct the EPDT to now + what is still queued behind it.
        Returns False for a request this ledger does not hold (duplicate or unknown report)."""
        entry = self._outstanding.pop(request_id, None)
        if entry is None:
            return False
        self._changed()
        if entry.is_presumed_started:
            # Its time was already taken out of the EPDT when a later request completed.
            return True
        # Everything assigned before it has started too (FIFO), even if its report is still on the way.
        pending_ms = 0.0
        for other in self._outstanding.values():
            if other.seq < entry.seq:
                other.is_presumed_started = True
            elif not other.is_presumed_started:
                pending_ms += other.predicted_ms
        self._pending_ms = pending_ms
        self.epdt_ms = now_ms + pending_ms
        return True

    def remove(self, now_ms: float, request_id: str) -> bool:
        """The request was cancelled: its predicted time no longer lies ahead. False when not held."""
        entry = self._outstanding.pop(request_id, None)
        if entry is None:
            return False
        self._changed()
        if not entry.is_presumed_started:
            self._pending_ms -= entry.predicted_ms
            self.epdt_ms = max(now_ms, self.epdt_ms - entry.predicted_ms)
        if not self._outstanding:  # nothing lies ahead: no float residue of the subtraction may linger
            self._pending_ms = 0.0
            self.epdt_ms = min(self.epdt_ms, now_ms)
        return True

    def clear(self, now_ms: float) -> list[str]:
        """The instance is gone: forget everything, return what was outstanding (assignment order)."""
        ids = list(self._outstanding)
        self._changed()
        self._outstanding.clear()
        self._pending_ms = 0.0
        self.epdt_ms = min(self.epdt_ms, now_ms)
        return ids

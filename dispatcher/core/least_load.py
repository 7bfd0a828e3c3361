"""Least-load's choice without a scan: the routable instance with the least (max(now, EPDT), outstanding, id).

A baseline round used to build that key for every instance of the model and take the minimum, on every arrival: a
third of a simulated BlitzScale-like run on models with hundreds of instances. The key orders busy instances
(EPDT after now) by EPDT, and every free one at `now`, so by (outstanding, id). Two lazy heaps hold them: busy
entries move to the free heap once the clock passes their EPDT (the core's clock never goes back), and a ledger that
changes (an assignment, a completion, a cancel, a loss) marks itself dirty, so that the index pushes its current
entry before the next choice; older entries of it are stale and dropped when they reach a top.
"""
from __future__ import annotations

import heapq
from typing import Sequence

from .epdt import PrefillLedger


class LeastLoadIndex:
    """Over one model's routable ledgers (the registry view's cached tuple, in the order of its instances)."""

    def __init__(self, ledgers: Sequence[PrefillLedger]) -> None:
        self.ledgers = ledgers
        self.dirty: list[int] = []
        self._versions = [0] * len(ledgers)
        for slot, ledger in enumerate(ledgers):
            ledger.watch(self.dirty, slot)
        # (EPDT, outstanding, id, version, slot) and (outstanding, id, version, slot)
        self._busy = [(led.epdt_ms, led.num_outstanding, led.instance_id, 0, slot) for slot, led in enumerate(ledgers)]
        heapq.heapify(self._busy)
        self._free: list[tuple[int, str, int, int]] = []

    def close(self) -> None:
        """The routable set changed: the ledgers stop reporting here."""
        for ledger in self.ledgers:
            ledger.unwatch(self.dirty)

    def choose(self, now_ms: float) -> int:
        """The position of the least-loaded instance at now_ms (the core's monotone clock)."""
        versions, busy, free = self._versions, self._busy, self._free
        if self.dirty:
            for slot in set(self.dirty):
                versions[slot] += 1
                led = self.ledgers[slot]
                heapq.heappush(busy, (led.epdt_ms, led.num_outstanding, led.instance_id, versions[slot], slot))
            self.dirty.clear()
        while busy and busy[0][0] <= now_ms:  # free by now: ordered from here on by (outstanding, id)
            _, outstanding, instance_id, version, slot = heapq.heappop(busy)
            if version == versions[slot]:
                heapq.heappush(free, (outstanding, instance_id, version, slot))
        while free and free[0][2] != versions[free[0][3]]:
            heapq.heappop(free)
        if free:
            return free[0][3]
        while busy[0][3] != versions[busy[0][4]]:
            heapq.heappop(busy)
        return busy[0][4]

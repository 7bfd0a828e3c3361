"""Compaction of a worker's page pool between its engines' steps: reads the pool and the instance, asks the policy
(worker/core/compaction.py), and carries out its decision. Runs in the engine-loop thread, with the instance's engine
not stepping and not parked (`SteppedEngine.between_steps`), so moving its pages races with nothing of its own.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from ..core.compaction import (
    CompactionPolicy,
    OwnerReading,
    can_weights_slide,
    fragmentation_of,
    plan_compaction,
    weight_page_runs,
)
from ..lifecycle.instance import ModelInstance
from ..lifecycle.verify import has_weights


class Compactor:
    """One per worker, over its page pool (worker.xtensor.XTensor)."""

    def __init__(self, pages: Any, policy: CompactionPolicy | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.pages = pages
        self.policy = policy or CompactionPolicy()
        self._clock = clock
        self._withdrawn_since_s: dict[str, float] = {}
        self.num_pages_moved = 0
        self.num_withdrawals = 0
        self.num_readvertisements = 0

    def reset(self, owner: str) -> None:
        """The instance starts serving with freshly recorded segments (after a wake, fork or load)."""
        self._withdrawn_since_s.pop(owner, None)

    def is_withdrawn(self, owner: str) -> bool:
        return owner in self._withdrawn_since_s

    def between_steps(self, inst: ModelInstance, engine: Any) -> int:
        """Compact what the policy allows for this instance now. Returns the pages moved."""
        if not has_weights(engine):
            return 0  # an engine without pages in the pool (the echo engine)
        owner = inst.owner
        free_runs = self.pages.free_runs()
        fragmentation = fragmentation_of(free_runs)
        withdrawn_s = self._withdrawn_since_s.get(owner)
        if withdrawn_s is None and (fragmentation <= self.policy.min_fragmentation
                                    or self.policy.max_moves_per_step == 0):
            return 0  # the usual answer, without taking the engine's lock
        now_s = self._clock()
        num_moved = 0
        # no reservation (whose offsets would go to a peer) can be made while the KV pages may move
        with engine.kv_layout_lock():
            runs = weight_page_runs(self.pages.weight_segments(owner), self.pages.page_size_bytes)
            reading = OwnerReading(fragmentation, engine.is_kv_exported(), can_weights_slide(runs, free_runs),
                                   withdrawn_s)
            step = plan_compaction(now_s, reading, self.policy)
            if step.withdraw_segments:
                inst.segments = ()  # the heartbeat offers no fork from this instance any more
                self._withdrawn_since_s[owner] = now_s
                self.num_withdrawals += 1
            if step.moves_pages:
                num_moved = self.pages.compact(owner, step.max_moves, is_kv=step.is_kv, is_weights=step.is_weights)
        if step.readvertise_segments:
            inst.record_segments()  # new offsets, the same checksums: forks may pull from here again
            del self._withdrawn_since_s[owner]
            self.num_readvertisements += 1
        self.num_pages_moved += num_moved
        return num_moved

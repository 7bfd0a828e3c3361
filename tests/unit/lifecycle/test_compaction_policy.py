"""When a worker compacts (worker/core/compaction.py): never KV pages another party addresses by offset, weights only
after their advertisement was withdrawn for the fork-quiet time, and re-advertised once they stop moving."""
from __future__ import annotations

import pytest

from worker.core.compaction import (
    CompactionPolicy,
    OwnerReading,
    can_weights_slide,
    fragmentation_of,
    plan_compaction,
    weight_page_runs,
)

POLICY = CompactionPolicy(max_moves_per_step=8, min_fragmentation=0.01, fork_quiet_s=5.0)


def _reading(fragmentation=0.2, exported=False, slide=False, withdrawn=None) -> OwnerReading:
    return OwnerReading(fragmentation, exported, slide, withdrawn)


def test_kv_moves_when_fragmented_and_not_addressed_by_peers():
    step = plan_compaction(100.0, _reading(), POLICY)
    assert step.is_kv and not step.is_weights and step.max_moves == 8 and step.moves_pages
    assert not plan_compaction(100.0, _reading(fragmentation=0.005), POLICY).moves_pages  # below the threshold
    assert not plan_compaction(100.0, _reading(exported=True), POLICY).moves_pages  # a reservation or a hand-over
    off = CompactionPolicy(max_moves_per_step=0)
    assert plan_compaction(100.0, _reading(slide=True), off) == plan_compaction(0.0, _reading(), off)


def test_weights_move_only_after_the_fork_quiet_time_and_are_readvertised_after():
    first = plan_compaction(100.0, _reading(slide=True), POLICY)
    assert first.withdraw_segments and not first.is_weights
    waiting = plan_compaction(104.9, _reading(slide=True, withdrawn=100.0), POLICY)
    assert not waiting.is_weights and not waiting.withdraw_segments and waiting.is_kv
    moving = plan_compaction(105.0, _reading(slide=True, withdrawn=100.0, exported=True), POLICY)
    assert moving.is_weights and not moving.is_kv and moving.max_moves == 8  # weights do not care about KV peers
    done = plan_compaction(106.0, _reading(fragmentation=0.0, slide=False, withdrawn=100.0), POLICY)
    assert done.readvertise_segments and not done.moves_pages
    # the hole was taken by someone else meanwhile: offer the weights again all the same
    assert plan_compaction(101.0, _reading(slide=False, withdrawn=100.0), POLICY).readvertise_segments


def test_reading_the_pool():
    assert weight_page_runs([(10 * 64, 3 * 64), (20 * 64, 64 + 5)], 64) == [(10, 3), (20, 2)]
    assert can_weights_slide([(10, 3)], [(0, 4), (13, 2)]) and not can_weights_slide([(10, 3)], [(0, 4), (14, 2)])
    assert fragmentation_of([(0, 6), (20, 2)]) == pytest.approx(0.25) and fragmentation_of([]) == 0.0
    with pytest.raises(ValueError):
        CompactionPolicy(min_fragmentation=1.0)

"""When a worker compacts an instance's pages, and which ones: pure policy (plain readings in, a decision out, the
clock passed in). The worker runs the decision between two steps of that instance's engine (worker/shell/compactor.py).

xTensor's `compact(owner, max_moves, is_kv=..., is_weights=...)` moves pages under live views (docs/xtensor.md). Its
contract, which this policy keeps:
- KV pages move only while no global offset of them is in use elsewhere: no P/D reservation handed to a prefill
  worker (it writes there), no finished prefill whose blocks are being written out (read by global offset).
- Weight pages move only while no fork can be pulling them. The source of a fork does nothing during the pull (the
  target reads by global offset from the segments the source's heartbeat advertised), so the worker first stops
  advertising the instance's segments (`withdraw`), waits `fork_quiet_s` for pulls that started from an older
  heartbeat to end, then moves; when nothing is left to slide it records the segments again (new offsets, same
  checksums) and advertises them (`readvertise`). A pull that still straddled a move fails its checksums and falls
  back: never silent.
- Bounded: at most `max_moves_per_step` pages per engine step (a KV move copies one page).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class CompactionPolicy:
    max_moves_per_step: int = 8
    # compact only while this share of the free pages lies outside the largest free run (the heartbeat's figure)
    min_fragmentation: float = 0.002
    fork_quiet_s: float = 10.0

    def __post_init__(self) -> None:
        if self.max_moves_per_step < 0 or not 0.0 <= self.min_fragmentation < 1.0 or self.fork_quiet_s < 0:
            raise ValueError("CompactionPolicy: max_moves_per_step >= 0, 0 <= min_fragmentation < 1, "
                             "fork_quiet_s >= 0")


@dataclass(frozen=True)
class OwnerReading:
    """One instance's pages as read between two of its engine's steps."""

    fragmentation: float  # of the whole pool: free pages outside the largest free run / free pages
    is_kv_exported: bool  # a peer may write its KV blocks, or they are being written out, by global offset
    can_weights_slide: bool  # a free run starts right above one of its weight runs
    segments_withdrawn_since_s: float | None  # when its weight segments stopped being advertised; None: advertised


@dataclass(frozen=True)
class CompactionStep:
    is_kv: bool = False
    is_weights: bool = False
    max_moves: int = 0
    withdraw_segments: bool = False  # stop offering the weights to forks (heartbeat) from now on
    readvertise_segments: bool = False  # re-record the segments (offsets moved) and offer them again

    @property
    def moves_pages(self) -> bool:
        return self.max_moves > 0 and (self.is_kv or self.is_weights)


def plan_compaction(now_s: float, reading: OwnerReading, policy: CompactionPolicy) -> CompactionStep:
    withdrawn_s = reading.segments_withdrawn_since_s
    if withdrawn_s is not None and not reading.can_weights_slide:
        # the slide is done (or the hole was taken): offer the weights again, at their new offsets; KV may still move
        is_kv = not reading.is_kv_exported and reading.fragmentation > policy.min_fragmentation
        return CompactionStep(is_kv=is_kv, max_moves=policy.max_moves_per_step if is_kv else 0,
                              readvertise_segments=True)
    if policy.max_moves_per_step == 0 or reading.fragmentation <= policy.min_fragmentation:
        return CompactionStep()
    is_kv = not reading.is_kv_exported
    is_weights = False
    withdraw = False
    if reading.can_weights_slide:
        if withdrawn_s is None:
            withdraw = True
        elif now_s - withdrawn_s >= policy.fork_quiet_s:
            is_weights = True
    moves = policy.max_moves_per_step if (is_kv or is_weights) else 0
    return CompactionStep(is_kv=is_kv, is_weights=is_weights, max_moves=moves, withdraw_segments=withdraw)


def weight_page_runs(segments: Iterable[tuple[int, int]], page_size_bytes: int) -> list[tuple[int, int]]:
    """(first page, num pages) of each weight segment (global offset, bytes); the last one may end mid-page."""
    return [(offset // page_size_bytes, -(-num_bytes // page_size_bytes)) for offset, num_bytes in segments]


def can_weights_slide(weight_runs: Iterable[tuple[int, int]], free_runs: Iterable[tuple[int, int]]) -> bool:
    """Whether xTensor's weight compaction would move anything: a free run starts where a weight run ends."""
    free_starts = {start for start, _ in free_runs}
    return any(first + num in free_starts for first, num in weight_runs)


def fragmentation_of(free_runs: Iterable[tuple[int, int]]) -> float:
    """Free pages outside the largest free run / free pages (0 with none free), as the pool's counters say."""
    lengths = [num for _, num in free_runs]
    total = sum(lengths)
    return 1.0 - max(lengths) / total if total else 0.0

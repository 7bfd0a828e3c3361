"""Periodic global consolidation of the steady pool under a migration budget.

A move drains a model on one device and wakes it on another, so consolidation only pays when it frees devices.
Two candidates, the better one wins (fewest bins, then fewest moves):
  - incremental: empty the least-filled bins one at a time into the others (each emptied bin costs its models);
  - fresh: repack everything from scratch, then keep as many models in place as possible by matching the new bins
    to the current ones (an assignment problem), and count the models that still have to move.
Either is taken only within `max_num_moves`."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from .greedy import eliminate_bins, pack_phi
from .packing import Packing


@dataclass(frozen=True)
class ConsolidationOutcome:
    packing: Packing
    moves: tuple[tuple[str, str, str], ...]  # (model, from bin, to bin)
    num_bins_before: int
    num_bins_after: int
    method: str  # "none" | "incremental" | "fresh"

    @property
    def num_bins_freed(self) -> int:
        return self.num_bins_before - self.num_bins_after


def consolidate(
    packing: Packing, max_num_moves: int, new_bin_id: Callable[[], str], seed: int = 0
) -> ConsolidationOutcome:
    """A new packing of the same models using fewer bins with at most `max_num_moves` moves, or the same packing
    (method "none") when no candidate frees a bin within the budget. Does not mutate `packing`."""
    before = packing.num_bins
    best = ConsolidationOutcome(packing.copy(), (), before, before, "none")
    if max_num_moves <= 0 or before <= 1:
        return best

    inc = packing.copy()
    inc_moves = eliminate_bins(inc, max_num_moves=max_num_moves)
    if inc.num_bins < before:
        best = ConsolidationOutcome(inc, tuple(inc_moves), before, inc.num_bins, "incremental")

    needs = {m: packing.need_of(m) for m in packing.models()}
    fresh = pack_phi(needs, seed=seed)
    if fresh.num_bins < best.num_bins_after:
        mapped, moves = keep_in_place(packing, fresh, new_bin_id)
        if len(moves) <= max_num_moves:
            best = ConsolidationOutcome(mapped, tuple(moves), before, mapped.num_bins, "fresh")
    return best


def keep_in_place(
    current: Packing, fresh: Packing, new_bin_id: Callable[[], str]
) -> tuple[Packing, list[tuple[str, str, str]]]:
    """Rename `fresh`'s bins to current bin ids so that the most models stay where they are."""
    cur_bins = current.bins
    new_bins = fresh.bins
    overlap = np.zeros((len(new_bins), len(cur_bins)))
    for i, nb in enumerate(new_bins):
        for j, cb in enumerate(cur_bins):
            overlap[i, j] = len(nb.needs.keys() & cb.needs.keys())
    rows, cols = linear_sum_assignment(-overlap)
    name = {i: cur_bins[j].bin_id for i, j in zip(rows, cols)}
    taken = {b.bin_id for b in cur_bins}
    out = Packing()
    moves: list[tuple[str, str, str]] = []
    for i, nb in enumerate(new_bins):
        bid = name.get(i)
        while bid is None or (i not in name and bid in taken):
            bid = new_bin_id()  # a fresh bin beyond the current ones takes a device no current bin holds
        out.open_bin(bid)
        for m, need in nb.needs.items():
            out.put(m, need, bid)
            src = current.bin_of(m)
            if src != bid:
                moves.append((m, src, bid))  # type: ignore[arg-type]
    return out, moves

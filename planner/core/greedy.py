"""Packing a whole set of models at once: the Phi rule over several item orders, the bin-elimination pass, the
first-fit-decreasing baseline, and a lower bound on the bin count."""
from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence

from .packing import FIT_EPS, Packing, Vec, as_needs, best_phi_bin, counter_ids, place_phi

# Sort keys for "largest first". Several orders because one order is bad on some shapes (an HBM-heavy model sorted
# after compute-heavy ones, say); trying each costs microseconds for tens of models.
ORDER_KEYS: dict[str, Callable[[Vec], tuple[float, ...]]] = {
    "max": lambda v: (max(v), sum(v)),
    "sum": lambda v: (sum(v), max(v)),
    "l2": lambda v: (v[0] * v[0] + v[1] * v[1] + v[2] * v[2], sum(v)),
    "hbm": lambda v: (v[0], sum(v)),
    "compute": lambda v: (v[1], sum(v)),
    "bandwidth": lambda v: (v[2], sum(v)),
}
DEFAULT_ORDERS: tuple[str, ...] = tuple(ORDER_KEYS)
RESTART_WORK, MIN_RESTARTS, MAX_RESTARTS = 90_000, 16, 512


def sorted_models(needs: Mapping[str, Vec], order: str) -> list[str]:
    """Largest first by `order`; ties by name, so a packing never depends on dict order."""
    key = ORDER_KEYS[order]
    return sorted(needs, key=lambda m: (tuple(-x for x in key(needs[m])), m))


def lower_bound(needs: Mapping[str, Vec]) -> int:
    """No packing uses fewer bins: the summed need in each dimension, and models that cannot share a bin because
    each takes more than half of one dimension."""
    if not needs:
        return 0
    bound = 0
    for d in range(3):
        bound = max(bound, math.ceil(sum(v[d] for v in needs.values()) - FIT_EPS))
        bound = max(bound, sum(1 for v in needs.values() if v[d] > 0.5 + FIT_EPS))
    return max(bound, 1)


def pack_phi_order(needs: Mapping[str, Vec], order: str = "max") -> Packing:
    """The paper's greedy in one item order: each model where it fits and Phi grows least."""
    packing = Packing()
    new_id = counter_ids()
    for model in sorted_models(needs, order):
        place_phi(packing, model, needs[model], new_id)
    return packing


def eliminate_bins(packing: Packing, max_num_moves: int | None = None) -> list[tuple[str, str, str]]:
    """Empty bins by moving all their models into other open bins (by the Phi rule), least-filled bin first, until
    no bin can be emptied or the move budget is spent. Mutates `packing`; returns (model, from, to) moves."""
    moves: list[tuple[str, str, str]] = []
    improved = True
    while improved:
        improved = False
        for b in sorted(packing, key=lambda b: (len(b.needs), sum(b.used), b.bin_id)):
            num_left = None if max_num_moves is None else max_num_moves - len(moves)
            if num_left is not None and len(b.needs) > num_left:
                continue
            trial_moves = _try_empty(packing, b.bin_id)
            if trial_moves is not None:
                moves.extend(trial_moves)
                improved = True
                break
    return moves


def _try_empty(packing: Packing, bin_id: str) -> list[tuple[str, str, str]] | None:
    needs = dict(packing.bin(bin_id).needs)
    trial = packing.copy()
    for model in needs:
        trial.remove(model)
    trial.close_bin(bin_id)
    moves = []
    for model in sorted_models(needs, "max"):
        target = best_phi_bin(trial, needs[model])
        if target is None:
            return None
        trial.put(model, needs[model], target)
        moves.append((model, bin_id, target))
    # Commit on the real packing in the same order, so the caller's object stays the one that changed.
    for model, _, target in moves:
        packing.remove(model)
        packing.put(model, needs[model], target)
    packing.close_bin(bin_id)
    return moves


def pack_phi(
    needs: Mapping[str, Vec],
    orders: Sequence[str] = DEFAULT_ORDERS,
    is_improved: bool = True,
    num_random_starts: int | None = None,
    seed: int = 0,
) -> Packing:
    """Best of the Phi greedy over `orders` and then over `num_random_starts` perturbed largest-first orders (fewest
    bins, then least total Phi), each followed by the bin-elimination pass. Stops as soon as a packing meets the
    lower bound. Deterministic for a given `seed`. The default number of restarts keeps the work about constant
    (restarts x models^2 ~ RESTART_WORK): hundreds for a dozen models, a couple of dozen for sixty."""
    needs = as_needs(needs)
    if not needs:
        return Packing()
    if num_random_starts is None:
        num_random_starts = max(MIN_RESTARTS, min(MAX_RESTARTS, RESTART_WORK // len(needs) ** 2))
    lb = lower_bound(needs)
    best: Packing | None = None

    def consider(packing: Packing) -> bool:
        nonlocal best
        if is_improved and packing.num_bins > lb:
            eliminate_bins(packing)
        if best is None or (packing.num_bins, packing.total_potential()) < (best.num_bins, best.total_potential()):
            best = packing
        return best.num_bins == lb  # provably optimal: nothing can do better

    for order in orders:
        if consider(pack_phi_order(needs, order)):
            return best
    # Random restarts: the largest-first key jittered by +-30 %, so near-equal models swap places. On hard
    # random instances this closes most of the gap to the exact count (bench/planner.py measures how much).
    rng = random.Random(seed)
    models = sorted(needs)
    for _ in range(num_random_starts):
        jitter = {m: max(needs[m]) * rng.uniform(0.7, 1.3) for m in models}
        packing = Packing()
        new_id = counter_ids()
        for model in sorted(models, key=lambda m: (-jitter[m], m)):
            place_phi(packing, model, needs[model], new_id)
        if consider(packing):
            break
    return best


def pack_ffd(needs: Mapping[str, Vec]) -> Packing:
    """Baseline: first-fit decreasing by summed need (FFD-sum, the usual vector bin packing heuristic)."""
    needs = as_needs(needs)
    packing = Packing()
    new_id = counter_ids()
    for model in sorted_models(needs, "sum"):
        for b in packing:
            if all(b.used[d] + needs[model][d] <= 1 + FIT_EPS for d in range(3)):
                packing.put(model, needs[model], b.bin_id)
                break
        else:
            bid = new_id()
            packing.open_bin(bid)
            packing.put(model, needs[model], bid)
    return packing

"""Incremental changes to a live packing: a model leaves (local repack when the damage passes a threshold), a model's
needs change (a bin that overflows sheds models). Every change is returned as moves, so the reconciler can act on
them and the plan can say why."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .greedy import sorted_models
from .packing import FIT_EPS, Packing, Vec, best_phi_bin, fits, phi, place_phi, sub

# (model, from bin or None when newly placed, to bin or None when it left)
BinMove = tuple[str, str | None, str | None]


@dataclass(frozen=True)
class DepartureOutcome:
    """What a departure did to its bin. `damage` is Phi of the bin's leftovers after the model left."""

    bin_id: str
    damage: float
    is_repacked: bool
    moves: tuple[BinMove, ...]
    closed_bin_ids: tuple[str, ...]


def depart(packing: Packing, model: str, damage_threshold: float, max_num_moves: int = 4) -> DepartureOutcome:
    """Remove `model`. An emptied bin is closed. Otherwise, only when the leftovers' imbalance (Phi) passes
    `damage_threshold`, repack locally: first try to empty the bin into the others, else pull single models from
    other bins into it while that lowers the two bins' total Phi (at most `max_num_moves` moves)."""
    bin_id = packing.remove(model)
    b = packing.bin(bin_id)
    if not b.needs:
        packing.close_bin(bin_id)
        return DepartureOutcome(bin_id, 0.0, False, ((model, bin_id, None),), (bin_id,))
    damage = b.potential
    left: tuple[BinMove, ...] = ((model, bin_id, None),)
    if damage <= damage_threshold:
        return DepartureOutcome(bin_id, damage, False, left, ())
    moves = _empty_into_others(packing, bin_id, max_num_moves)
    if moves is not None:
        return DepartureOutcome(bin_id, damage, True, left + tuple(moves), (bin_id,))
    moves, closed = _rebalance(packing, bin_id, damage_threshold, max_num_moves)
    return DepartureOutcome(bin_id, damage, True, left + tuple(moves), tuple(closed))


def _empty_into_others(packing: Packing, bin_id: str, max_num_moves: int) -> list[BinMove] | None:
    needs = dict(packing.bin(bin_id).needs)
    if len(needs) > max_num_moves:
        return None
    trial = packing.copy()
    for m in needs:
        trial.remove(m)
    trial.close_bin(bin_id)
    plan: list[tuple[str, str]] = []
    for m in sorted_models(needs, "max"):
        target = best_phi_bin(trial, needs[m])
        if target is None:
            return None
        trial.put(m, needs[m], target)
        plan.append((m, target))
    for m, target in plan:
        packing.remove(m)
        packing.put(m, needs[m], target)
    packing.close_bin(bin_id)
    return [(m, bin_id, target) for m, target in plan]


def _rebalance(
    packing: Packing, bin_id: str, damage_threshold: float, max_num_moves: int
) -> tuple[list[BinMove], list[str]]:
    moves: list[BinMove] = []
    closed: list[str] = []
    target = packing.bin(bin_id)
    while len(moves) < max_num_moves and target.potential > damage_threshold:
        best: tuple[float, str, str] | None = None  # (gain, model, from)
        for other in packing:
            if other.bin_id == bin_id:
                continue
            for m, need in other.needs.items():
                if not fits(target.used, need):
                    continue
                before = target.potential + other.potential
                after = phi(sub(target.remaining, need))
                if len(other.needs) > 1:  # an emptied bin closes: it no longer counts
                    after += phi(tuple(r + n for r, n in zip(other.remaining, need)))  # type: ignore[arg-type]
                gain = before - after
                if gain > FIT_EPS and (best is None or gain > best[0] + 1e-12):
                    best = (gain, m, other.bin_id)
        if best is None:
            break
        _, m, src = best
        need = packing.need_of(m)
        packing.remove(m)
        packing.put(m, need, bin_id)
        moves.append((m, src, bin_id))
        if not packing.bin(src).needs:
            packing.close_bin(src)
            closed.append(src)
    return moves, closed


def refit(packing: Packing, new_needs: dict[str, Vec], new_bin_id: Callable[[], str]) -> list[BinMove]:
    """Apply changed need vectors to the models already placed. A bin that now overflows sheds its largest models
    (in the overflowing dimension) until it fits; each shed model is placed again by the Phi rule."""
    for m, need in new_needs.items():
        b = packing.bin(packing.bin_of(m))  # type: ignore[arg-type]
        b.needs[m] = need
    for b in packing:
        b._recompute()
    shed: dict[str, str] = {}
    for b in list(packing):
        while any(u > 1 + FIT_EPS for u in b.used):
            dim = max(range(3), key=lambda d: b.used[d])
            m = max(b.needs, key=lambda x: (b.needs[x][dim], x))
            shed[m] = b.bin_id
            packing.remove(m)
    moves: list[BinMove] = []
    for m in sorted_models({m: new_needs[m] for m in shed}, "max"):
        to = place_phi(packing, m, new_needs[m], new_bin_id)
        if to != shed[m]:
            moves.append((m, shed[m], to))
    packing.close_empty_bins()
    return moves

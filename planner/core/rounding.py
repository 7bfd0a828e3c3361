"""Integer apportionment for the elastic budget: largest-remainder rounding and proportional scale-down that keeps
at least one instance for every model with traffic."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def largest_remainder(weights: Sequence[float], total: int) -> list[int]:
    """Integers summing exactly to `total`, each the floor or the ceiling of its quota total*w/sum(w) (Hamilton's
    method). Ties in the remainder go to the larger weight, then to the earlier index, so it is deterministic."""
    if total < 0:
        raise ValueError(f"total must be >= 0, got {total}")
    if any(w < 0 or w != w for w in weights):
        raise ValueError(f"weights must be non-negative numbers, got {list(weights)}")
    wsum = float(sum(weights))
    if total == 0:
        return [0] * len(weights)
    if wsum <= 0:
        raise ValueError("cannot share a positive total among zero weights")
    quotas = [w * total / wsum for w in weights]
    # floor with a tolerance: 2.9999999999 from float division is 3
    seats = [math.floor(q + 1e-9) for q in quotas]
    left = total - sum(seats)
    order = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - seats[i]), -weights[i], i))
    for i in order[:left]:
        seats[i] += 1
    return seats


def scale_to_budget(
    desired: Mapping[str, int], budget: int, priority: Mapping[str, float] | None = None,
    floor: Mapping[str, int] | None = None, first: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """Scale `desired` instance counts down to `budget` in proportion, with the largest-remainder method; every model
    that wanted at least one keeps at least one. Never exceeds `budget`, never gives a model more than it wanted.

    If the budget cannot give every model with traffic one instance, the models with the highest `priority` (default:
    their desired count) get one each, the rest none.

    With `floor` (per model, at most its desired count), the budget goes in two tiers: first the floors (scaled down
    as above if even they do not fit), then what is left, shared in proportion to what each model wants beyond its
    floor. A model whose count is mostly padding (burst headroom, a queue to drain) then cannot crowd out another's
    measured load.

    With `first` too (per model, at most its floor), three tiers: the `first` counts, then the floors beyond them,
    then the rest; each tier is shared in proportion only when the budget runs out inside it."""
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    if any(d < 0 for d in desired.values()):
        raise ValueError(f"desired counts must be >= 0, got {dict(desired)}")
    if sum(desired.values()) <= budget:
        return dict(desired)
    tiers = [tier for tier in (first, floor) if tier is not None]
    if tiers:
        return _in_tiers([*tiers, desired], budget, priority)
    wanting = [m for m in sorted(desired) if desired[m] > 0]
    out = {m: 0 for m in desired}
    if budget < len(wanting):
        prio = priority or {}
        ranked = sorted(wanting, key=lambda m: (-prio.get(m, desired[m]), -desired[m], m))
        for m in ranked[:budget]:
            out[m] = 1
        return out
    # Models whose proportional share falls below one are held at one, and the rest share what is left; repeat,
    # since holding one model at one shrinks everyone else's share.
    free = list(wanting)
    left = budget
    while True:
        total_wanted = sum(desired[m] for m in free)
        low = [m for m in free if desired[m] * left / total_wanted < 1]
        if not low:
            break
        for m in low:
            out[m] = 1
            free.remove(m)
        left -= len(low)
        if not free:
            return out
    for m, n in zip(free, largest_remainder([desired[m] for m in free], left)):
        out[m] = n
    return out


def _in_tiers(levels: Sequence[Mapping[str, int]], budget: int, priority: Mapping[str, float] | None) \
        -> dict[str, int]:
    """`levels`: counts per model, each level at most the next (clamped so), the last the desired counts, which
    overrun `budget`. Every level that fits is given whole; the first that does not shares what the one below it
    leaves in proportion to what each model wants beyond it (the lowest level, if even it does not fit, is scaled as
    `scale_to_budget` scales, one instance kept for each model)."""
    clamped = [dict(levels[-1])]  # from the top down
    for level in reversed(levels[:-1]):
        clamped.append({m: min(max(0, level.get(m, 0)), n) for m, n in clamped[-1].items()})
    clamped.reverse()
    below: dict[str, int] | None = None
    for level in clamped:
        if sum(level.values()) > budget:
            if below is None:
                return scale_to_budget(level, budget, priority)
            out = dict(below)
            wanting = [m for m in sorted(level) if level[m] > below[m]]
            shares = largest_remainder([level[m] - below[m] for m in wanting], budget - sum(below.values()))
            for m, n in zip(wanting, shares):
                out[m] += n
            return out
        below = level
    return dict(clamped[-1])

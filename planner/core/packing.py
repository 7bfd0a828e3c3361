"""Three-dimensional bin packing state and the potential Phi (docs/planner.md, "Steady planner").

Items are models with need vectors (HBM, compute, bandwidth) as fractions of one device; bins are devices with
capacity 1 in each dimension. Phi(x) = ||x - mean(x)*1||^2 of a bin's *remaining* resources: a bin whose leftovers
stay balanced can still take a model of any shape, one with all its HBM gone but compute left wastes the compute."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

Vec = tuple[float, float, float]
NUM_DIMS = 3
# Needs are sums of a few floats; a bin filled to exactly 1.0 must still count as fitting.
FIT_EPS = 1e-9
ZERO: Vec = (0.0, 0.0, 0.0)


def phi(remaining: Vec) -> float:
    """The potential of a bin's remaining resources: squared distance from their own mean."""
    mean = (remaining[0] + remaining[1] + remaining[2]) / 3.0
    return (remaining[0] - mean) ** 2 + (remaining[1] - mean) ** 2 + (remaining[2] - mean) ** 2


def add(a: Vec, b: Vec) -> Vec:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


def sub(a: Vec, b: Vec) -> Vec:
    return (a[0] - b[0], a[1] - b[1], a[2] - b[2])


def fits(used: Vec, need: Vec) -> bool:
    """True when `need` fits beside `used` in every dimension."""
    return used[0] + need[0] <= 1 + FIT_EPS and used[1] + need[1] <= 1 + FIT_EPS and used[2] + need[2] <= 1 + FIT_EPS


def check_need(model: str, need: Vec) -> Vec:
    """A need vector a bin can ever hold, as a tuple of floats; a clear error otherwise."""
    if len(need) != NUM_DIMS:
        raise ValueError(f"{model}: a need vector has {NUM_DIMS} dimensions (hbm, compute, bandwidth), got {need!r}")
    vec = (float(need[0]), float(need[1]), float(need[2]))
    if any(x < 0 or x != x for x in vec):
        raise ValueError(f"{model}: needs must be non-negative numbers, got {vec}")
    if any(x > 1 + FIT_EPS for x in vec):
        raise ValueError(f"{model}: need {vec} exceeds one device; such a model belongs in the elastic pool")
    return vec


@dataclass
class Bin:
    """One device and the models on it."""

    bin_id: str
    needs: dict[str, Vec] = field(default_factory=dict)
    used: Vec = ZERO

    @property
    def remaining(self) -> Vec:
        return (1.0 - self.used[0], 1.0 - self.used[1], 1.0 - self.used[2])

    @property
    def potential(self) -> float:
        return phi(self.remaining)

    def delta_phi(self, need: Vec) -> float:
        """How much Phi grows if `need` is added (negative: the model rebalances the bin)."""
        rem = self.remaining
        return phi(sub(rem, need)) - phi(rem)

    def _recompute(self) -> None:
        # Summing afresh (not subtracting) keeps float drift from accumulating over many moves.
        used = ZERO
        for need in self.needs.values():
            used = add(used, need)
        self.used = used


class Packing:
    """Bins in a stable order (their opening order) and where each model sits. Mutable; `copy()` for what-ifs."""

    def __init__(self, bins: Iterable[Bin] = ()) -> None:
        self._bins: dict[str, Bin] = {}
        self._where: dict[str, str] = {}
        for b in bins:
            self._bins[b.bin_id] = Bin(b.bin_id, dict(b.needs))
            self._bins[b.bin_id]._recompute()
            for model in b.needs:
                if model in self._where:
                    raise ValueError(f"model {model} is in two bins")
                self._where[model] = b.bin_id

    @property
    def bins(self) -> list[Bin]:
        return list(self._bins.values())

    @property
    def num_bins(self) -> int:
        return len(self._bins)

    def __iter__(self) -> Iterator[Bin]:
        return iter(self._bins.values())

    def __contains__(self, model: str) -> bool:
        return model in self._where

    def models(self) -> list[str]:
        return list(self._where)

    def bin(self, bin_id: str) -> Bin:
        return self._bins[bin_id]

    def bin_of(self, model: str) -> str | None:
        return self._where.get(model)

    def need_of(self, model: str) -> Vec:
        return self._bins[self._where[model]].needs[model]

    def open_bin(self, bin_id: str) -> Bin:
        if bin_id in self._bins:
            raise ValueError(f"bin {bin_id} is already open")
        self._bins[bin_id] = Bin(bin_id)
        return self._bins[bin_id]

    def close_bin(self, bin_id: str) -> None:
        if self._bins[bin_id].needs:
            raise ValueError(f"bin {bin_id} still holds {sorted(self._bins[bin_id].needs)}")
        del self._bins[bin_id]

    def put(self, model: str, need: Vec, bin_id: str) -> None:
        """Place `model` in `bin_id` (it must fit; the bin must be open)."""
        if model in self._where:
            raise ValueError(f"model {model} is already placed in {self._where[model]}")
        b = self._bins[bin_id]
        if not fits(b.used, need):
            raise ValueError(f"model {model} {need} does not fit in bin {bin_id} (used {b.used})")
        b.needs[model] = need
        b.used = add(b.used, need)
        self._where[model] = bin_id

    def remove(self, model: str) -> str:
        """Take `model` out; returns the bin it was in (left open, possibly empty)."""
        bin_id = self._where.pop(model)
        b = self._bins[bin_id]
        del b.needs[model]
        b._recompute()
        return bin_id

    def close_empty_bins(self) -> list[str]:
        empty = [bid for bid, b in self._bins.items() if not b.needs]
        for bid in empty:
            del self._bins[bid]
        return empty

    def total_potential(self) -> float:
        return sum(b.potential for b in self._bins.values())

    def copy(self) -> "Packing":
        return Packing(self._bins.values())

    def assignment(self) -> dict[str, list[str]]:
        return {bid: list(b.needs) for bid, b in self._bins.items()}


def best_phi_bin(packing: Packing, need: Vec, exclude: str | None = None) -> str | None:
    """The open bin where `need` fits in all three dimensions and Phi grows least (first such bin on a tie);
    None when no open bin can take it."""
    best_id: str | None = None
    best_delta = float("inf")
    for b in packing:
        if b.bin_id == exclude or not fits(b.used, need):
            continue
        delta = b.delta_phi(need)
        if delta < best_delta - 1e-12:
            best_id, best_delta = b.bin_id, delta
    return best_id


def place_phi(packing: Packing, model: str, need: Vec, new_bin_id: Callable[[], str]) -> str:
    """The paper's rule: where it fits and Phi grows least; open a bin (id from `new_bin_id`) only if none fits."""
    bin_id = best_phi_bin(packing, need)
    if bin_id is None:
        bin_id = new_bin_id()
        packing.open_bin(bin_id)
    packing.put(model, need, bin_id)
    return bin_id


def counter_ids(prefix: str = "b", start: int = 0) -> Callable[[], str]:
    """Bin ids b0, b1, ... for packings that are not (yet) mapped to devices."""
    state = [start]

    def next_id() -> str:
        state[0] += 1
        return f"{prefix}{state[0] - 1}"

    return next_id


def as_needs(items: Mapping[str, Vec]) -> dict[str, Vec]:
    return {model: check_need(model, need) for model, need in items.items()}

"""Debounce: act on a change only when the last two plans agree, so counts do not flap at a threshold.

"Agree" is read as: agree on the direction and on how far both go. With counts applied = 3 and proposals 5 then 4,
both want more than 3 and both want at least 4, so 4 is applied; with 3 then 4 (or 4 then 3) they disagree and 3 is
held. Exact agreement of two proposals always applies. A literal reading (identical proposals only) would hold a
steadily rising load forever, since each tick's proposal differs from the one before."""
from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
Counts = tuple[int, ...]


class Debouncer(Generic[K]):
    """Per key, values are tuples of counts (e.g. (num_prefill, num_decode)). Keys missing from a proposal are
    forgotten (the caller decides what their absence means)."""

    def __init__(self, initial: Counts) -> None:
        self._initial = initial
        self._applied: dict[K, Counts] = {}
        self._last: dict[K, Counts] = {}

    def applied(self, key: K) -> Counts:
        return self._applied.get(key, self._initial)

    def step(self, proposal: Mapping[K, Counts]) -> tuple[dict[K, Counts], set[K]]:
        """The values to act on, and the keys whose proposal was not (fully) applied."""
        out: dict[K, Counts] = {}
        for key, new in proposal.items():
            out[key] = agreed(self._applied.get(key, self._initial), self._last.get(key), new)
        self._applied = dict(out)
        self._last = dict(proposal)
        return out, {k for k in proposal if out[k] != proposal[k]}

    def force(self, applied: Mapping[K, Counts]) -> None:
        """Record values applied without debouncing (e.g. a shrinking budget leaves no choice)."""
        self._applied = dict(applied)


def agreed(current: Counts, last: Counts | None, new: Counts) -> Counts:
    """What the last two proposals agree on, relative to what is applied now."""
    if new == current or new == last:
        return new
    if last is None:
        return current
    if all(n >= c for n, c in zip(new, current)) and all(lv >= c for lv, c in zip(last, current)):
        return tuple(min(n, lv) for n, lv in zip(new, last))  # both want more: at least this much
    if all(n <= c for n, c in zip(new, current)) and all(lv <= c for lv, c in zip(last, current)):
        return tuple(max(n, lv) for n, lv in zip(new, last))  # both want less: at most this much
    return current

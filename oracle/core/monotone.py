"""Attainment must not fall when replicas are added (the paper assumes it; a GP does not give it).

Corrections over a fixed grid of replica counts 1..M, so an answer for m never depends on which other m a caller
happened to ask in the same call (the elastic scaler asks one m per binary-search round). Vectorised over rows
(one row per model), so a whole fast-path tick is a few numpy operations:

- the bound: bound(m) = max over m' <= m of (mean(m') - k sigma(m')), clipped to [0, 1]. A lower bound for m'
  replicas is one for any m >= m' (attainment does not fall with replicas), so the best of them holds at m. The
  bound was the minimum over m' >= m before: the GP's sigma past the profiled counts (m = 64 on a grid profiled to
  8) is its prior's, and that minimum carried it down to every m (the simulator's learned oracle: a flat bound of
  0.86 where the mean was 1.0 at any count; docs/bench/sim.md, run 25);
- the mean: the midpoint of the running max from below and the running min from above. Both envelopes are
  non-decreasing, so their midpoint is; where the GP mean already is non-decreasing it is returned unchanged.
"""
from __future__ import annotations

import numpy as np


def conservative_bound(mean: np.ndarray, std: np.ndarray, k_sigma: float) -> np.ndarray:
    """Running maximum of mean - k*std along the last axis (m increasing), clipped to [0, 1]."""
    raw = np.asarray(mean, float) - k_sigma * np.asarray(std, float)
    return np.clip(np.maximum.accumulate(raw, axis=-1), 0.0, 1.0)


def monotone_mean(mean: np.ndarray) -> np.ndarray:
    y = np.asarray(mean, float)
    from_below = np.maximum.accumulate(y, axis=-1)
    from_above = np.flip(np.minimum.accumulate(np.flip(y, -1), axis=-1), -1)
    return 0.5 * (from_below + from_above)


def monotone_attainment(mean: np.ndarray, std: np.ndarray, k_sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """(mean, bound) over a grid of increasing m (last axis), both non-decreasing and in [0, 1], bound <= mean."""
    fixed = np.clip(monotone_mean(mean), 0.0, 1.0)
    return fixed, np.minimum(conservative_bound(mean, std, k_sigma), fixed)

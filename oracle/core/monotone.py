"""Attainment must not fall when replicas are added (the paper assumes it; a GP does not give it).

Corrections over a fixed grid of replica counts 1..M, so an answer for m never depends on which other m a caller
happened to ask in the same call (the elastic scaler asks one m per binary-search round). Vectorised over rows
(one row per model), so a whole fast-path tick is a few numpy operations:

- the bound: bound(m) = max over m' <= m of (mean(m') - k sigma(m')), clipped to [0, 1]. A lower bound for m'
  replicas is one for any m >= m' (attainment does not fall with replicas), so the best of them holds at m. The
  bound was the minimum over m' >= m before: the GP's sigma past the profiled counts (m = 64 on a grid profiled to
  8) is its prior's, and that minimum carried it down to every m (the simulator's learned oracle: a flat bound of
  0.86 where the mean was 1.0 at any count; docs/bench/sim.md, run 25);
- the mean: the least-squares non-decreasing fit to the GP's mean, each count weighted by its precision
  (1 / latent std^2; `isotonic_mean`), where the GP mean already is non-decreasing it is returned unchanged. A GP
  sure of 0.998 at 32-96 replicas and unsure between 128 and 192 (a dip to 0.91, std 0.15: counts it had little
  data at, between the profiles and the peak's telemetry) keeps 0.998 there. The midpoint of the running max from
  below and the running min from above (`midpoint_mean`, `OraclePolicy.monotone_mean="midpoint"`) weighs every
  count alike: that dip pulled 32-192 down to 0.954, and the bound, capped at the mean, put m* at 231 for a load
  35 replicas serve (docs/bench/sim.md run 57).
"""
from __future__ import annotations

from typing import Literal

import numpy as np
from scipy.optimize import isotonic_regression

# A latent std below this (attainment units) weighs as this: a count the GP is all but certain of must not make the
# fit's weights span more orders of magnitude than a least-squares solve resolves.
MIN_WEIGHT_STD = 1e-4


def conservative_bound(mean: np.ndarray, std: np.ndarray, k_sigma: float) -> np.ndarray:
    """Running maximum of mean - k*std along the last axis (m increasing), clipped to [0, 1]."""
    raw = np.asarray(mean, float) - k_sigma * np.asarray(std, float)
    return np.clip(np.maximum.accumulate(raw, axis=-1), 0.0, 1.0)


def midpoint_mean(mean: np.ndarray) -> np.ndarray:
    """The midpoint of the running max from below and the running min from above (both non-decreasing)."""
    y = np.asarray(mean, float)
    from_below = np.maximum.accumulate(y, axis=-1)
    from_above = np.flip(np.minimum.accumulate(np.flip(y, -1), axis=-1), -1)
    return 0.5 * (from_below + from_above)


def isotonic_mean(mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """Per row (last axis: m increasing), the non-decreasing sequence nearest `mean` in least squares weighted by
    1 / std^2 (scipy's pool-adjacent-violators)."""
    y = np.asarray(mean, float)
    weights = 1.0 / np.maximum(np.broadcast_to(np.asarray(std, float), y.shape), MIN_WEIGHT_STD) ** 2
    flat_y, flat_w = y.reshape(-1, y.shape[-1]), weights.reshape(-1, y.shape[-1])
    out = np.stack([isotonic_regression(row, weights=w).x for row, w in zip(flat_y, flat_w)])
    return out.reshape(y.shape)


def monotone_attainment(mean: np.ndarray, std: np.ndarray, k_sigma: float,
                        how: Literal["isotonic", "midpoint"] = "isotonic",
                        latent_std: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(mean, bound) over a grid of increasing m (last axis), both non-decreasing and in [0, 1], bound <= mean.
    `std`: the bound's; `latent_std`: the isotonic fit's weights (default `std`), the GP's uncertainty about the
    expected attainment whichever std the bound takes, so that one GP gives one mean."""
    fixed = isotonic_mean(mean, std if latent_std is None else latent_std) if how == "isotonic" \
        else midpoint_mean(mean)
    fixed = np.clip(fixed, 0.0, 1.0)
    return fixed, np.minimum(conservative_bound(mean, std, k_sigma), fixed)

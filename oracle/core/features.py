"""GP inputs from load features. Rates and lengths span orders of magnitude, so the GPs see their logarithms (then
standardised inside the posterior); the Elasticity GP also sees the per-replica rate, the quantity attainment
mostly depends on, so a smooth kernel in that input follows the load-per-replica curve."""
from __future__ import annotations

import math

import numpy as np

from contracts import LoadFeatures

CAPACITY_INPUTS = ("log_token_rate", "log_input_mean", "log_input_std", "log_output_mean")
ELASTICITY_INPUTS = CAPACITY_INPUTS + ("log_replicas", "log_token_rate_per_replica")
# The inputs that describe the requests' lengths (where a GP's extrapolation is checked: Oracle, "past the lengths")
LENGTH_INPUTS = ("log_input_mean", "log_input_std", "log_output_mean")
LENGTH_COLUMNS = tuple(ELASTICITY_INPUTS.index(name) for name in LENGTH_INPUTS)
REPLICAS_COLUMN = ELASTICITY_INPUTS.index("log_replicas")
RATE_COLUMN = ELASTICITY_INPUTS.index("log_token_rate")
# Weight signs of the Elasticity GP's logistic prior mean (oracle/gp/exact.LogisticMean), one per input: the knee
# sits at a per-replica load set by the length mix (free weights); attainment falls with the load per replica
# ("down") and pooling more replicas helps at the same load per replica ("up"). The total rate is left out
# (log rate = log m + log rate per replica): so the mean is non-decreasing in m by construction.
ELASTICITY_MEAN_SIGNS = ("off", "free", "free", "free", "up", "down")


def capacity_row(features: LoadFeatures) -> list[float]:
    return [
        math.log1p(features.token_rate_tps),
        math.log1p(features.input_len_mean),
        math.log1p(math.sqrt(features.input_len_var)),
        math.log1p(features.output_len_mean),
    ]


def elasticity_row(features: LoadFeatures, num_replicas: int) -> list[float]:
    if num_replicas < 1:
        raise ValueError(f"replica count must be >= 1, got {num_replicas}")
    return capacity_row(features) + [math.log(num_replicas), math.log1p(features.token_rate_tps / num_replicas)]


def capacity_inputs(features: list[LoadFeatures]) -> np.ndarray:
    """(n, 4) inputs of the Capacity GP."""
    return np.array([capacity_row(f) for f in features], dtype=float).reshape(len(features), len(CAPACITY_INPUTS))


def elasticity_inputs(features: list[LoadFeatures], replicas: list[int]) -> np.ndarray:
    """(n, 6) inputs of the Elasticity GP, one row per (features, m) pair."""
    if len(features) != len(replicas):
        raise ValueError("one replica count per feature row")
    rows = [elasticity_row(f, m) for f, m in zip(features, replicas)]
    return np.array(rows, dtype=float).reshape(len(rows), len(ELASTICITY_INPUTS))


def elasticity_grid(features: LoadFeatures, replicas: np.ndarray, pooled_past: int | None = None) -> np.ndarray:
    """Inputs for one load at many replica counts (the fast path: no per-row Python work).

    `pooled_past`: a count m above it is asked as `pooled_past` replicas at the same load per replica (the total
    rate scaled by pooled_past / m). More replicas at one load per replica attain at least as well as fewer (the
    dispatcher pools their queues), so that answer is a lower bound where the GP has no data, in place of its prior
    past the counts it was trained on."""
    m = np.asarray(replicas, dtype=float)
    if m.min() < 1:
        raise ValueError("replica counts must be >= 1")
    if pooled_past is not None and pooled_past < 1:
        raise ValueError(f"pooled_past must be >= 1, got {pooled_past}")
    out = np.empty((len(m), len(ELASTICITY_INPUTS)))
    out[:, :4] = capacity_row(features)
    np.log(m, out=out[:, 4])
    np.log1p(features.token_rate_tps / m, out=out[:, 5])
    if pooled_past is not None and m.max() > pooled_past:
        past = m > pooled_past
        out[past, RATE_COLUMN] = np.log1p(features.token_rate_tps * pooled_past / m[past])
        out[past, REPLICAS_COLUMN] = math.log(pooled_past)
    return out

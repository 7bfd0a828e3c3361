"""Synthetic open-loop load for one grid point: Poisson arrivals at the point's rate, log-normal prompt lengths
with the mix's mean and CV, output lengths log-normal (CV 0.5) around the mix's mean; or, for a mix of samples,
(prompt, output) pairs drawn from them. Seeded, pure."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .grid import OUTPUT_LEN_CV, GridPoint


@dataclass(frozen=True)
class SyntheticRequest:
    request_id: str
    arrival_s: float
    prompt_len: int
    output_len: int


def _log_normal(rng: np.random.Generator, mean: float, cv: float, size: int) -> np.ndarray:
    if cv <= 0:
        return np.full(size, mean)
    sigma2 = math.log1p(cv * cv)
    return rng.lognormal(math.log(mean) - sigma2 / 2.0, math.sqrt(sigma2), size)


def synth_requests(point: GridPoint, duration_s: float, seed: int, max_prompt_len: int, max_output_len: int) \
        -> list[SyntheticRequest]:
    """Requests arriving in [0, duration_s). Lengths are clipped to [1, max] (the engine's context limit)."""
    if duration_s <= 0 or max_prompt_len < 1 or max_output_len < 1:
        raise ValueError("duration_s > 0 and max lengths >= 1")
    rng = np.random.default_rng(seed)
    expected = point.rate_rps * duration_s
    gaps = rng.exponential(1.0 / point.rate_rps, int(expected + 6 * math.sqrt(expected) + 10))
    arrivals = np.cumsum(gaps)
    arrivals = arrivals[arrivals < duration_s]
    n = len(arrivals)
    if point.mix.samples:  # telemetry's own (prompt, output) pairs
        pairs = np.array(point.mix.samples, dtype=float)[rng.integers(0, len(point.mix.samples), n)]
        prompts = np.clip(pairs[:, 0], 1, max_prompt_len)
        outputs = np.clip(pairs[:, 1], 1, max_output_len)
    else:
        prompts = np.clip(np.rint(_log_normal(rng, point.mix.input_len_mean, point.mix.input_len_cv, n)), 1,
                          max_prompt_len)
        outputs = np.clip(np.rint(_log_normal(rng, point.mix.output_len_mean, OUTPUT_LEN_CV, n)), 1, max_output_len)
    return [SyntheticRequest(f"r{i}", float(a), int(p), int(o))
            for i, (a, p, o) in enumerate(zip(arrivals, prompts, outputs))]

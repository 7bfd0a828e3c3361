"""Analytic token-level SLO attainment of one replica under open-loop load (used by the roofline model).

Token i of a request is on time if delivered by TTFT_SLO + (i - 1) * TPOT_SLO after submission (the paper's
token-level attainment). With time to first token t and a steady time per output token tau, token i is on time iff
(i - 1) * (tau - TPOT_SLO) <= TTFT_SLO - t, so the number of on-time tokens of a request has a closed form. t is
the prefill queueing wait W plus the prefill itself plus half a decode step; W follows the M/G/1
(Pollaczek-Khinchine) mean over the prefill share of the device, with an exponential tail: P(W = 0) = 1 - rho, else W ~ Exp(mean = Wq / rho). Prompt lengths are log-normal with the
window's mean and variance. Expectations are taken on fixed quantile grids, so the result is deterministic,
smooth, and non-decreasing in the replica count (every ingredient grows with the per-replica rate).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from contracts import LoadFeatures

NUM_QUANTILES = 16
_MID_PROBS = (np.arange(NUM_QUANTILES) + 0.5) / NUM_QUANTILES
_STD_NORMAL_Z = np.array([NormalDist().inv_cdf(float(p)) for p in _MID_PROBS])
_STD_EXP = -np.log1p(-_MID_PROBS)  # quantiles of Exp(1)


@dataclass(frozen=True)
class LoadPoint:
    """One replica's share of a model's load window."""

    rate_rps: float
    input_len_mean: float
    input_len_var: float
    output_len_mean: float

    @classmethod
    def of(cls, features: LoadFeatures, num_replicas: int) -> "LoadPoint":
        if num_replicas < 1:
            raise ValueError("num_replicas must be >= 1")
        tokens_per_request = features.input_len_mean + features.output_len_mean
        rate_rps = features.token_rate_tps / tokens_per_request if tokens_per_request > 0 else 0.0
        return cls(rate_rps / num_replicas, features.input_len_mean, features.input_len_var,
                   features.output_len_mean)

    def input_len_quantiles(self) -> np.ndarray:
        """NUM_QUANTILES equally likely prompt lengths from a log-normal with the window's mean and variance."""
        if self.input_len_mean <= 0:
            return np.zeros(NUM_QUANTILES)
        if self.input_len_var <= 0:
            return np.full(NUM_QUANTILES, self.input_len_mean)
        sigma2 = math.log1p(self.input_len_var / self.input_len_mean**2)
        mu = math.log(self.input_len_mean) - sigma2 / 2.0
        return np.exp(mu + math.sqrt(sigma2) * _STD_NORMAL_Z)


def on_time_tokens(ttft_ms: np.ndarray, tpot_ms: float, num_tokens: float, ttft_slo_ms: float,
                   tpot_slo_ms: float) -> np.ndarray:
    """Expected on-time tokens of a request with these TTFTs (array) and a steady TPOT, out of `num_tokens`
    (continuous in its inputs: the count is not rounded)."""
    slack_ms = ttft_slo_ms - np.asarray(ttft_ms, dtype=float)
    if tpot_ms <= tpot_slo_ms:
        gain = tpot_slo_ms - tpot_ms  # each later token gains this much slack
        late = np.where(slack_ms >= 0, 0.0, np.inf if gain == 0 else -slack_ms / max(gain, 1e-12))
        # minimum/maximum: np.clip's values for these finite bounds, without its wrapper (the elastic scaler's
        # searches call this ~10^5 times a simulated hour)
        return np.minimum(np.maximum(num_tokens - late, 0.0), num_tokens)
    loss = tpot_ms - tpot_slo_ms
    return np.where(slack_ms < 0, 0.0, np.minimum(num_tokens, slack_ms / loss + 1.0))


# the queueing wait's quantiles in units of its conditional mean, with the no-wait atom first
_WAIT_UNITS = np.concatenate(([0.0], _STD_EXP))


def token_attainment(point: LoadPoint, prefill_ms: np.ndarray, prefill_busy_share: float, tpot_ms: float,
                     ttft_slo_ms: float, tpot_slo_ms: float) -> float:
    """Share of output tokens delivered on time, in [0, 1]. `prefill_ms` holds the prefill time of each prompt
    length in `point.input_len_quantiles()`. New prompts go ahead of decoding (continuous batching schedules them
    into the next step), so they queue only behind other prompts (M/G/1 on the prefill share) and behind the decode
    step in progress (half a TPOT on average)."""
    rho = prefill_busy_share
    if rho >= 1.0:
        return 0.0
    prefill_ms = np.asarray(prefill_ms, dtype=float)
    rate_per_ms = point.rate_rps / 1e3
    # means as add.reduce / n: np.mean's own arithmetic, without its wrapper
    queue_wait_ms = rate_per_ms * float(np.add.reduce(prefill_ms * prefill_ms) / len(prefill_ms)) / (2.0 * (1.0 - rho))
    if rho > 0 and queue_wait_ms > 0:
        waits_ms = (queue_wait_ms / rho) * _WAIT_UNITS
        weights = np.full(NUM_QUANTILES + 1, rho / NUM_QUANTILES)
        weights[0] = 1.0 - rho
    else:
        waits_ms, weights = np.zeros(1), np.ones(1)
    ttft_ms = prefill_ms[:, None] + waits_ms[None, :] + tpot_ms / 2.0
    num_tokens = max(point.output_len_mean, 1.0)
    on_time = on_time_tokens(ttft_ms, tpot_ms, num_tokens, ttft_slo_ms, tpot_slo_ms) @ weights
    share = float(np.add.reduce(on_time) / len(on_time)) / num_tokens
    return min(max(share, 0.0), 1.0)

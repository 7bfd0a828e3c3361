"""Fitted per-model predictors on top of a numpy GP posterior: the target transforms and the version string.

Capacity: three outputs log(need + floor) for (hbm, compute, bandwidth), back-transformed as a log-normal (mean
exp(mu) - floor, std exp(mu) sqrt(exp(s^2) - 1)), so relative errors are what the GP balances across loads that
differ by orders of magnitude. Elasticity: attainment itself (identity) or its logit, one output."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .posterior import GPPosterior


def data_version(kind: str, x: np.ndarray, y: np.ndarray) -> str:
    """A version that names the fit by what it learnt from: the same data gives the same version in every copy
    of the oracle service."""
    digest = hashlib.sha256(np.ascontiguousarray(x, float).tobytes() + np.ascontiguousarray(y, float).tobytes())
    return f"gp-{kind}-n{len(x)}-{digest.hexdigest()[:10]}"


@dataclass(frozen=True, eq=False)
class CapacityPredictor:
    posterior: GPPosterior
    need_floor: float
    version: str

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mean, std) of (hbm, compute, bandwidth) needs, each (n, 3), for capacity inputs x (n, 4)."""
        mu, sigma = self.posterior.predict(x)
        median = np.exp(mu)
        mean = np.maximum(median - self.need_floor, 0.0)
        std = median * np.sqrt(np.expm1(np.minimum(sigma, 5.0) ** 2))
        return mean, std


@dataclass(frozen=True, eq=False)
class ElasticityPredictor:
    posterior: GPPosterior
    target: str  # identity | logit
    version: str

    def predict(self, x: np.ndarray, include_noise: bool = True,
                k_sigma: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(mean, std) of attainment, each (n,), unclipped order preserved, values in [0, 1]. `include_noise`: the
        std of one measured window (predictive), else of the expected attainment (latent). `k_sigma`: for a logit
        target, the std whose mean - k std is the bound taken on the logit scale (`attainment_scale`)."""
        mu, sigma = self.posterior.predict(x, include_noise=include_noise)
        return attainment_scale(mu[:, 0], sigma[:, 0], self.target == "logit", k_sigma)

    @cached_property
    def input_range(self) -> tuple[np.ndarray, np.ndarray]:
        """The least and largest value of each input (oracle.core.features.ELASTICITY_INPUTS, unstandardised) the
        GP was trained on: where it has data."""
        p = self.posterior
        raw = p.x_train * p.x_std + p.x_mean
        return raw.min(axis=0), raw.max(axis=0)


def attainment_scale(mu: np.ndarray, sigma: np.ndarray, is_logit: np.ndarray | bool,
                     k_sigma: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The GP's (mu, sigma) on its target's scale as attainment (mean, std). Logit: mean sigmoid(mu); std by the
    delta method, sigma p (1 - p), or with `k_sigma` the std that puts mean - k std at sigmoid(mu - k sigma), the
    bound on the logit scale: the delta method is exact only for small sigma, and where the GP extrapolates (sigma of
    a few logits, past the profiled counts) it put the bound within a point of a mean near 1 and the scaler sized a
    32B model short of its load (docs/bench/sim.md run 28)."""
    if not np.any(is_logit):
        return np.clip(mu, 0.0, 1.0), sigma
    mean = 1.0 / (1.0 + np.exp(-mu))
    if k_sigma is None or k_sigma <= 0:
        std = sigma * mean * (1.0 - mean)
    else:
        std = (mean - 1.0 / (1.0 + np.exp(-(mu - k_sigma * sigma)))) / k_sigma
    return np.where(is_logit, mean, np.clip(mu, 0.0, 1.0)), np.where(is_logit, std, sigma)


def logit(p: np.ndarray, clip: float) -> np.ndarray:
    q = np.clip(np.asarray(p, float), clip, 1.0 - clip)
    return np.log(q / (1.0 - q))

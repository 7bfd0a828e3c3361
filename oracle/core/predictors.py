"""Fitted per-model predictors on top of a numpy GP posterior: the target transforms and the version string.

Capacity: three outputs log(need + floor) for (hbm, compute, bandwidth), back-transformed as a log-normal (mean
exp(mu) - floor, std exp(mu) sqrt(exp(s^2) - 1)), so relative errors are what the GP balances across loads that
differ by orders of magnitude. Elasticity: attainment itself (identity) or its logit, one output."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

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

    def predict(self, x: np.ndarray, include_noise: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """(mean, std) of attainment, each (n,), unclipped order preserved, values in [0, 1]. `include_noise`: the
        std of one measured window (predictive), else of the expected attainment (latent)."""
        mu, sigma = self.posterior.predict(x, include_noise=include_noise)
        mu, sigma = mu[:, 0], sigma[:, 0]
        if self.target == "logit":
            mean = 1.0 / (1.0 + np.exp(-mu))
            return mean, sigma * mean * (1.0 - mean)  # delta method
        return np.clip(mu, 0.0, 1.0), sigma


def logit(p: np.ndarray, clip: float) -> np.ndarray:
    q = np.clip(np.asarray(p, float), clip, 1.0 - clip)
    return np.log(q / (1.0 - q))

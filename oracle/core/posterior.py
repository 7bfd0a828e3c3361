"""The posterior of an exact GP with an RBF-ARD kernel, as plain numpy arrays.

Training (oracle/gp, gpytorch) learns the hyperparameters; predicting needs only these arrays, so the oracle's fast
path runs without torch and without autograd. Inputs are standardised with the training inputs' mean and std,
targets with theirs. Several independent outputs (the Capacity GP's three needs) share the inputs and are stacked
on a leading batch axis `b`.

Predictive mean  mu(x)  = m(x) + k(x, X) alpha,           alpha = (K + s2 I)^-1 (y - m(X))
Predictive var   v(x)   = o - ||L^-1 k(X, x)||^2 + s2      (noise included: held-out points are noisy observations)

The prior mean m(x) is a constant c, or (the Elasticity GP) a logistic in the standardised inputs x:
m(x) = c + a * sigmoid(w0 + w . x) with a >= 0 (`mean_amplitude`, `mean_bias`, `mean_weights`; all zero: constant).
The noise s2 is constant, or with the logistic mean s2(x) = s2 + s2_knee * 4 p (1 - p), p = sigmoid(w0 + w . x)
(`knee_noise`): labels at the knee are noisier than on the plateaus. K's diagonal and v(x) use s2(x).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np

# Squared distances beyond this give kernel values below 1e-217: clipping them keeps exp() out of subnormal
# results, which this CPU computes ~30x slower (measured: 34 ms for one tick's 178k kernel values).
MAX_SQ_DIST = 1000.0


@dataclass(frozen=True, eq=False)
class GPPosterior:
    x_mean: np.ndarray  # (d,) input standardisation
    x_std: np.ndarray  # (d,)
    y_mean: np.ndarray  # (b,) target standardisation
    y_std: np.ndarray  # (b,)
    x_train: np.ndarray  # (n, d) standardised training inputs
    lengthscales: np.ndarray  # (b, d)
    outputscale: np.ndarray  # (b,)
    noise: np.ndarray  # (b,)
    constant: np.ndarray  # (b,) constant mean, standardised space
    alpha: np.ndarray  # (b, n)
    chol_inv: np.ndarray  # (b, n, n) inverse of the Cholesky factor of K + s2 I
    # logistic prior mean (standardised space), None = constant mean: c + a * sigmoid(w0 + w . x)
    mean_weights: np.ndarray | None = None  # (b, d) w
    mean_bias: np.ndarray | None = None  # (b,) w0
    mean_amplitude: np.ndarray | None = None  # (b,) a
    knee_noise: np.ndarray | None = None  # (b,) s2_knee, None = 0

    def __post_init__(self) -> None:
        b, d = self.alpha.shape[0], self.x_train.shape[1]
        for name, shape in (("mean_weights", (b, d)), ("mean_bias", (b,)), ("mean_amplitude", (b,)),
                            ("knee_noise", (b,))):
            value = getattr(self, name)
            value = np.zeros(shape) if value is None else np.asarray(value, float).reshape(shape)
            object.__setattr__(self, name, value)

    @property
    def num_outputs(self) -> int:
        return int(self.alpha.shape[0])

    @property
    def num_train(self) -> int:
        return int(self.x_train.shape[0])

    @property
    def num_inputs(self) -> int:
        return int(self.x_train.shape[1])

    @classmethod
    def from_hyperparameters(cls, x_raw: np.ndarray, y_raw: np.ndarray, lengthscales: np.ndarray,
                             outputscale: np.ndarray, noise: np.ndarray, constant: np.ndarray,
                             x_mean: np.ndarray, x_std: np.ndarray, y_mean: np.ndarray, y_std: np.ndarray,
                             mean_weights: np.ndarray | None = None, mean_bias: np.ndarray | None = None,
                             mean_amplitude: np.ndarray | None = None, knee_noise: np.ndarray | None = None) \
            -> GPPosterior:
        """Build the posterior from fitted hyperparameters (all in standardised space) and the raw data."""
        x = (np.asarray(x_raw, float) - x_mean) / x_std
        y = (np.asarray(y_raw, float).reshape(len(x), -1) - y_mean) / y_std  # (n, b)
        b = y.shape[1]
        shell = cls(np.asarray(x_mean, float), np.asarray(x_std, float), np.asarray(y_mean, float),
                    np.asarray(y_std, float), x, np.asarray(lengthscales, float).reshape(b, -1),
                    np.asarray(outputscale, float).reshape(b), np.asarray(noise, float).reshape(b),
                    np.asarray(constant, float).reshape(b), np.zeros((b, len(x))), np.zeros((b, len(x), len(x))),
                    mean_weights, mean_bias, mean_amplitude, knee_noise)
        prior, noise = shell.prior(x)  # (n, b) each
        alphas, chol_invs = [], []
        for j in range(b):
            k = _rbf(x, x, shell.lengthscales[j], shell.outputscale[j])
            k[np.diag_indices_from(k)] += noise[:, j]
            chol = np.linalg.cholesky(k + 1e-9 * np.eye(len(x)))
            chol_inv = np.linalg.solve(chol, np.eye(len(x)))
            alphas.append(chol_inv.T @ (chol_inv @ (y[:, j] - prior[:, j])))
            chol_invs.append(chol_inv)
        return replace(shell, alpha=np.stack(alphas), chol_inv=np.stack(chol_invs))

    def prior(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The prior mean and the noise variance, each (n, b), at standardised inputs x (n, d), standardised units."""
        stacked = np.broadcast_to(x, (self.num_outputs, *x.shape))
        mean, noise = logistic_prior(stacked, self.constant, self.mean_amplitude, self.mean_bias, self.mean_weights,
                                     self.noise, self.knee_noise)
        return mean.T, noise.T

    def predict(self, x_raw: np.ndarray, include_noise: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Mean and std, both (m, b), in the targets' units."""
        x = np.atleast_2d(np.asarray(x_raw, float))
        if x.shape[1] != self.num_inputs:
            raise ValueError(f"expected {self.num_inputs} inputs per row, got {x.shape[1]}")
        means = np.empty((len(x), self.num_outputs))
        stds = np.empty((len(x), self.num_outputs))
        prior, noise = self.prior((x - self.x_mean) / self.x_std)
        for j in range(self.num_outputs):
            # one affine map takes raw inputs to length-scale units; training inputs are stored that way
            scale = self.x_std * self.lengthscales[j]
            z = (x - self.x_mean) / scale
            z_train = self._scaled_train[j]
            sq = (z * z).sum(1)[:, None] + self._scaled_train_sq[j][None, :] - 2.0 * (z @ z_train.T)
            k_star = self.outputscale[j] * np.exp(-0.5 * np.clip(sq, 0.0, MAX_SQ_DIST))
            v = k_star @ self.chol_inv[j].T  # rows: L^-1 k(X, x)
            var = self.outputscale[j] - np.einsum("ij,ij->i", v, v) + (noise[:, j] if include_noise else 0.0)
            means[:, j] = (prior[:, j] + k_star @ self.alpha[j]) * self.y_std[j] + self.y_mean[j]
            stds[:, j] = np.sqrt(np.maximum(var, 1e-12)) * self.y_std[j]
        return means, stds

    @cached_property
    def _scaled_train(self) -> list[np.ndarray]:
        return [self.x_train / self.lengthscales[j] for j in range(self.num_outputs)]

    @cached_property
    def _scaled_train_sq(self) -> list[np.ndarray]:
        return [(z * z).sum(1) for z in self._scaled_train]

    def to_json(self) -> str:
        return json.dumps({k: np.asarray(getattr(self, k)).tolist() for k in self.__dataclass_fields__})

    @classmethod
    def from_json(cls, text: str) -> GPPosterior:
        raw: dict[str, Any] = json.loads(text)
        return cls(**{k: np.asarray(v, dtype=float) for k, v in raw.items()})  # older JSON: constant mean


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # no overflow for large |z|


def logistic_prior(x: np.ndarray, constant: np.ndarray, amplitude: np.ndarray, bias: np.ndarray,
                   weights: np.ndarray, noise: np.ndarray, knee_noise: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Prior mean c + a p and noise variance s2 + s2_knee 4 p (1 - p), p = sigmoid(w0 + w . x), for standardised
    inputs x (b, g, d), one set of parameters per row b: each (b, g). Rows with a == 0 and s2_knee == 0 are the
    constant mean and noise."""
    p = sigmoid(bias[:, None] + np.einsum("bgd,bd->bg", x, weights))
    return constant[:, None] + amplitude[:, None] * p, noise[:, None] + knee_noise[:, None] * 4.0 * p * (1.0 - p)


def _rbf(a: np.ndarray, b: np.ndarray, lengthscales: np.ndarray, outputscale: float) -> np.ndarray:
    a_s, b_s = a / lengthscales, b / lengthscales
    sq = (a_s**2).sum(1)[:, None] + (b_s**2).sum(1)[None, :] - 2.0 * a_s @ b_s.T
    return outputscale * np.exp(-0.5 * np.clip(sq, 0.0, MAX_SQ_DIST))

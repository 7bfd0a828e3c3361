"""Exact GP regression with gpytorch: RBF kernel with one length-scale per input (ARD), a scale, a constant mean,
Gaussian noise; independent outputs batched on a leading axis. Inputs and targets are standardised first."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import gpytorch
import numpy as np
import torch
from linear_operator.utils.errors import NanError, NotPSDError

from oracle.core.posterior import GPPosterior


class BatchExactGP(gpytorch.models.ExactGP):
    def __init__(self, x: torch.Tensor, y: torch.Tensor, likelihood: gpytorch.likelihoods.GaussianLikelihood):
        super().__init__(x, y, likelihood)
        batch = torch.Size([y.shape[0]])
        self.mean_module = gpytorch.means.ConstantMean(batch_shape=batch)
        # Bounds in standardised units keep the optimiser out of degenerate corners (a length-scale far below
        # the spacing of the data interpolates noise; far above it ignores the input).
        self.covar_module = gpytorch.kernels.ScaleKernel(
            gpytorch.kernels.RBFKernel(ard_num_dims=x.shape[-1], batch_shape=batch,
                                       lengthscale_constraint=gpytorch.constraints.Interval(0.05, 50.0)),
            batch_shape=batch, outputscale_constraint=gpytorch.constraints.Interval(1e-3, 50.0))

    def forward(self, x: torch.Tensor) -> gpytorch.distributions.MultivariateNormal:
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def standardise(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    x_mean, x_std = x.mean(0), x.std(0)
    x_std = np.where(x_std > 1e-9, x_std, 1.0)  # a constant input (one length mix in a profile) stays put
    y_mean, y_std = y.mean(0), y.std(0)
    y_std = np.where(y_std > 1e-9, y_std, 1.0)
    return x_mean, x_std, y_mean, y_std


def build(x: np.ndarray, y: np.ndarray, min_noise: float) \
        -> tuple[BatchExactGP, gpytorch.likelihoods.GaussianLikelihood, tuple[np.ndarray, ...]]:
    """The gpytorch model over standardised data (inputs (n, d), targets (n, b))."""
    stats = standardise(x, y)
    x_mean, x_std, y_mean, y_std = stats
    xs = torch.as_tensor((x - x_mean) / x_std, dtype=torch.float64)
    ys = torch.as_tensor(((y - y_mean) / y_std).T.copy(), dtype=torch.float64)  # (b, n)
    b = ys.shape[0]
    likelihood = gpytorch.likelihoods.GaussianLikelihood(
        batch_shape=torch.Size([b]), noise_constraint=gpytorch.constraints.GreaterThan(min_noise)).double()
    model = BatchExactGP(xs.expand(b, *xs.shape), ys, likelihood).double()
    return model, likelihood, stats


@contextmanager
def _one_thread() -> Iterator[None]:
    """Fits are small (hundreds of points): torch's intra-op threads only add contention, 10x slower measured on
    this 2-core machine under load. Process-wide while it lasts: nothing else in the oracle runs torch."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _initialise(model: BatchExactGP, likelihood: gpytorch.likelihoods.GaussianLikelihood, min_noise: float) -> None:
    """Unit length-scales and scale, a small noise (standardised units): a sane GP before any fitting."""
    kernel = model.covar_module
    kernel.base_kernel.lengthscale = torch.ones_like(kernel.base_kernel.lengthscale)
    kernel.outputscale = torch.ones_like(kernel.outputscale)
    likelihood.noise = torch.full_like(likelihood.noise, max(0.05, 2 * min_noise))
    model.train()
    likelihood.train()


def _is_finite(model: BatchExactGP, likelihood: gpytorch.likelihoods.GaussianLikelihood) -> bool:
    kernel = model.covar_module
    params = [kernel.base_kernel.lengthscale, kernel.outputscale, likelihood.noise, model.mean_module.constant]
    return all(bool(torch.isfinite(p).all()) for p in params)


def _optimise(model: BatchExactGP, likelihood: gpytorch.likelihoods.GaussianLikelihood,
              optimizer: torch.optim.Optimizer, num_steps: int) -> None:
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = -mll(model(*model.train_inputs), model.train_targets).sum()
        loss.backward()
        return loss

    for _ in range(num_steps):
        optimizer.step(closure)


def fit_exact_gp(x: np.ndarray, y: np.ndarray, num_iters: int = 40, min_noise: float = 1e-3, seed: int = 0,
                 optimizer: str = "lbfgs") -> GPPosterior:
    """Fit hyperparameters by maximising the exact marginal likelihood, then hand back the numpy posterior.
    `y` is (n,) or (n, b) for b independent outputs sharing the inputs.

    L-BFGS with a strong-Wolfe line search from unit length-scales and scale and a small noise (standardised
    units): it reaches a better optimum sooner than Adam (`optimizer="adam"`, `num_iters` steps; compared in
    bench/oracle.py --fit-speed). If the line search reaches a singular kernel matrix, small Adam steps from the
    start again; if that fails too, the starting hyperparameters (a valid, if unfitted, GP)."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float).reshape(len(x), -1)
    if len(x) < 3:
        raise ValueError(f"a GP needs at least 3 training points, got {len(x)}")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError("training data must be finite")
    torch.manual_seed(seed)
    if optimizer not in ("lbfgs", "adam"):
        raise ValueError(f"optimizer must be lbfgs or adam, got {optimizer!r}")
    adam = (lambda m: torch.optim.Adam(m.parameters(), lr=0.05), 3 * num_iters)
    lbfgs = (lambda m: torch.optim.LBFGS(m.parameters(), lr=1.0, max_iter=num_iters, line_search_fn="strong_wolfe"), 1)
    attempts = ((lbfgs, adam) if optimizer == "lbfgs" else ((lambda m: torch.optim.Adam(m.parameters(), lr=0.1),
                                                              num_iters), adam)) + ((None, 0),)
    with _one_thread(), gpytorch.settings.cholesky_jitter(double_value=1e-8):
        for make_optimizer, num_steps in attempts:
            model, likelihood, stats = build(x, y, min_noise)
            _initialise(model, likelihood, min_noise)
            if make_optimizer is None:
                break
            try:
                _optimise(model, likelihood, make_optimizer(model), num_steps)
            except (NotPSDError, NanError):
                continue
            if _is_finite(model, likelihood):
                break
    kernel = model.covar_module
    x_mean, x_std, y_mean, y_std = stats
    with torch.no_grad():
        b = y.shape[1]
        return GPPosterior.from_hyperparameters(
            x, y,
            lengthscales=kernel.base_kernel.lengthscale.reshape(b, -1).numpy(),
            outputscale=kernel.outputscale.reshape(b).numpy(),
            noise=likelihood.noise.reshape(b).numpy(),
            constant=model.mean_module.constant.reshape(b).numpy(),
            x_mean=x_mean, x_std=x_std, y_mean=y_mean, y_std=y_std)

"""Exact GP regression with gpytorch: RBF kernel with one length-scale per input (ARD), a scale, a constant or
logistic prior mean, Gaussian noise; independent outputs batched on a leading axis. Inputs and targets are
standardised first."""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import gpytorch
import numpy as np
import torch
from gpytorch.likelihoods.gaussian_likelihood import _GaussianLikelihoodBase
from gpytorch.likelihoods.noise_models import Noise
from linear_operator.operators import DiagLinearOperator
from linear_operator.utils.errors import NanError, NotPSDError

from oracle.core.posterior import GPPosterior

SIGNS = ("off", "free", "up", "down")  # what sign a logistic mean's weight on an input may take (off: none)
# Prior std of the logistic mean's weights (standardised inputs, logit units). A logit shift of ~10 spans a whole
# knee (0.007 to 0.993) and measured knees span a 2-3x load (a logit slope of ~5 per unit log load, ~3 per std), so
# weights of tens per input std are implausible: they arise when three length mixes, whose features are nearly
# collinear, are told apart by the jitter of their measured means (seen on the seed-0 profile: +37 / -36).
MEAN_WEIGHT_PRIOR_STD = 5.0


def _inverse_softplus(value: torch.Tensor) -> torch.Tensor:
    return torch.log(torch.expm1(value))


class LogisticMean(gpytorch.means.Mean):
    """Prior mean c + a * sigmoid(w0 + w . x) with a >= 0 and each weight w_j free, >= 0 ("up"), <= 0 ("down") or
    absent ("off"), as `signs` says per input. Where an input enters only through "up"/"down" weights, the mean is
    monotone in it by construction (a knee in the load per replica; oracle/core/features.py)."""

    def __init__(self, signs: Sequence[str], batch_shape: torch.Size):
        super().__init__()
        unknown = set(signs) - set(SIGNS)
        if unknown:
            raise ValueError(f"mean weight signs must be in {SIGNS}, got {sorted(unknown)}")
        codes = torch.tensor([SIGNS.index(s) for s in signs])
        for index, name in enumerate(SIGNS):
            self.register_buffer(f"is_{name}", (codes == index).double())
        d = len(signs)
        self.register_parameter("constant", torch.nn.Parameter(torch.zeros(*batch_shape, dtype=torch.float64)))
        self.register_parameter("raw_amplitude", torch.nn.Parameter(torch.zeros(*batch_shape, dtype=torch.float64)))
        self.register_parameter("bias", torch.nn.Parameter(torch.zeros(*batch_shape, dtype=torch.float64)))
        self.register_parameter("raw_weights", torch.nn.Parameter(torch.zeros(*batch_shape, d, dtype=torch.float64)))
        self.register_prior("weights_prior", gpytorch.priors.NormalPrior(0.0, MEAN_WEIGHT_PRIOR_STD),
                            lambda module: module.weights)

    @property
    def amplitude(self) -> torch.Tensor:
        return torch.nn.functional.softplus(self.raw_amplitude)

    @property
    def weights(self) -> torch.Tensor:
        positive = torch.nn.functional.softplus(self.raw_weights)
        return self.is_free * self.raw_weights + (self.is_up - self.is_down) * positive

    def fraction(self, x: torch.Tensor) -> torch.Tensor:
        """sigmoid(w0 + w . x): where on the knee x sits, 0..1."""
        return torch.sigmoid(self.bias[..., None] + (x * self.weights[..., None, :]).sum(-1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.constant[..., None] + self.amplitude[..., None] * self.fraction(x)

    def prefit(self, x: torch.Tensor, y: torch.Tensor, num_iters: int = 50) -> None:
        """Least squares from a unit-slope start spanning the targets' range: a sane start for the marginal
        likelihood, which then refines these weights together with the kernel's."""
        with torch.no_grad():
            self.constant.copy_(y.min(-1).values)
            span = torch.clamp(y.max(-1).values - y.min(-1).values, min=0.1)
            self.raw_amplitude.copy_(_inverse_softplus(span))
            self.bias.zero_()
            signed = (self.is_up + self.is_down).expand_as(self.raw_weights)
            self.raw_weights.copy_(signed * _inverse_softplus(torch.tensor(1.0, dtype=torch.float64)))
        optimizer = torch.optim.LBFGS(self.parameters(), lr=1.0, max_iter=num_iters, line_search_fn="strong_wolfe")

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            ridge = (self.weights**2).sum() / (2 * MEAN_WEIGHT_PRIOR_STD**2 * y.shape[-1])  # the same prior
            loss = ((self(x) - y) ** 2).mean() + ridge
            loss.backward()
            return loss

        optimizer.step(closure)


class KneeNoise(Noise):
    """Observation noise s2 + s2_knee * 4 p (1 - p), p = the logistic mean's fraction at the input: a label measured
    at the knee (p ~ 1/2) is far noisier than one on a plateau, since a small shift of the knee (Poisson arrivals
    over a short window, machine drift) moves it by tens of points while plateaus stay put."""

    def __init__(self, batch_shape: torch.Size, min_noise: float):
        super().__init__()
        self._mean: list[LogisticMean] = []  # bound after the model is built (its parameters belong to the model)
        self.register_parameter("raw_noise", torch.nn.Parameter(torch.zeros(*batch_shape, 1, dtype=torch.float64)))
        self.register_constraint("raw_noise", gpytorch.constraints.GreaterThan(min_noise))
        self.register_parameter("raw_knee_noise",
                                torch.nn.Parameter(torch.zeros(*batch_shape, 1, dtype=torch.float64)))
        self.register_constraint("raw_knee_noise", gpytorch.constraints.Positive())

    def bind(self, mean: LogisticMean) -> None:
        self._mean[:] = [mean]

    def _value(self, raw: str) -> torch.Tensor:
        return getattr(self, f"{raw}_constraint").transform(getattr(self, raw))

    def _assign(self, raw: str, value: torch.Tensor) -> None:
        self.initialize(**{raw: getattr(self, f"{raw}_constraint").inverse_transform(value)})

    noise = property(lambda self: self._value("raw_noise"), lambda self, v: self._assign("raw_noise", v))
    knee_noise = property(lambda self: self._value("raw_knee_noise"),
                          lambda self, v: self._assign("raw_knee_noise", v))

    def forward(self, *params, shape: torch.Size | None = None, **kwargs) -> DiagLinearOperator:
        if not params or not self._mean:
            raise ValueError("KneeNoise needs the inputs (pass them to the likelihood) and a bound LogisticMean")
        x = params[0] if torch.is_tensor(params[0]) else params[0][0]
        p = self._mean[0].fraction(x)
        return DiagLinearOperator(self.noise + self.knee_noise * 4.0 * p * (1.0 - p))


class KneeLikelihood(_GaussianLikelihoodBase):
    """Gaussian likelihood with KneeNoise (the Elasticity GP with a logistic mean)."""

    def __init__(self, batch_shape: torch.Size, min_noise: float):
        super().__init__(noise_covar=KneeNoise(batch_shape, min_noise))

    @property
    def noise(self) -> torch.Tensor:
        return self.noise_covar.noise

    @noise.setter
    def noise(self, value: torch.Tensor) -> None:
        self.noise_covar.noise = value


class BatchExactGP(gpytorch.models.ExactGP):
    def __init__(self, x: torch.Tensor, y: torch.Tensor, likelihood: gpytorch.likelihoods.GaussianLikelihood,
                 mean_signs: Sequence[str] | None = None):
        super().__init__(x, y, likelihood)
        batch = torch.Size([y.shape[0]])
        self.mean_module = (gpytorch.means.ConstantMean(batch_shape=batch) if mean_signs is None
                            else LogisticMean(mean_signs, batch))
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


def build(x: np.ndarray, y: np.ndarray, min_noise: float, mean_signs: Sequence[str] | None = None) \
        -> tuple[BatchExactGP, gpytorch.likelihoods.GaussianLikelihood, tuple[np.ndarray, ...]]:
    """The gpytorch model over standardised data (inputs (n, d), targets (n, b)); constant prior mean, or logistic
    with these weight signs per input."""
    if mean_signs is not None and len(mean_signs) != x.shape[1]:
        raise ValueError(f"one mean weight sign per input: {len(mean_signs)} signs, {x.shape[1]} inputs")
    stats = standardise(x, y)
    x_mean, x_std, y_mean, y_std = stats
    xs = torch.as_tensor((x - x_mean) / x_std, dtype=torch.float64)
    ys = torch.as_tensor(((y - y_mean) / y_std).T.copy(), dtype=torch.float64)  # (b, n)
    b = ys.shape[0]
    if mean_signs is None:
        likelihood = gpytorch.likelihoods.GaussianLikelihood(
            batch_shape=torch.Size([b]), noise_constraint=gpytorch.constraints.GreaterThan(min_noise)).double()
    else:
        likelihood = KneeLikelihood(torch.Size([b]), min_noise).double()
    model = BatchExactGP(xs.expand(b, *xs.shape), ys, likelihood, mean_signs).double()
    if mean_signs is not None:
        likelihood.noise_covar.bind(model.mean_module)
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
    if isinstance(model.mean_module, LogisticMean):
        model.mean_module.prefit(model.train_inputs[0], model.train_targets)
        # the knee noise is fitted after the rest (_fit_knee_noise): with it free from the start, the likelihood
        # would rather call knee points noisy than bend the mean towards them
        likelihood.noise_covar.knee_noise = torch.full_like(likelihood.noise, 1e-6)
        likelihood.noise_covar.raw_knee_noise.requires_grad_(False)
    model.train()
    likelihood.train()


def _is_finite(model: BatchExactGP, likelihood: gpytorch.likelihoods.GaussianLikelihood) -> bool:
    kernel = model.covar_module
    params = [kernel.base_kernel.lengthscale, kernel.outputscale, *likelihood.parameters(),
              *model.mean_module.parameters()]
    return all(bool(torch.isfinite(p).all()) for p in params)


def _optimise(model: BatchExactGP, likelihood: gpytorch.likelihoods.GaussianLikelihood,
              optimizer: torch.optim.Optimizer, num_steps: int) -> None:
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = -mll(model(*model.train_inputs), model.train_targets, *model.train_inputs).sum()
        loss.backward()
        return loss

    for _ in range(num_steps):
        optimizer.step(closure)


def _fit_knee_noise(model: BatchExactGP, likelihood: KneeLikelihood, num_iters: int) -> None:
    """Second stage: with the mean and kernel fitted under constant noise, fit the two noise terms alone (the
    predictive std then widens at the knee without the knee points losing their pull on the mean). Keeps the
    constant noise if this fails."""
    noise = likelihood.noise_covar
    before = {name: p.detach().clone() for name, p in noise.named_parameters()}
    noise.knee_noise = torch.full_like(noise.noise, 0.1)
    for p in model.parameters():
        p.requires_grad_(False)
    params = [noise.raw_noise, noise.raw_knee_noise]
    for p in params:
        p.requires_grad_(True)
    try:
        _optimise(model, likelihood, torch.optim.LBFGS(params, lr=1.0, max_iter=num_iters,
                                                       line_search_fn="strong_wolfe"), 1)
        ok = all(bool(torch.isfinite(p).all()) for p in params)
    except (NotPSDError, NanError):
        ok = False
    if not ok:
        with torch.no_grad():
            for name, p in noise.named_parameters():
                p.copy_(before[name])
    for p in model.parameters():
        p.requires_grad_(True)


def fit_exact_gp(x: np.ndarray, y: np.ndarray, num_iters: int = 40, min_noise: float = 1e-3, seed: int = 0,
                 optimizer: str = "lbfgs", mean_signs: Sequence[str] | None = None) -> GPPosterior:
    """Fit hyperparameters by maximising the exact marginal likelihood, then hand back the numpy posterior.
    `y` is (n,) or (n, b) for b independent outputs sharing the inputs. `mean_signs`: a logistic prior mean
    (LogisticMean) with these weight signs per input, first fitted by least squares, then refined with the kernel;
    None: a constant mean.

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
            model, likelihood, stats = build(x, y, min_noise, mean_signs)
            _initialise(model, likelihood, min_noise)
            if make_optimizer is None:
                break
            try:
                _optimise(model, likelihood, make_optimizer(model), num_steps)
            except (NotPSDError, NanError):
                continue
            if _is_finite(model, likelihood):
                break
        if isinstance(likelihood, KneeLikelihood) and make_optimizer is not None:
            _fit_knee_noise(model, likelihood, num_iters)
    kernel = model.covar_module
    x_mean, x_std, y_mean, y_std = stats
    with torch.no_grad():
        b = y.shape[1]
        mean = model.mean_module
        logistic = {}
        if isinstance(mean, LogisticMean):
            logistic = {"mean_weights": mean.weights.reshape(b, -1).numpy(), "mean_bias": mean.bias.reshape(b).numpy(),
                        "mean_amplitude": mean.amplitude.reshape(b).numpy(),
                        "knee_noise": likelihood.noise_covar.knee_noise.reshape(b).numpy()}
        return GPPosterior.from_hyperparameters(
            x, y,
            lengthscales=kernel.base_kernel.lengthscale.reshape(b, -1).numpy(),
            outputscale=kernel.outputscale.reshape(b).numpy(),
            noise=likelihood.noise.reshape(b).numpy(),
            constant=mean.constant.reshape(b).numpy(),
            x_mean=x_mean, x_std=x_std, y_mean=y_mean, y_std=y_std, **logistic)

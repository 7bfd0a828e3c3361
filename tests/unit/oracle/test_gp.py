"""gpytorch training: the numpy posterior reproduces gpytorch's own predictions; the fitted predictors learn."""
from dataclasses import replace

import gpytorch
import numpy as np
import pytest
import torch

from contracts import LoadFeatures
from oracle.core.dataset import ElasticitySample
from oracle.core.features import (
    ELASTICITY_MEAN_SIGNS,
    capacity_inputs,
    elasticity_grid,
    elasticity_inputs,
)
from oracle.core.policy import OraclePolicy
from oracle.core.posterior import GPPosterior
from oracle.gp import fit_capacity, fit_elasticity, fit_exact_gp
from oracle.gp.exact import LogisticMean, build

FAST = OraclePolicy(num_train_iters=25)


def test_numpy_posterior_matches_gpytorch_prediction():
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 3, (60, 3))
    y = np.stack([np.sin(2 * x[:, 0]) + x[:, 1], x[:, 2] ** 2], 1) + 0.05 * rng.standard_normal((60, 2))
    post = fit_exact_gp(x, y, num_iters=20)
    # rebuild the same gpytorch model with the fitted hyperparameters and ask gpytorch
    model, likelihood, _ = build(x, y, 1e-4)
    with torch.no_grad():
        model.covar_module.base_kernel.lengthscale = torch.as_tensor(post.lengthscales[:, None, :])
        model.covar_module.outputscale = torch.as_tensor(post.outputscale)
        likelihood.noise = torch.as_tensor(post.noise[:, None])
        model.mean_module.constant.copy_(torch.as_tensor(post.constant))
    model.eval()
    likelihood.eval()
    x_test = rng.uniform(0, 3, (40, 3))
    xs = torch.as_tensor((x_test - post.x_mean) / post.x_std).expand(2, 40, 3)
    with torch.no_grad(), gpytorch.settings.fast_pred_var(False):
        pred = likelihood(model(xs))
    gp_mean = pred.mean.numpy().T * post.y_std + post.y_mean
    gp_std = pred.stddev.numpy().T * post.y_std
    mean, std = post.predict(x_test)
    np.testing.assert_allclose(mean, gp_mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(std, gp_std, rtol=1e-4, atol=1e-6)


def _inverse_softplus(v):
    return np.log(np.expm1(v))


def test_numpy_posterior_matches_gpytorch_with_logistic_mean_and_knee_noise():
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 3, (50, 3))
    y = 1.0 / (1.0 + np.exp(4 * (x[:, 0] - 1.5) - 0.5 * x[:, 1])) + 0.05 * rng.standard_normal(50)
    signs = ("down", "up", "free")
    post = fit_exact_gp(x, y, num_iters=20, mean_signs=signs)
    assert post.mean_amplitude[0] > 0 and post.knee_noise[0] > 0
    assert post.mean_weights[0, 0] <= 0 <= post.mean_weights[0, 1]
    model, likelihood, _ = build(x, y, 1e-4, mean_signs=signs)
    mean_module = model.mean_module
    assert isinstance(mean_module, LogisticMean)
    w = post.mean_weights[0]
    raw = np.array([_inverse_softplus(-w[0]), _inverse_softplus(w[1]), w[2]])
    with torch.no_grad():
        model.covar_module.base_kernel.lengthscale = torch.as_tensor(post.lengthscales[:, None, :])
        model.covar_module.outputscale = torch.as_tensor(post.outputscale)
        likelihood.noise = torch.as_tensor(post.noise[:, None])
        likelihood.noise_covar.knee_noise = torch.as_tensor(post.knee_noise[:, None])
        mean_module.constant.copy_(torch.as_tensor(post.constant))
        mean_module.bias.copy_(torch.as_tensor(post.mean_bias))
        mean_module.raw_amplitude.copy_(torch.as_tensor(_inverse_softplus(post.mean_amplitude)))
        mean_module.raw_weights.copy_(torch.as_tensor(raw[None]))
    model.eval()
    likelihood.eval()
    x_test = rng.uniform(0, 3, (40, 3))
    xs = torch.as_tensor((x_test - post.x_mean) / post.x_std).expand(1, 40, 3)
    with torch.no_grad(), gpytorch.settings.fast_pred_var(False):
        pred = likelihood(model(xs), xs)
    mean, std = post.predict(x_test)
    np.testing.assert_allclose(mean[:, 0], pred.mean.numpy()[0] * post.y_std[0] + post.y_mean[0], rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(std[:, 0], pred.stddev.numpy()[0] * post.y_std[0], rtol=1e-4, atol=1e-6)
    # JSON written before the logistic mean existed (no such keys) reads as a constant-mean posterior
    import json
    raw_json = json.loads(post.to_json())
    for key in ("mean_weights", "mean_bias", "mean_amplitude", "knee_noise"):
        del raw_json[key]
    old = GPPosterior.from_json(json.dumps(raw_json))
    assert np.all(old.mean_amplitude == 0) and np.all(old.knee_noise == 0)


def _knee_samples(rng, num, max_replicas=3):
    """Attainment with a known knee: a logistic in the load per replica around a capacity that depends on the
    length mix (per-replica token rate 20k for short prompts, 8k for long ones), plus label noise."""
    out = []
    for _ in range(num):
        long = rng.random() < 0.5
        input_mean, output_mean, capacity = (800.0, 24.0, 8000.0) if long else (64.0, 32.0, 20000.0)
        m = int(rng.integers(1, max_replicas + 1))
        per_replica = capacity * np.exp(rng.uniform(np.log(0.3), np.log(3.0)))
        truth = 1.0 / (1.0 + (per_replica / capacity) ** 6)
        value = float(np.clip(truth + 0.03 * rng.standard_normal(), 0, 1))
        features = LoadFeatures(token_rate_tps=per_replica * m, input_len_mean=input_mean,
                                input_len_var=(0.5 * input_mean) ** 2, output_len_mean=output_mean)
        out.append((ElasticitySample(features, m, value), truth))
    return out


@pytest.mark.parametrize("target", ["identity", "logit"])
def test_logistic_mean_learns_a_known_knee_and_extrapolates_in_m(target):
    rng = np.random.default_rng(3)
    train, test = _knee_samples(rng, 60), _knee_samples(rng, 200)
    predictor = fit_elasticity([s for s, _ in train], replace(FAST, attainment_target=target))
    assert predictor.version.startswith(f"gp-elasticity-{target}-logistic-n60")
    mean, _ = predictor.predict(elasticity_inputs([s.features for s, _ in test], [s.num_replicas for s, _ in test]))
    errors = np.abs(mean - np.array([t for _, t in test]))
    # (a constant-mean GP on the same data: 0.020 and 0.061, measured)
    assert np.median(errors) < 0.015 and np.percentile(errors, 90) < 0.04
    # far outside the training replica counts (m <= 3), a load each replica handles easily is predicted served
    features = LoadFeatures(token_rate_tps=40 * 6000.0, input_len_mean=64.0, input_len_var=32.0**2,
                            output_len_mean=32.0)
    far_mean, _ = predictor.predict(elasticity_grid(features, np.array([40, 64])))
    assert np.all(far_mean > 0.95)


@pytest.mark.parametrize("seed", range(4))
def test_logistic_prior_mean_is_non_decreasing_in_m(seed):
    rng = np.random.default_rng(seed)
    predictor = fit_elasticity([s for s, _ in _knee_samples(rng, 40)], FAST)
    post = predictor.posterior
    grid = np.arange(1, 65)
    for _ in range(20):
        features = LoadFeatures(token_rate_tps=float(np.exp(rng.uniform(np.log(1e3), np.log(1e6)))),
                                input_len_mean=float(rng.uniform(32, 1000)), input_len_var=float(rng.uniform(0, 1e5)),
                                output_len_mean=float(rng.uniform(8, 200)))
        x = (elasticity_grid(features, grid) - post.x_mean) / post.x_std
        prior, noise = post.prior(x)
        assert np.all(np.diff(prior[:, 0]) >= -1e-12)
        assert np.all(noise > 0)
    # the signs hold whatever the data: replicas "up", load per replica "down", total rate unused
    w = post.mean_weights[0]
    assert ELASTICITY_MEAN_SIGNS == ("off", "free", "free", "free", "up", "down")
    assert w[0] == 0 and w[4] >= 0 and w[5] <= 0 and post.mean_amplitude[0] >= 0


def test_policy_refuses_an_unknown_elasticity_mean():
    with pytest.raises(ValueError, match="elasticity_mean"):
        OraclePolicy(elasticity_mean="quadratic")
    with pytest.raises(ValueError, match="sign"):
        fit_exact_gp(np.zeros((4, 2)) + np.arange(4)[:, None], np.arange(4.0), mean_signs=("up",))


def test_fit_refuses_too_little_or_bad_data():
    with pytest.raises(ValueError):
        fit_exact_gp(np.zeros((2, 1)), np.zeros(2))
    with pytest.raises(ValueError):
        fit_exact_gp(np.array([[0.0], [1.0], [np.nan]]), np.zeros(3))
    with pytest.raises(ValueError, match="optimizer"):
        fit_exact_gp(np.array([[0.0], [1.0], [2.0]]), np.zeros(3), optimizer="sgd")


def test_capacity_gp_learns_roofline_needs_within_noise(training_set, roofline):
    train, test = training_set.capacity[::2], training_set.capacity[1::2]
    predictor = fit_capacity(train, FAST)
    mean, std = predictor.predict(capacity_inputs([s.features for s in test]))
    truth = np.array([roofline.needs(s.features, training_set.tpot_slo_ms).as_tuple() for s in test])
    rel = np.abs(mean - truth) / truth
    assert np.median(rel) < 0.1  # 5 % measurement noise in the training data
    assert np.all(std > 0)
    assert predictor.version.startswith("gp-capacity-n")


def test_elasticity_gp_learns_attainment(training_set):
    samples = training_set.elasticity
    predictor = fit_elasticity(samples[::2], FAST)
    test = samples[1::2]
    mean, std = predictor.predict(elasticity_inputs([s.features for s in test], [s.num_replicas for s in test]))
    errors = np.abs(mean - np.array([s.attainment for s in test]))
    assert np.median(errors) < 0.05
    assert np.all((mean >= 0) & (mean <= 1)) and np.all(std > 0)


def test_the_same_data_gives_the_same_version(training_set):
    a = fit_elasticity(training_set.elasticity[:30], FAST)
    b = fit_elasticity(training_set.elasticity[:30], FAST)
    c = fit_elasticity(training_set.elasticity[:31], FAST)
    assert a.version == b.version != c.version


def test_stacked_models_predict_exactly_what_each_predicts_alone(training_set):
    from oracle.core.stacked import StackedElasticity

    samples = training_set.elasticity
    # four models fitted on different data (different sizes), one with the identity target, the rest logit
    predictors = [fit_elasticity(samples[:20], replace(FAST, attainment_target="identity")),
                  fit_elasticity(samples[10:45], FAST),
                  fit_elasticity(samples[5:30], OraclePolicy(num_train_iters=25, attainment_target="logit")),
                  fit_elasticity(samples[3:33], OraclePolicy(num_train_iters=25, elasticity_mean="constant"))]
    assert predictors[0].posterior.mean_amplitude[0] > 0 and predictors[3].posterior.mean_amplitude[0] == 0
    grid = np.arange(1, 17)
    inputs = np.stack([elasticity_grid(samples[i].features, grid) for i in (0, 7, 19, 25)])
    for k_sigma in (None, 1.0):  # the std as reported, and the one the bound is taken with
        mean, std = StackedElasticity(predictors).predict(inputs, k_sigma=k_sigma)
        for i, p in enumerate(predictors):
            alone_mean, alone_std = p.predict(inputs[i], k_sigma=k_sigma)
            np.testing.assert_allclose(mean[i], alone_mean, atol=1e-9)
            np.testing.assert_allclose(std[i], alone_std, atol=1e-9)

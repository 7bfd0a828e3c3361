"""gpytorch training: the numpy posterior reproduces gpytorch's own predictions; the fitted predictors learn."""
import numpy as np
import pytest
import torch
import gpytorch

from oracle.core.policy import OraclePolicy
from oracle.gp import fit_capacity, fit_elasticity, fit_exact_gp
from oracle.gp.exact import build
from oracle.core.features import capacity_inputs, elasticity_inputs

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
    from oracle.core.features import elasticity_grid
    from oracle.core.stacked import StackedElasticity

    samples = training_set.elasticity
    # three models fitted on different data (different sizes), one with a logit target
    predictors = [fit_elasticity(samples[:20], FAST), fit_elasticity(samples[10:45], FAST),
                  fit_elasticity(samples[5:30], OraclePolicy(num_train_iters=25, attainment_target="logit"))]
    grid = np.arange(1, 17)
    inputs = np.stack([elasticity_grid(samples[i].features, grid) for i in (0, 7, 19)])
    mean, std = StackedElasticity(predictors).predict(inputs)
    for i, p in enumerate(predictors):
        alone_mean, alone_std = p.predict(inputs[i])
        np.testing.assert_allclose(mean[i], alone_mean, atol=1e-9)
        np.testing.assert_allclose(std[i], alone_std, atol=1e-9)

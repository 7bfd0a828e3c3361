"""The bound the planners size replica counts by uses the GP's uncertainty about the expected attainment (latent),
not one window's label noise (predictive): with noisy labels the latent bound sits above the predictive one at every
m, so a high target is reached with fewer replicas. The std an answer reports stays the predictive one."""

import pytest

from contracts import ElasticityItem, ElasticityQuery
from oracle.core import OraclePolicy
from oracle.gp import gp_oracle
from oracle.profile.grid import GridPoint, LengthMix, load_grid
from oracle.profile.synthetic import roofline_training_set

from .conftest import TTFT_SLO_MS, TPOT_SLO_MS

CHAT = LengthMix("chat", 400, 0.8, 150)


@pytest.fixture(scope="module")
def noisy_set(roofline):
    grid = load_grid([2, 5, 10, 20, 40, 80, 160], [CHAT], [1, 2, 4, 8])
    return roofline_training_set("qwen", roofline, grid, TTFT_SLO_MS, TPOT_SLO_MS, attainment_noise=0.01, seed=2)


def answers(profile, noisy_set, bound_std: str, target: str = "identity"):
    oracle = gp_oracle({"qwen": profile}, policy=OraclePolicy(num_train_iters=20, elasticity_bound_std=bound_std,
                                                              attainment_target=target))
    oracle.add_training_set(noisy_set)
    oracle.refit("qwen", "elasticity", now_s=0.0)
    light = GridPoint(2.0, CHAT, 1).features
    query = ElasticityQuery(items=(ElasticityItem(model="qwen", features=light, replicas=(1, 2, 4, 8)),), k_sigma=1.0)
    return oracle.elasticity(query).predictions[0]


def test_the_latent_bound_reaches_the_target_where_the_predictive_one_cannot(profile, noisy_set):
    latent, predictive = answers(profile, noisy_set, "latent"), answers(profile, noisy_set, "predictive")
    assert latent.source == predictive.source == "gp"
    assert latent.attainment_mean == pytest.approx(predictive.attainment_mean)  # one GP, one mean
    assert min(latent.attainment_mean[1:]) > 0.99  # a light load: the profile says m >= 2 attains
    assert all(lb >= pb + 0.003 for lb, pb in zip(latent.attainment_bound, predictive.attainment_bound))
    assert latent.attainment_std == pytest.approx(predictive.attainment_std)  # the reported std is the window's


def test_on_the_logit_scale_a_plateau_near_one_is_sure_of_itself(profile, noisy_set):
    """Identity target: the latent std is symmetric, so a mean of 1.0 still carries it below and a 0.99 target can
    be out of reach at every m (the simulator's learned Janus sized by the saturation rule then: docs/bench/sim.md
    run 28). Logit target (the default): the std shrinks as p (1 - p) near the ceiling, so the plateau's bound
    reaches the target while the knee's stays wide."""
    identity = answers(profile, noisy_set, "latent", "identity")
    logit = answers(profile, noisy_set, "latent", "logit")
    assert OraclePolicy().attainment_target == "logit"
    assert min(logit.attainment_mean[1:]) > 0.99
    plateau = slice(1, None)  # m >= 2 of (1, 2, 4, 8)
    assert max(logit.attainment_std[plateau]) < min(identity.attainment_std[plateau])
    assert min(logit.attainment_bound[plateau]) >= 0.99


def test_an_unknown_bound_std_is_refused():
    with pytest.raises(ValueError, match="elasticity_bound_std"):
        OraclePolicy(elasticity_bound_std="psychic")


def test_the_logit_bound_is_taken_on_the_logit_scale():
    """mean - k std = sigmoid(mu - k sigma): the delta method's std (sigma p (1 - p)) only for small sigma; where the
    GP extrapolates (sigma of logits) it would keep the bound within a point of a mean near 1."""
    import numpy as np

    from oracle.core.predictors import attainment_scale

    mu, sigma = np.array([6.9, 6.9, 0.0, -2.0]), np.array([0.01, 3.0, 1.0, 0.5])
    mean, std = attainment_scale(mu, sigma, True, k_sigma=1.0)
    assert mean - std == pytest.approx(1.0 / (1.0 + np.exp(-(mu - sigma))))
    _, delta = attainment_scale(mu, sigma, True)
    assert std[0] == pytest.approx(delta[0], rel=0.01)  # small sigma: the two agree
    assert mean[1] - std[1] < 0.985 < mean[1] - 1.0 * delta[1]  # extrapolating: only the logit-scale bound is wary
    identity_mean, identity_std = attainment_scale(np.array([1.2, 0.5]), np.array([0.1, 0.1]), False, k_sigma=1.0)
    assert identity_mean.tolist() == [1.0, 0.5] and identity_std.tolist() == [0.1, 0.1]

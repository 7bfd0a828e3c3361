"""The bound the planners size replica counts by uses the GP's uncertainty about the expected attainment (latent),
not one window's label noise (predictive): with noisy labels the latent bound sits above the predictive one at every
m, so a high target is reached with fewer replicas. The std an answer reports stays the predictive one."""
from dataclasses import replace

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


def answers(profile, noisy_set, bound_std: str):
    oracle = gp_oracle({"qwen": profile}, policy=OraclePolicy(num_train_iters=20, elasticity_bound_std=bound_std))
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


def test_an_unknown_bound_std_is_refused():
    with pytest.raises(ValueError, match="elasticity_bound_std"):
        OraclePolicy(elasticity_bound_std="psychic")

"""Past the largest replica count an Elasticity GP was trained on, the oracle asks it at that count and the same load
per replica (`OraclePolicy.past_trained_replicas: pooled`): more replicas at one load per replica attain at least as
well (the dispatcher pools their queues), so the answer is a lower bound where the GP has no data. With "prior" the GP
extrapolates to its prior mean with a widening sigma (docs/oracle.md, "Replica counts past the grid")."""
import math

import numpy as np
import pytest

from contracts import ElasticityItem, ElasticityQuery, LoadFeatures
from oracle.core import OraclePolicy
from oracle.core.features import REPLICAS_COLUMN, elasticity_grid, elasticity_row
from oracle.gp import gp_oracle
from oracle.profile.grid import LengthMix, load_grid
from oracle.profile.synthetic import roofline_training_set

from .conftest import TPOT_SLO_MS, TTFT_SLO_MS

CHAT = LengthMix("chat", 400, 0.8, 150)
COUNTS = tuple(range(1, 65))
LOAD = LoadFeatures(token_rate_tps=150_000.0, input_len_mean=400.0, input_len_var=320.0 ** 2, output_len_mean=150.0)


def test_a_count_past_the_trained_one_is_asked_at_it_with_the_same_load_per_replica():
    grid = elasticity_grid(LOAD, np.arange(1, 17), pooled_past=4)
    for m in range(1, 5):  # within: as asked
        assert grid[m - 1].tolist() == pytest.approx(elasticity_row(LOAD, m))
    for m in range(5, 17):  # past: 4 replicas at the load per replica of m
        pooled = LOAD.model_copy(update={"token_rate_tps": LOAD.token_rate_tps * 4 / m})
        assert grid[m - 1].tolist() == pytest.approx(elasticity_row(pooled, 4))
        assert grid[m - 1][REPLICAS_COLUMN] == pytest.approx(math.log(4))
    assert elasticity_grid(LOAD, np.arange(1, 17)).tolist() != grid.tolist()
    with pytest.raises(ValueError, match="pooled_past"):
        elasticity_grid(LOAD, np.arange(1, 4), pooled_past=0)


def answer(profile, training_set, mode: str):
    oracle = gp_oracle({"qwen": profile}, policy=OraclePolicy(num_train_iters=20, past_trained_replicas=mode))
    oracle.add_training_set(training_set)
    oracle.refit("qwen", "elasticity", now_s=0.0)
    query = ElasticityQuery(items=(ElasticityItem(model="qwen", features=LOAD, replicas=COUNTS),), k_sigma=1.0)
    return oracle.elasticity(query).predictions[0]


def test_a_load_past_the_profiled_counts_is_bounded_from_the_largest_count_not_the_prior(roofline, profile):
    # labels that scatter by 3 points on counts 1-4: past 4 the prior's sigma keeps the bound from ever reaching a
    # 0.99 target (the scaler would fall back on its saturation rule and take large counts); pooled, it does
    training = roofline_training_set("qwen", roofline, load_grid([2, 5, 10, 20, 40, 80], [CHAT], [1, 2, 4]),
                                     TTFT_SLO_MS, TPOT_SLO_MS, attainment_noise=0.03, seed=3)
    truth = roofline.attainment_many(LOAD, list(COUNTS), TTFT_SLO_MS, TPOT_SLO_MS)
    prior, pooled = answer(profile, training, "prior"), answer(profile, training, "pooled")

    def needed(attainments) -> int | None:
        return next((m for m, a in zip(COUNTS, attainments) if a >= 0.99), None)

    assert needed(prior.attainment_bound) is None
    assert needed(truth) <= needed(pooled.attainment_bound) <= 32  # reached, and no fewer than the load needs
    assert pooled.attainment_bound[:4] == prior.attainment_bound[:4]  # within the trained counts: the same bound
    assert list(pooled.attainment_bound) == sorted(pooled.attainment_bound)


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="past_trained_replicas"):
        OraclePolicy(past_trained_replicas="linear")

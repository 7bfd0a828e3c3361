"""Past the lengths it was trained on, an Elasticity GP answers no better than the model's roofline (docs/oracle.md,
"Past the profiled lengths"): a profile of 400-token prompts says nothing of 30,000-token ones, whose prefill alone
takes longer than the TTFT SLO on any number of replicas. Inside the profiled lengths the GP answers alone."""

import pytest

from contracts import ElasticityItem, ElasticityQuery, LoadFeatures
from oracle.core import OraclePolicy
from oracle.gp import gp_oracle
from oracle.profile.grid import LengthMix, load_grid
from oracle.profile.synthetic import roofline_training_set

from .conftest import TTFT_SLO_MS, TPOT_SLO_MS

CHAT = LengthMix("chat", 400, 0.8, 150)
COUNTS = (1, 2, 4, 8, 16, 32)


@pytest.fixture(scope="module")
def chat_set(roofline):
    grid = load_grid([2, 5, 10, 20, 40, 80], [CHAT], [1, 2, 4, 8])
    return roofline_training_set("qwen", roofline, grid, TTFT_SLO_MS, TPOT_SLO_MS, attainment_noise=0.01, seed=3)


def answer(profile, chat_set, features: LoadFeatures, factor: float):
    oracle = gp_oracle({"qwen": profile}, policy=OraclePolicy(num_train_iters=20, length_extrapolation_factor=factor))
    oracle.add_training_set(chat_set)
    oracle.refit("qwen", "elasticity", now_s=0.0)
    query = ElasticityQuery(items=(ElasticityItem(model="qwen", features=features, replicas=COUNTS),), k_sigma=1.0)
    return oracle.elasticity(query).predictions[0]


def test_prompts_far_longer_than_profiled_are_capped_by_the_roofline(roofline, profile, chat_set):
    long_prompts = LoadFeatures(token_rate_tps=3_000.0, input_len_mean=30_000.0, input_len_var=4_000.0 ** 2,
                                output_len_mean=150.0)
    truth = roofline.attainment_many(long_prompts, list(COUNTS), TTFT_SLO_MS, TPOT_SLO_MS)
    assert max(truth) < 0.7  # the prefill alone misses the TTFT SLO: its tokens start late
    uncapped = answer(profile, chat_set, long_prompts, factor=0)
    capped = answer(profile, chat_set, long_prompts, factor=OraclePolicy().length_extrapolation_factor)
    assert uncapped.source == capped.source == "gp"
    assert max(uncapped.attainment_mean[2:]) > 0.9  # the GP alone: its prior, where the load per replica is light
    for m, mean, bound, true in zip(COUNTS, capped.attainment_mean, capped.attainment_bound, truth):
        assert mean <= true + 1e-9, m  # the roofline is evaluated at fewer counts and held between them: lower
        assert bound <= mean
    assert list(capped.attainment_mean) == sorted(capped.attainment_mean)  # still non-decreasing in m
    assert max(capped.attainment_bound) < 0.7  # a 0.99 target is out of reach: the scaler's saturation rule


def test_inside_the_profiled_lengths_the_gp_answers_alone(profile, chat_set):
    chat = LoadFeatures(token_rate_tps=20_000.0, input_len_mean=450.0, input_len_var=300.0 ** 2, output_len_mean=140.0)
    capped = answer(profile, chat_set, chat, factor=OraclePolicy().length_extrapolation_factor)
    uncapped = answer(profile, chat_set, chat, factor=0)
    assert capped.attainment_mean == uncapped.attainment_mean
    assert capped.attainment_bound == uncapped.attainment_bound


def test_a_factor_below_one_is_refused():
    with pytest.raises(ValueError, match="length_extrapolation_factor"):
        OraclePolicy(length_extrapolation_factor=0.8)

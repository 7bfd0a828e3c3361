"""The decode-over-prefill token cost the oracle tells the elastic scaler (oracle.roofline.decode_token_cost_ratio,
Oracle.decode_token_cost_ratio): measured, from the roofline a profile fitted, never from a datasheet's defaults;
carried in ElasticityPrediction, and read back from a training set's meta (calibrated_profile)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from contracts import ElasticityItem, ElasticityQuery, LoadFeatures
from oracle.core import ModelProfile, Oracle, TrainingSet, calibrated_profile, roofline_meta
from oracle.training_files import load_training_set, save_training_set
from oracle.profile.grid import GridPoint, LengthMix
from oracle.profile.synthetic import roofline_training_set
from oracle.roofline import Efficiency, RooflineModel, decode_context_per_seq
from oracle.specs import device, model_shape

ROOFLINE = RooflineModel(device("nvidia-h200"), model_shape("qwen2-7b"))
CHAT = LoadFeatures(token_rate_tps=5_000.0, input_len_mean=1_000.0, input_len_var=0.0, output_len_mean=300.0)


def test_a_tighter_tpot_means_a_smaller_decode_batch_and_a_dearer_decode_token():
    ratios = [ROOFLINE.decode_token_cost_ratio(CHAT, tpot) for tpot in (200.0, 50.0, 20.0, 10.0, 5.0)]
    assert ratios == sorted(ratios) and ratios[-1] > 2 * ratios[0]
    with pytest.raises(ValueError, match="tpot_slo_ms"):
        ROOFLINE.decode_token_cost_ratio(CHAT, 0.0)


def test_less_kv_room_means_a_smaller_decode_batch():
    small = RooflineModel(replace(ROOFLINE.device, hbm_bytes=int(ROOFLINE.weight_bytes * 1.3)), ROOFLINE.shape)
    assert small.decode_token_cost_ratio(CHAT, 200.0) > ROOFLINE.decode_token_cost_ratio(CHAT, 200.0)


def test_the_ratio_is_per_token_decode_at_the_slo_batch_over_per_token_prefill_in_a_full_step():
    eff = ROOFLINE.efficiency
    ratio = ROOFLINE.decode_token_cost_ratio(CHAT, 50.0)
    per_prefill_token = ROOFLINE.prefill_ms(8 * 1_000.0, 8) / 8_000.0  # 8 prompts fill the 8,192-token step
    ctx = 1_000.0 + 150.0
    batches = [b for b in range(1, eff.max_num_seqs + 1)
               if b * ctx <= ROOFLINE.max_num_kv_tokens and ROOFLINE.decode_step_ms(b, b * ctx) <= 50.0]
    assert batches, "some decode batch fits the SLO"
    best = max(batches)
    assert ratio == pytest.approx(ROOFLINE.decode_step_ms(best, best * ctx) / best / per_prefill_token, rel=1e-9)


def test_a_decoding_sequence_holds_more_context_the_more_answer_lengths_spread():
    # prompt + half the answer, averaged over decode steps: an answer of o tokens is in o steps
    assert decode_context_per_seq(CHAT) == pytest.approx(1_000.0 + 150.0)
    spread = CHAT.model_copy(update={"output_len_var": 300.0 ** 2})  # CV 1: twice the half answer
    assert decode_context_per_seq(spread) == pytest.approx(1_000.0 + 300.0)
    answers = [1, 1, 1, 897]  # mean 225: three one-token answers and one long one
    steps = [(1_000.0 + k) for o in answers for k in range(o)]  # each step's context, prompt + tokens so far
    measured = CHAT.model_copy(update={"output_len_mean": 225.0, "output_len_var": float(
        sum((o - 225.0) ** 2 for o in answers) / 4)})
    assert decode_context_per_seq(measured) == pytest.approx(sum(steps) / len(steps), rel=2e-3)
    assert decode_context_per_seq(CHAT.model_copy(update={"output_len_mean": 0.0})) == 1_000.0


def test_spread_answers_fill_the_kv_cache_sooner_and_price_a_decode_token_dearer():
    # the 32B kind of the simulated die: a batch of ~650-token contexts is capped by max_num_seqs, one of
    # length-biased contexts by the KV cache (docs/oracle.md, "Prefill and decode")
    big = RooflineModel(device("ascend-910c-die"), model_shape("qwen2.5-32b"), tp=2)
    mean = LoadFeatures(token_rate_tps=3e5, input_len_mean=320.0, input_len_var=0.0, output_len_mean=660.0)
    ratios = [big.decode_token_cost_ratio(mean.model_copy(update={"output_len_var": (cv * 660.0) ** 2}), 68.0)
              for cv in (0.0, 0.5, 1.0, 1.7)]
    assert ratios == sorted(ratios) and ratios[-1] > 1.5 * ratios[0]


def _oracle(is_calibrated: bool) -> Oracle:
    return Oracle({"m": ModelProfile(ROOFLINE, 500.0, 50.0, is_calibrated=is_calibrated)})


@pytest.mark.parametrize("is_calibrated", [True, False])
def test_only_a_calibrated_profile_tells_the_scaler_a_ratio(is_calibrated):
    reply = _oracle(is_calibrated).elasticity(ElasticityQuery(items=(ElasticityItem(model="m", features=CHAT,
                                                                                    replicas=(1, 2, 4)),)))
    ratio = reply.predictions[0].decode_token_cost_ratio
    if is_calibrated:
        assert ratio == pytest.approx(ROOFLINE.decode_token_cost_ratio(CHAT, 50.0))
        # the answers' spread is part of the load the ratio is kept for: no answer of another load's
        spread = CHAT.model_copy(update={"output_len_var": 600.0 ** 2})
        again = _oracle(True)
        again.elasticity(ElasticityQuery(items=(ElasticityItem(model="m", features=CHAT, replicas=(1,)),)))
        assert again.decode_token_cost_ratio("m", spread) == pytest.approx(
            ROOFLINE.decode_token_cost_ratio(spread, 50.0))
    else:
        assert ratio is None  # the datasheet's default efficiencies were never measured


def test_a_training_set_carries_its_fitted_roofline_back_as_a_calibrated_profile(tmp_path):
    fitted = RooflineModel(device("ascend-910c-die"), model_shape("qwen2.5-32b"), tp=2,
                           efficiency=Efficiency(mfu=0.41, mbu=0.66, step_overhead_ms=1.5))
    grid = [GridPoint(rate, LengthMix("chat", 800, 0.5, 200), m) for rate in (2.0, 8.0) for m in (1, 2)]
    save_training_set(roofline_training_set("big", fitted, grid, 1_000.0, 50.0), tmp_path / "big.json")
    loaded = load_training_set(tmp_path / "big.json")
    profile = calibrated_profile(loaded, 1_000.0, 50.0)
    assert profile is not None and profile.is_calibrated and profile.roofline.tp == 2
    assert profile.roofline.efficiency == fitted.efficiency and profile.roofline.device == fitted.device
    assert profile.roofline.decode_token_cost_ratio(CHAT, 50.0) == fitted.decode_token_cost_ratio(CHAT, 50.0)
    assert set(roofline_meta(fitted)) <= set(loaded.meta)
    # a training set without a recorded roofline (written by hand) gives none: the scaler keeps its policy's ratio
    assert calibrated_profile(TrainingSet(model="hand"), 1_000.0, 50.0) is None
    assert calibrated_profile(loaded, 1_000.0, 0.0) is None  # no TPOT SLO: no decode batch to size the ratio at
    broken = TrainingSet(model="bad", meta={**roofline_meta(fitted), "efficiency": {"mfu": 2.0}})
    assert calibrated_profile(broken, 1_000.0, 50.0) is None

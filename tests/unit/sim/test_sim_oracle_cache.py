"""The oracle memo: same answers as the oracle for bucketed loads, fewer questions, correct across a cache reset."""
import pytest

import sim.oracle_cache as oc
from contracts import ElasticityItem, ElasticityQuery, LoadFeatures
from oracle.core.oracle import ModelProfile, Oracle
from oracle.roofline import RooflineModel
from oracle.specs import device, model_shape
from sim.oracle_cache import CachedOracle, bucket


@pytest.fixture()
def oracle():
    rm = RooflineModel(device("ascend-910c-die"), model_shape("qwen2-7b"), 1)
    return Oracle({"m": ModelProfile(rm, 1000.0, 60.0, roofline_attainment_std=0.0)})


def _query(rate, replicas):
    f = LoadFeatures(token_rate_tps=rate, input_len_mean=700.0, input_len_var=1e5, output_len_mean=120.0)
    return ElasticityQuery(items=(ElasticityItem(model="m", features=f, replicas=replicas),))


def test_bucket_is_within_resolution_and_stable():
    for v in (1.0, 37.3, 12345.6):
        b = bucket(v, 0.05)
        assert abs(b / v - 1) <= 0.025 + 1e-12 and bucket(b, 0.05) == pytest.approx(b)
    assert bucket(0.0, 0.05) == 0.0


def test_answers_equal_the_oracle_on_the_bucketed_load(oracle):
    cached = CachedOracle(oracle, resolution=0.05)
    rate = bucket(20_000.0, 0.05)
    got = cached.elasticity(_query(rate, (1, 2, 4))).predictions[0]
    want = oracle.elasticity(_query(rate, (1, 2, 4))).predictions[0]
    assert got.attainment_bound == pytest.approx(want.attainment_bound)
    assert cached.num_misses == 3
    again = cached.elasticity(_query(rate * 1.01, (2, 4))).predictions[0]  # same bucket: answered from memory
    assert cached.num_misses == 3 and cached.num_hits == 2
    assert again.attainment_bound == pytest.approx(want.attainment_bound[1:])


def test_a_reset_between_lookups_loses_no_answer(oracle, monkeypatch):
    monkeypatch.setattr(oc, "MAX_ENTRIES", 1)  # the cache clears on almost every insert
    cached = CachedOracle(oracle)
    first = cached.elasticity(_query(15_000.0, (1, 2, 3))).predictions[0]
    second = cached.elasticity(_query(15_000.0, (3, 4))).predictions[0]  # 3 a hit, 4 a miss, then a reset
    assert second.replicas == (3, 4)
    assert second.attainment_bound[0] == pytest.approx(first.attainment_bound[2])
    assert list(second.attainment_bound) == sorted(second.attainment_bound)


def test_the_decode_token_cost_ratio_goes_with_the_answer():
    # the elastic scaler splits prefill and decode instances by it (planner.core.split_prefill_decode); a memo that
    # dropped it left the simulated scaler on its policy's 2.0 where the live one had the device's ratio
    rm = RooflineModel(device("ascend-910c-die"), model_shape("qwen2-7b"), 1)
    calibrated = Oracle({"m": ModelProfile(rm, 1000.0, 60.0, roofline_attainment_std=0.0, is_calibrated=True)})
    want = calibrated.elasticity(_query(20_000.0, (1, 2))).predictions[0].decode_token_cost_ratio
    assert want is not None and want > 0
    cached = CachedOracle(calibrated)
    miss = cached.elasticity(_query(20_000.0, (1, 2))).predictions[0]
    hit = cached.elasticity(_query(20_000.0, (2,))).predictions[0]
    assert cached.num_hits == 1
    assert miss.decode_token_cost_ratio == hit.decode_token_cost_ratio == pytest.approx(want, rel=0.05)


def test_loads_that_differ_only_in_their_answers_spread_get_their_own_ratio():
    # the ratio prices a decode token by the context a decoding sequence holds, which grows with the spread of the
    # answers (oracle.roofline.decode_context_per_seq): a memo keyed without it answered one for both
    rm = RooflineModel(device("ascend-910c-die"), model_shape("qwen2.5-32b"), 2)
    calibrated = Oracle({"m": ModelProfile(rm, 1000.0, 68.0, roofline_attainment_std=0.0, is_calibrated=True)})
    cached = CachedOracle(calibrated)
    f = LoadFeatures(token_rate_tps=3e5, input_len_mean=320.0, input_len_var=1e5, output_len_mean=660.0)
    spread = f.model_copy(update={"output_len_var": (1.7 * 660.0) ** 2})
    ratios = [cached.elasticity(ElasticityQuery(items=(ElasticityItem(model="m", features=g, replicas=(8,)),)))
              .predictions[0].decode_token_cost_ratio for g in (f, spread)]
    assert cached.num_misses == 2
    assert ratios[1] > 1.5 * ratios[0]
    assert ratios[1] == pytest.approx(calibrated.decode_token_cost_ratio("m", spread), rel=0.05)

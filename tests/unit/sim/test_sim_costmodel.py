"""The simulator's device model reproduces the roofline exactly, and picks tensor parallelism sensibly."""
import random

import numpy as np
import pytest

from oracle.roofline import RooflineModel
from oracle.specs import MODEL_SHAPES, device, model_shape
from sim.costmodel import StepCost, min_tp


@pytest.mark.parametrize("device_name", ["ascend-910c-die", "nvidia-h200"])
@pytest.mark.parametrize("shape_name", ["qwen2-0.5b", "qwen2-7b", "llama-3-70b", "deepseek-v3-671b"])
def test_step_times_match_the_roofline(device_name, shape_name):
    dev, shape = device(device_name), model_shape(shape_name)
    tp = min_tp(dev, shape)
    cost, rm = StepCost(RooflineModel(dev, shape, tp)), RooflineModel(dev, shape, tp)
    rng = random.Random(0)
    for _ in range(30):
        b, k = rng.randint(1, 256), rng.randint(0, 200_000)
        n, s = rng.randint(1, 8000), rng.randint(1, 4)
        assert cost.decode_s(b, k) * 1e3 == pytest.approx(rm.decode_step_ms(b, k), rel=1e-9)
        assert cost.prefill_s(n, s) * 1e3 == pytest.approx(rm.prefill_ms(n, s), rel=1e-9)
    tokens = np.array([1, 17, 512, 4000])
    assert np.allclose(cost.prefill_s_many(tokens) * 1e3, rm.prefill_ms(tokens), rtol=1e-9)


def test_mixed_iteration_costs_more_than_either_part_and_less_than_both():
    cost = StepCost(RooflineModel(device("nvidia-h200"), model_shape("qwen2-7b"), 1))
    prefill, decode = cost.prefill_s(2048), cost.decode_s(64, 64 * 1000)
    mixed = cost.iteration_s(2048, 1, 64, 64 * 1000)
    assert max(prefill, decode) < mixed < prefill + decode


def test_load_times_order_fork_warm_cold():
    cost = StepCost(RooflineModel(device("ascend-910c-die"), model_shape("llama-3-70b"), 4))
    t = cost.load_times()
    assert t.d2d_s < t.h2d_s < t.disk_s
    # 70B bf16 over 4 dies: ~35 GB each at 163.6 GB/s device links
    assert t.d2d_s == pytest.approx(cost.weight_bytes / 163.6e9, rel=1e-6)


def test_min_tp_leaves_room_for_kv():
    die = device("ascend-910c-die")
    assert min_tp(die, model_shape("qwen2-7b")) == 1
    assert min_tp(die, model_shape("llama-3-70b")) == 4
    assert min_tp(die, model_shape("deepseek-v3-671b")) == 16  # the paper's TP=16
    for shape in MODEL_SHAPES.values():
        tp = min_tp(die, shape)
        assert RooflineModel(die, shape, tp).max_num_kv_tokens > 0


@pytest.mark.parametrize("shape_name", ["qwen2-0.5b", "qwen2-7b", "llama-3-70b", "deepseek-v3-671b"])
def test_the_fast_roofline_gives_the_oracle_the_same_answers(shape_name):
    from contracts import LoadFeatures
    from sim.costmodel import FastRoofline, fast_roofline

    dev, shape = device("ascend-910c-die"), model_shape(shape_name)
    tp = min_tp(dev, shape)
    plain = RooflineModel(dev, shape, tp)
    fast = fast_roofline(StepCost(RooflineModel(dev, shape, tp)))
    assert isinstance(fast, FastRoofline) != shape.is_moe  # MoE keeps the plain roofline
    rng = random.Random(1)
    for _ in range(25):
        f = LoadFeatures(token_rate_tps=rng.uniform(100, 400_000), input_len_mean=rng.uniform(50, 4000),
                         input_len_var=rng.uniform(0, 1e6), output_len_mean=rng.uniform(10, 800))
        m = rng.randint(1, 64)
        assert fast.attainment(f, m, 2000.0, 80.0) == pytest.approx(plain.attainment(f, m, 2000.0, 80.0), abs=1e-9)
        assert fast.decode_step_ms(3.7, 5000.5) == pytest.approx(plain.decode_step_ms(3.7, 5000.5), rel=1e-9)
        got, want = fast.needs(f, 80.0), plain.needs(f, 80.0)
        assert (got.hbm, got.compute, got.bandwidth) == pytest.approx((want.hbm, want.compute, want.bandwidth),
                                                                       rel=1e-9)
    with pytest.raises(ValueError):
        fast.decode_step_ms(0, 10)

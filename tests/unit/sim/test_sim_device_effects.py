"""The simulated device is not the oracle's roofline: each effect of sim/device_effects.py, on hand-checkable cases."""
import math
import statistics

import pytest

from dispatcher.core import Algorithm, DispatchPolicy
from oracle.roofline import RooflineModel
from oracle.specs import device, model_shape
from sim.costmodel import StepCost
from sim.device_effects import DeviceEffects, StepEffects
from sim.dispatch import CoreDispatch
from sim.event_loop import Sim
from sim.requests import RequestTable
from sim.trace import Trace

DEV = device("nvidia-h200")
COST = StepCost(RooflineModel(DEV, model_shape("qwen2-0.5b"), 1))
ONLY = dict(colocation_slowdown=0.0, mixed_step_penalty=0.0, small_batch_penalty=0.0, jitter_rel_std=0.0,
            fork_source_slowdown=0.0)


def _finish_s(effects: DeviceEffects, num_instances: int = 1, prompt: int = 1000, output: int = 2) -> float:
    """When the first of `num_instances` requests (one per instance, all on one device, arriving together) ends."""
    n = num_instances
    trace = Trace.build([0.0] * n, list(range(n)), [prompt] * n, [output] * n, tuple(f"m{i}" for i in range(n)))
    table = RequestTable(trace, [1.0] * n, [0.05] * n)
    sim = Sim(table, 1, DEV.hbm_bytes * 0.9, DEV.d2d_bytes_per_s, effects)
    CoreDispatch(sim, trace.app_names, [COST] * n, DispatchPolicy(algorithm=Algorithm.ROUND_ROBIN))
    for app in range(n):
        sim.launch(app, "colocated", "steady", (0,), COST, 0.0)
    sim.run()
    return float(table.finish_s[0] if output > 1 else table.first_token_s[0])


def test_off_is_the_roofline():
    assert DeviceEffects.off().is_off and not DeviceEffects().is_off
    assert _finish_s(DeviceEffects.off(), output=1) == pytest.approx(COST.prefill_s(1000), rel=1e-9)


def test_colocated_instances_slow_each_others_rounds():
    # two long decodes share every round of one device: each round 10 % slower than the sum of their steps
    slowed = DeviceEffects(**{**ONLY, "colocation_slowdown": 0.1})
    shared, bare = _finish_s(slowed, 2, prompt=10, output=300), _finish_s(DeviceEffects.off(), 2, prompt=10, output=300)
    assert 1.08 < shared / bare <= 1.1 + 1e-9
    alone = _finish_s(slowed, 1, prompt=10, output=300)
    assert alone == pytest.approx(_finish_s(DeviceEffects.off(), 1, prompt=10, output=300), rel=1e-9), \
        "an instance alone on its device is not slowed"


def test_each_step_effect():
    effects = StepEffects(DeviceEffects(**{**ONLY, "mixed_step_penalty": 0.1, "small_batch_penalty": 0.3,
                                           "small_batch_knee": 16, "fork_source_slowdown": 0.057}), "t")
    assert effects.instance_step(1.0, 4, True, False) == pytest.approx(1.1), "prefill with decodes: mixed"
    assert effects.instance_step(1.0, 0, True, False) == pytest.approx(1.0), "a pure prefill is not mixed"
    assert effects.instance_step(1.0, 1, False, False) == pytest.approx(1.3), "decode at batch 1: full penalty"
    assert effects.instance_step(1.0, 16, False, False) == pytest.approx(1.0), "from the knee on: none"
    assert effects.instance_step(1.0, 16, False, True) == pytest.approx(1.057), "being forked from"


def test_jitter_has_mean_one_shrinks_over_a_run_and_is_reproducible():
    effects = DeviceEffects(**{**ONLY, "jitter_rel_std": 0.05})
    one = [StepEffects(effects, "a").round_factor(1, 1) for _ in range(1)]
    draws = StepEffects(effects, "a")
    singles = [draws.round_factor(1, 1) for _ in range(4000)]
    runs = [draws.round_factor(1, 100) for _ in range(4000)]
    assert statistics.fmean(singles) == pytest.approx(1.0, abs=0.005)
    assert statistics.stdev(singles) == pytest.approx(0.05, rel=0.1)
    assert statistics.stdev(runs) == pytest.approx(0.005, rel=0.15), "a run of n steps: std / sqrt(n)"
    assert StepEffects(effects, "a").round_factor(1, 1) == one[0], "the same stream, the same draws"
    assert StepEffects(effects, "b").round_factor(1, 1) != one[0]
    assert all(math.isfinite(x) and x > 0 for x in singles)

"""The oracle's profiling harness against the simulated device (sim/profile_device.py): what a deployment would do
with its hardware, with the device's effects unknown to the oracle."""
import pytest

from oracle.profile.grid import GridPoint, LengthMix
from oracle.profile.harness import HarnessSettings, profile_model
from sim.costmodel import step_cost
from sim.device_effects import DeviceEffects
from sim.profile_device import SimDeviceProfiler
from oracle.specs import device, model_shape

COST = step_cost(device("nvidia-h200"), model_shape("qwen2-7b"), 1)
SETTINGS = HarnessSettings(duration_s=10.0, drain_s=20.0, ttft_slo_ms=1000.0, tpot_slo_ms=60.0, clock="thread_cpu")
MIX = LengthMix("chat", 512, 1.0, 128)


def test_the_clock_is_the_devices_and_the_effects_show_in_the_measured_steps():
    bare = SimDeviceProfiler("qwen2-7b", COST, DeviceEffects.off(), SETTINGS, max_replicas=2)
    slow = SimDeviceProfiler("qwen2-7b", COST, DeviceEffects(jitter_rel_std=0.0, small_batch_penalty=0.5),
                             SETTINGS, max_replicas=2)
    decode_bare = [s.wall_ms for s in bare.calibration if s.batch_size == 1]
    decode_slow = [s.wall_ms for s in slow.calibration if s.batch_size == 1]
    assert decode_bare and all(b == pytest.approx(1e3 * COST.decode_s(1, c.context_tokens), rel=1e-6)
                               for b, c in zip(decode_bare, [s for s in bare.calibration if s.batch_size == 1]))
    assert all(s == pytest.approx(1.5 * b, rel=1e-6) for s, b in zip(decode_slow, decode_bare))


def test_attainment_falls_with_the_load_and_rises_with_replicas():
    profiler = SimDeviceProfiler("qwen2-7b", COST, DeviceEffects(), SETTINGS, max_replicas=4)
    light = profiler.run_point(GridPoint(1.0, MIX, 1), 0)[1].attainment
    heavy = profiler.run_point(GridPoint(200.0, MIX, 1), 1)[1].attainment
    spread = profiler.run_point(GridPoint(200.0, MIX, 4), 2)[1].attainment
    assert light > 0.95 and heavy < 0.8 and spread > heavy


def test_a_profile_of_the_simulated_device_is_a_training_set():
    profiler = SimDeviceProfiler("qwen2-7b", COST, DeviceEffects(), SETTINGS, max_replicas=2)
    grid = [GridPoint(r, MIX, m) for r in (2.0, 20.0) for m in (1, 2)]
    out = profile_model(profiler, grid, model="app-x", show_progress=False)
    assert out.model == "app-x" and out.device == "nvidia-h200" and out.shape == "qwen2-7b"
    assert len(out.elasticity) == 4 and len(out.capacity) == 6  # one capacity sample per replica per point
    assert all(0.0 <= s.attainment <= 1.0 for s in out.elasticity)
    assert all(c.needs.hbm > 0 and c.needs.compute >= 0 for c in out.capacity)

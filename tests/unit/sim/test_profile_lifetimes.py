"""A profile's grid point runs long enough for its requests' decode batch to reach what the load holds in steady
state (HarnessSettings.min_request_lifetimes, oracle/profile/harness.py): a point shorter than a request's lifetime
measures the start of a load one replica cannot hold as attained (docs/oracle.md, "Profiling the real engine")."""
from oracle.profile.grid import GridPoint, LengthMix
from dataclasses import replace

import pytest

from oracle.profile.harness import HarnessSettings, lifetime_output_len, point_duration_s, request_lifetime_s
from oracle.profile.run import DEVICE
from oracle.specs import device, model_shape
from sim.costmodel import step_cost
from sim.device_effects import DeviceEffects
from sim.profile_device import SimDeviceProfiler

COST = step_cost(device("nvidia-h200"), model_shape("qwen2-7b"), 1)
LONG_ANSWERS = LengthMix("long-answers", 256, 0.5, 600)  # 600 tokens at 60 ms: a 37 s lifetime


def settings(lifetimes: float) -> HarnessSettings:
    return HarnessSettings(duration_s=4.0, drain_s=20.0, ttft_slo_ms=1000.0, tpot_slo_ms=60.0, clock="thread_cpu",
                           min_request_lifetimes=lifetimes)


def test_a_point_of_long_answers_runs_for_two_lifetimes():
    s = settings(2.0)
    assert request_lifetime_s(600, s) == 1.0 + 600 * 0.06
    assert point_duration_s(600, s) == 74.0
    assert point_duration_s(600, settings(1.0)) == 37.0
    assert point_duration_s(10, s) == 4.0  # short answers: the plan's duration
    assert DEVICE.harness_settings().min_request_lifetimes == HarnessSettings().min_request_lifetimes == 2.0


def test_lifetimes_counted_in_the_answer_in_flight_are_as_long_as_the_spread_makes_it():
    # samples of 100- and 1,100-token answers: mean 600, variance 250,000; in flight, on average 600 + 250,000 / 600
    spread = LengthMix.of_samples("spread", ((256, 100), (256, 1100)))
    assert spread.output_len_var == pytest.approx(250_000)
    in_flight = replace(settings(2.0), lifetime_answer="in-flight")
    assert lifetime_output_len(spread, settings(2.0)) == 600, "the default: the mean answer"
    assert lifetime_output_len(spread, in_flight) == pytest.approx(600 + 250_000 / 600)
    # a brute-force check: a sequence in flight at a random moment is o tokens long with odds o * P(o)
    assert lifetime_output_len(spread, in_flight) == pytest.approx((100 * 100 + 1100 * 1100) / (100 + 1100))
    # the point spans two lifetimes of that answer: 2 x (1 s + 1,016.7 x 60 ms)
    point = GridPoint(1.0, spread, 1)
    profiler = SimDeviceProfiler("qwen2-7b", COST, DeviceEffects.off(), in_flight, max_replicas=1)
    _, _, info = profiler.run_point(point, 0)
    assert info["duration_s"] == pytest.approx(2 * (1.0 + (600 + 250_000 / 600) * 0.06))
    with pytest.raises(ValueError, match="lifetime_answer"):
        replace(settings(2.0), lifetime_answer="median")


def test_one_replica_past_its_batch_is_seen_only_by_a_point_that_long():
    # 60 requests a second of 600-token answers: at the H200's ~9 ms decode steps, ~320 sequences in flight in
    # steady state, more than the engine batches (max_num_seqs 256), so the queue and the late tokens grow once the
    # batch has filled (after ~5 s); four seconds of arrivals hold ~240
    assert COST.max_num_seqs == 256
    point = GridPoint(60.0, LONG_ANSWERS, 1)
    labels = {}
    for lifetimes in (0.0, 2.0):
        profiler = SimDeviceProfiler("qwen2-7b", COST, DeviceEffects.off(), settings(lifetimes), max_replicas=1)
        _, sample, info = profiler.run_point(point, 0)
        labels[lifetimes] = (sample.attainment, info["duration_s"])
    assert labels[0.0][1] == 4.0 and labels[2.0][1] == 74.0
    assert labels[0.0][0] > 0.95  # four seconds of arrivals never fill the batch
    assert labels[2.0][0] < labels[0.0][0] - 0.1  # two lifetimes show the overload


def test_the_knee_search_pilots_run_as_long_as_a_point():
    # The knee placed the grid's loads: 4 s pilots of 600-token answers put it where one replica scores 1.0 over
    # 4 s (the batch still filling), and the loads around it missed the real knee at every m (docs/bench/sim.md
    # run 33). With pilots of two lifetimes the knee comes out lower, each pilot is 74 s long and is a sample.
    knees = {}
    for lifetimes in (0.0, 2.0):
        profiler = SimDeviceProfiler("qwen2-7b", COST, DeviceEffects.off(), settings(lifetimes), max_replicas=1)
        knee, runs, samples = profiler.measured_capacity_rps(LONG_ANSWERS, 20.0, duration_s=4.0, max_runs=5)
        knees[lifetimes] = knee
        assert {run["duration_s"] for run in runs} == ({74.0} if lifetimes else {4.0})
        if lifetimes:
            assert len(samples) == len(runs)  # every pilot long enough for its requests: training data
    assert knees[2.0] < 0.5 * knees[0.0]  # measured: 62 against 320 requests a second

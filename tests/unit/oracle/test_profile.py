"""The profiling harness: workload, measurement, the virtual-clock replay over the real engine, calibration."""
import itertools

import numpy as np
import pytest

from oracle.profile.calibrate import StepSample, fit_efficiency
from oracle.profile.grid import GridPoint, LengthMix, load_grid
from oracle.profile.measure import RequestRecord, StepRecord, attainment, decode_step_line, replica_needs
from oracle.profile.workload import synth_requests
from oracle.roofline import Efficiency, RooflineModel
from oracle.specs import h200, model_shape

MIX = LengthMix("chat", 64, 0.5, 8)


def test_workload_is_poisson_seeded_and_clipped():
    point = GridPoint(50.0, LengthMix("x", 300, 1.0, 40), 1)
    a = synth_requests(point, 20.0, seed=3, max_prompt_len=400, max_output_len=50)
    assert a == synth_requests(point, 20.0, seed=3, max_prompt_len=400, max_output_len=50)
    assert abs(len(a) - 1000) < 4 * np.sqrt(1000)
    assert all(0 <= r.arrival_s < 20.0 for r in a)
    assert max(r.prompt_len for r in a) == 400 and min(r.prompt_len for r in a) >= 1
    assert max(r.output_len for r in a) <= 50
    with pytest.raises(ValueError):
        synth_requests(point, 0.0, 1, 10, 10)
    with pytest.raises(ValueError):
        load_grid([], [MIX], [1])


def test_token_level_attainment_counts_each_token_against_its_deadline():
    on_time = RequestRecord(0.0, 10, 3, [0.1, 0.12, 0.14])  # TTFT 100 ms, 20 ms apart: all on time
    late_start = RequestRecord(1.0, 10, 3, [1.3, 1.31, 1.32])  # TTFT 300 ms: the slack comes back by token 3
    unfinished = RequestRecord(2.0, 10, 4, [2.1])  # 3 tokens never delivered: late
    result = attainment([on_time, late_start, unfinished], ttft_slo_ms=200.0, tpot_slo_ms=100.0)
    # late_start: token 1 due 0.2 (late), token 2 due 0.3 (0.31 late), token 3 due 0.4 (0.32 on time)
    assert result.token == pytest.approx((3 + 1 + 1) / 10)
    assert result.ttft == pytest.approx(2 / 3)
    assert result.tpot == pytest.approx(2 / 3)  # the unfinished request misses its TPOT
    assert attainment([], 1.0, 1.0).token == 1.0


def test_a_run_cut_short_scores_the_tokens_due_by_its_end_only():
    # TTFT 200 ms, TPOT 100 ms; the run stops at 2.55 s: the long answer's tokens 1-4 are due by then (arrival 2.0:
    # at 2.2, 2.3, 2.4, 2.5), tokens 5-100 are not
    long_answer = RequestRecord(2.0, 10, 100, [2.1, 2.25])  # two delivered on time, tokens 3 and 4 due and missing
    stalled = RequestRecord(0.0, 10, 5, [])  # nothing delivered, every token due by 2.55 s: all late
    done = RequestRecord(0.0, 10, 2, [0.1, 0.2])  # finished: scored whole, with or without the horizon
    cut = attainment([long_answer, stalled, done], ttft_slo_ms=200.0, tpot_slo_ms=100.0, horizon_s=2.55)
    assert cut.token == pytest.approx((2 + 0 + 2) / (4 + 5 + 2))
    # without the horizon the 96 tokens nobody could have delivered yet count late, as if the device were overloaded
    whole = attainment([long_answer, stalled, done], ttft_slo_ms=200.0, tpot_slo_ms=100.0)
    assert whole.token == pytest.approx(4 / 107) and whole.token < cut.token
    # a request that arrived after the last due time a token could have: nothing of it scored
    assert attainment([RequestRecord(2.5, 10, 9, [])], 200.0, 100.0, horizon_s=2.55).token == 1.0
    assert attainment([done], 200.0, 100.0, horizon_s=0.05).token == 1.0


def test_decode_line_recovers_a_known_step_curve():
    steps = [StepRecord(0.0, 0.002 + 0.0005 * b + 1e-6 * c, 0, b, c, 0)
             for b, c in itertools.product([1, 2, 4, 8, 16], [100, 1000, 5000])]
    a, b, c = decode_step_line(steps)
    assert (a, b, c) == pytest.approx((0.002, 0.0005, 1e-6), rel=1e-6)


def test_replica_needs_apply_the_paced_definition_to_measured_steps():
    roofline = RooflineModel(h200(), model_shape("qwen2-0.5b"))
    # 10 s window: 200 decode-only steps of batch 4 at 5 ms, and 10 prefill steps of 512 tokens at 30 ms
    steps = [StepRecord(0.0, 0.005, 0, 4, 400, 1 << 20) for _ in range(200)]
    steps += [StepRecord(0.0, 0.030, 512, 0, 0, 2 << 20) for _ in range(10)]
    needs = replica_needs(steps, 10.0, roofline, tpot_slo_ms=50.0, mean_context_per_seq=100.0)
    out_rate = 800 / 10.0
    paced = roofline.paced_decode_steps_per_s(out_rate, 50.0)
    assert needs.compute == pytest.approx(10 * 0.030 / 10.0 + paced * 0.005)
    assert needs.hbm == pytest.approx((roofline.weight_bytes + (2 << 20)) / h200().hbm_bytes)
    assert needs.bandwidth > 0
    with pytest.raises(ValueError):
        replica_needs(steps, 0.0, roofline, 50.0, 100.0)


def test_calibration_recovers_the_efficiency_that_made_the_steps():
    truth = Efficiency(mfu=0.3, mbu=0.1, step_overhead_ms=2.0)
    made = RooflineModel(h200(), model_shape("qwen2-1.5b"), efficiency=truth)
    samples = [StepSample(made.prefill_ms(n), num_prefill_tokens=n) for n in (16, 256, 2048, 8192)]
    # decode steps whose KV reads span 1x to 100x the weights, so memory time and overhead are separable
    samples += [StepSample(made.decode_step_ms(b, b * ctx), batch_size=b, context_tokens=b * ctx)
                for b, ctx in ((1, 300), (64, 4000), (256, 8000), (256, 30000))]
    fitted = fit_efficiency(RooflineModel(h200(), model_shape("qwen2-1.5b")), samples)
    # a log-spaced grid of 49 points over 4 decades: within one grid step (x1.21)
    assert fitted.mfu == pytest.approx(0.3, rel=0.22)
    assert fitted.mbu == pytest.approx(0.1, rel=0.22)
    assert fitted.step_overhead_ms == pytest.approx(2.0, rel=0.3)
    with pytest.raises(ValueError):
        fit_efficiency(made, samples[:2])


def test_a_fixed_mbu_is_kept_and_the_rest_is_fitted_around_it():
    truth = Efficiency(mfu=0.3, mbu=0.1, step_overhead_ms=2.0)
    made = RooflineModel(h200(), model_shape("qwen2-1.5b"), efficiency=truth)
    samples = [StepSample(made.prefill_ms(n), num_prefill_tokens=n) for n in (16, 256, 2048, 8192)]
    samples += [StepSample(made.decode_step_ms(b, b * 300), batch_size=b, context_tokens=b * 300) for b in (1, 64)]
    fitted = fit_efficiency(RooflineModel(h200(), model_shape("qwen2-1.5b")), samples, mbu=0.1)
    assert fitted.mbu == 0.1
    assert fitted.mfu == pytest.approx(0.3, rel=0.02)
    assert fitted.step_overhead_ms == pytest.approx(2.0, rel=0.05)
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="mbu"):
            fit_efficiency(made, samples, mbu=bad)


class StepClock:
    """A deterministic timer: every read advances 5 ms, so each engine step 'takes' 5 ms of virtual time."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        self.now += 0.005
        return self.now


@pytest.fixture(scope="module")
def engines(demo_models_dir):
    import torch

    from worker.engine.config import EngineConfig
    from worker.engine.engine import LLMEngine

    torch.set_num_threads(1)
    config = EngineConfig(kv_cache_bytes=8 << 20, max_num_seqs=16)
    return [LLMEngine(demo_models_dir / "demo-tiny", config=config) for _ in range(2)]


def test_virtual_replicas_serve_every_request_on_their_own_clocks(engines):
    from oracle.profile.harness import step_probe
    from oracle.profile.virtual_clock import run_virtual

    workload = synth_requests(GridPoint(40.0, MIX, 2), 1.0, seed=1, max_prompt_len=200, max_output_len=20)
    result = run_virtual(engines, workload, engines[0].model_config.vocab_size, end_s=60.0, probe=step_probe,
                         timer=StepClock(), id_prefix="t1-")
    assert not result.is_truncated
    for request in workload:
        record = result.requests[request.request_id]
        assert len(record.token_times_s) == request.output_len
        assert record.token_times_s[0] > request.arrival_s
        assert record.token_times_s == sorted(record.token_times_s)
    counts = [len(r.request_ids) for r in result.replicas]
    assert sum(counts) == len(workload) and min(counts) > 0.3 * len(workload)
    for replica in result.replicas:
        assert all(s.wall_s == pytest.approx(0.005) for s in replica.steps)
        assert sum(s.num_decode_tokens + s.num_prefill_tokens for s in replica.steps) > 0
        assert not replica.engine.has_unfinished()


def test_virtual_run_stops_at_its_end_and_counts_the_rest_late(engines):
    from oracle.profile.harness import step_probe
    from oracle.profile.virtual_clock import run_virtual

    workload = synth_requests(GridPoint(400.0, MIX, 1), 1.0, seed=2, max_prompt_len=200, max_output_len=20)
    result = run_virtual(engines[:1], workload, engines[0].model_config.vocab_size, end_s=0.5, probe=step_probe,
                         timer=StepClock(), id_prefix="t2-")
    assert result.is_truncated
    assert attainment(list(result.requests.values()), 100.0, 20.0).token < 1.0
    assert not engines[0].has_unfinished()


class RateClock:
    """A deterministic timer whose every reading advances `rate` seconds: a step timed by two readings takes `rate`."""

    def __init__(self):
        self.now, self.rate = 0.0, 0.003

    def __call__(self) -> float:
        self.now += self.rate
        return self.now


def test_speed_probe_factor_is_quiet_time_over_time_now(engines):
    from oracle.profile.speed import SpeedProbe

    clock = RateClock()
    probe = SpeedProbe(engines[0], engines[0].model_config.vocab_size, clock, prompt_len=32, repeats=3)
    with pytest.raises(RuntimeError):
        probe.factor()
    assert probe.calibrate(num_samples=3) == pytest.approx(0.003)
    assert probe.factor() == pytest.approx(1.0)
    clock.rate = 0.006  # the machine runs the engine at half speed now
    assert probe.factor() == pytest.approx(0.5)
    assert not engines[0].has_unfinished()  # the probe leaves the engine empty


def test_profiler_records_the_speed_factor_of_each_point(demo_models_dir):
    from ops.profile import EngineProfiler
    from oracle.profile.harness import HarnessSettings

    point = GridPoint(5.0, MIX, 1)
    measured = dict(duration_s=0.3, drain_s=0.1, clock="thread_cpu")  # the probe corrects measured step times
    plain = EngineProfiler(demo_models_dir / "demo-tiny", HarnessSettings(**measured), max_replicas=1)
    assert plain.probe is None and plain.run_point(point, 0)[2]["speed_factor"] == 1.0
    corrected = EngineProfiler(demo_models_dir / "demo-tiny",
                               HarnessSettings(**measured, is_speed_corrected=True), max_replicas=1)
    assert corrected.probe is not None and corrected.probe.reference_s > 0
    factor = corrected.run_point(point, 0)[2]["speed_factor"]
    assert 0.0 < factor <= 1.5 and factor == pytest.approx(corrected.speed_factor, abs=1e-4)


def test_the_grid_widens_by_doublings_to_twice_the_count_telemetry_needs_and_stops_at_the_cap():
    from oracle.profile.run import DEVICE, MAX_PROFILED_REPLICAS, widened_replicas

    assert widened_replicas(DEVICE.replicas, 4) == (1, 2, 4, 8)  # within half the largest: the plan as it is
    assert widened_replicas(DEVICE.replicas, 12) == (1, 2, 4, 8, 16, 32)
    assert widened_replicas(DEVICE.replicas, 10_000) == (1, 2, 4, 8, 16, 32) and MAX_PROFILED_REPLICAS == 32
    # the oracle's profile_max_replicas raised: a count past 32 (the headline's busiest 32B app asks ~90 in its first
    # minute) is profiled at 64, not extrapolated to from 32 (docs/bench/sim.md, run 51)
    assert widened_replicas(DEVICE.replicas, 40, max_replicas=64) == (1, 2, 4, 8, 16, 32, 64)
    assert widened_replicas(DEVICE.replicas, 10_000, max_replicas=24) == (1, 2, 4, 8, 16, 24)

"""The step-cost clock of the profiler: step shapes read from the real engine, the cost fit, and replays whose
virtual time no longer follows how long the machine took."""
import numpy as np
import pytest

from oracle.profile.grid import GridPoint, LengthMix
from oracle.profile.step_cost import ShapeTracker, StepCostModel, StepShape, fit_step_cost
from oracle.profile.workload import synth_requests

MIX = LengthMix("chat", 64, 0.5, 8)


def test_fit_recovers_the_costs_that_made_the_steps():
    truth = (2e-3, 1.5e-5, 8e-5, 2.5e-7, 1e-8)
    rng = np.random.default_rng(3)
    samples = []
    for _ in range(60):
        prefill = int(rng.integers(0, 1500))
        shape = StepShape(prefill, int(rng.integers(0, 48)), int(rng.integers(0, 20000)),
                          prefill * (prefill + int(rng.integers(0, 500))))
        samples.append((shape, float(np.dot(truth, shape.features()))))
    model = fit_step_cost(samples)
    assert model.coef == pytest.approx(truth, rel=1e-3)
    assert model.fit_p90_error < 1e-3
    assert model.seconds(StepShape(num_decode_tokens=1)) == pytest.approx(truth[0] + truth[2], rel=1e-3)


def test_fit_refuses_too_few_or_empty_timings():
    with pytest.raises(ValueError, match="at least 5"):
        fit_step_cost([(StepShape(1, 0, 0, 1), 1e-3)] * 4)
    with pytest.raises(ValueError, match="> 0"):
        fit_step_cost([(StepShape(1, 0, 0, 1), 1e-3)] * 4 + [(StepShape(0, 1, 9, 0), 0.0)])


@pytest.fixture(scope="module")
def engine(demo_models_dir):
    import torch

    from worker.engine.config import EngineConfig
    from worker.engine.engine import LLMEngine

    torch.set_num_threads(1)
    return LLMEngine(demo_models_dir / "demo-tiny", config=EngineConfig(kv_cache_bytes=8 << 20, max_num_seqs=16))


def test_tracker_reads_prefill_decode_and_finished_sequences(engine):
    from contracts import SamplingParams

    tracker = ShapeTracker()
    engine.add_request("a", list(range(1, 41)), SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    engine.add_request("b", list(range(1, 11)), SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    tracker.before(engine)  # both are still in the engine's inbox: they count from nothing
    engine.step()
    assert tracker.after(engine) == StepShape(50, 0, 0, 40 * 40 + 10 * 10)
    tracker.before(engine)
    engine.step()  # one decode each; "a" finishes here and leaves the running list, and still counts
    assert tracker.after(engine) == StepShape(0, 2, 41 + 11, 0)
    tracker.before(engine)
    engine.step()
    assert tracker.after(engine) == StepShape(0, 1, 12, 0)
    assert not engine.has_unfinished()


class RateTimer:
    """A deterministic timer whose every reading advances `rate` seconds (a machine of a given speed)."""

    def __init__(self, rate: float):
        self.now, self.rate = 0.0, rate

    def __call__(self) -> float:
        self.now += self.rate
        return self.now


def test_a_step_cost_clock_makes_the_replay_independent_of_the_machines_speed(engine):
    from oracle.profile.harness import step_probe
    from oracle.profile.measure import attainment
    from oracle.profile.virtual_clock import run_virtual

    cost = StepCostModel((2e-3, 2e-5, 1e-4, 3e-7, 1e-8))
    workload = synth_requests(GridPoint(150.0, MIX, 1), 1.0, seed=4, max_prompt_len=200, max_output_len=20)
    runs = {}
    for rate in (0.001, 0.03):  # a quiet and a busy machine
        runs[rate] = run_virtual([engine], workload, engine.model_config.vocab_size, end_s=60.0, probe=step_probe,
                                 timer=RateTimer(rate), id_prefix=f"r{rate}-", step_cost=cost)
        steps = runs[rate].replicas[0].steps
        assert all(s.measured_s == pytest.approx(rate) for s in steps)
        assert all(s.wall_s > cost.coef[0] for s in steps if s.num_prefill_tokens or s.num_decode_tokens)
    quiet, busy = (runs[r].requests for r in (0.001, 0.03))
    assert all(quiet[rid].token_times_s == pytest.approx(busy[rid].token_times_s) for rid in quiet)
    # the measured clock, by contrast, follows the machine: the busy run attains less
    measured = {rate: run_virtual([engine], workload, engine.model_config.vocab_size, end_s=60.0, probe=step_probe,
                                  timer=RateTimer(rate), id_prefix=f"m{rate}-").requests for rate in (0.001, 0.03)}
    assert attainment(list(measured[0.03].values()), 100.0, 10.0).token \
        < attainment(list(measured[0.001].values()), 100.0, 10.0).token


def test_profiler_with_the_step_cost_clock_records_the_fit_and_the_drift(demo_models_dir):
    from ops.profile import EngineProfiler
    from oracle.profile.harness import HarnessSettings

    with pytest.raises(ValueError, match="speed probe"):
        HarnessSettings(clock="step_cost", is_speed_corrected=True)
    with pytest.raises(ValueError, match="one of"):
        HarnessSettings(clock="sundial")
    profiler = EngineProfiler(demo_models_dir / "demo-tiny", HarnessSettings(duration_s=0.3, drain_s=0.1,
                                                                             clock="step_cost"), max_replicas=1)
    cost = profiler.step_cost
    assert cost is not None and cost.coef[0] > 0 and sum(cost.coef[1:]) > 0
    assert cost.fit_median_error < 0.5
    _, sample, info = profiler.run_point(GridPoint(20.0, MIX, 1), 0)
    assert 0.0 <= sample.attainment <= 1.0
    assert info["measured_over_cost"] > 0


class SlowingTimer:
    """A machine that gets busier with every reading: later timings of the same step come out longer."""

    def __init__(self):
        self.now, self.rate = 0.0, 1e-3

    def __call__(self) -> float:
        self.now += self.rate
        self.rate *= 1.05
        return self.now


def test_measuring_keeps_the_quickest_pass_of_each_shape(engine):
    from oracle.profile.step_cost import measure_step_costs

    grid = dict(decode_batches=(0, 2), contexts=(24,), prefill_lens=(0, 16, 40), repeats=2)
    first = measure_step_costs(engine, engine.model_config.vocab_size, SlowingTimer(), rounds=1, **grid)
    best = measure_step_costs(engine, engine.model_config.vocab_size, SlowingTimer(), rounds=3, **grid)
    assert len(first) == len(best) == 5  # (0 decoding + 16 or 40 new) and (2 decoding + 0, 16 or 40 new)
    assert [shape for shape, _ in best] == [shape for shape, _ in first]
    assert [t for _, t in best] == pytest.approx([t for _, t in first])  # later passes ran on a busier machine
    assert {shape.num_decode_tokens for shape, _ in best} == {0, 2}
    assert not engine.has_unfinished()
    with pytest.raises(ValueError):
        measure_step_costs(engine, engine.model_config.vocab_size, SlowingTimer(), rounds=0)

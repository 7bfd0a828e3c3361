"""Workloads: public trace replay keeps what it must; the ServeGen generator is deterministic and skewed."""
import numpy as np
import pytest

from sim.public_traces import load_azure, load_mooncake, load_prism_arena
from sim.servegen import load_clients, servegen_trace
from sim.trace import Trace, burst_ratio

from .shared_data import needs_traces


@pytest.fixture(scope="module")
def clients():
    return load_clients()


def test_trace_build_sorts_stably_and_shifts_to_zero():
    t = Trace.build([5.0, 3.0, 3.0], [0, 1, 0], [1, 2, 3], [4, 5, 0], ("a", "b"))
    assert list(t.arrival_s) == [0.0, 0.0, 2.0]
    assert list(t.input_tokens) == [2, 3, 1]  # equal timestamps keep file order
    assert list(t.output_tokens) == [5, 1, 4]  # 0 clipped to 1
    assert t.compressed(2.0).arrival_s[-1] == 1.0


def test_trace_rejects_bad_columns():
    with pytest.raises(ValueError):
        Trace(np.array([1.0, 0.0]), np.zeros(2, np.int32), np.ones(2, np.int32), np.ones(2, np.int32), ("a",))
    with pytest.raises(ValueError):
        Trace.build([0.0], [3], [1], [1], ("a",))


@needs_traces
def test_public_traces_keep_order_lengths_and_apps():
    azure = load_azure()
    assert azure.num_requests == 19_366 and azure.num_apps == 1
    assert 3400 < azure.duration_s < 3600  # 58 minutes
    arena = load_prism_arena()
    assert arena.num_apps == 27 and arena.num_requests == 1_500
    assert arena.duration_s <= 600
    # the first row of the file is model dummy-lora-7b-rank-8-13 with 13 in / 199 out at t = 0
    assert arena.app_names[arena.app_ids[0]] == "dummy-lora-7b-rank-8-13"
    assert (arena.input_tokens[0], arena.output_tokens[0]) == (13, 199)
    moon = load_mooncake()
    assert moon.num_requests == 12_031 and np.all(np.diff(moon.arrival_s) >= 0)


@needs_traces
def test_servegen_is_deterministic_per_seed(clients):
    a = servegen_trace(num_requests=20_000, duration_s=300, clients=clients, seed=3)
    b = servegen_trace(num_requests=20_000, duration_s=300, clients=clients, seed=3)
    c = servegen_trace(num_requests=20_000, duration_s=300, clients=clients, seed=4)
    assert np.array_equal(a.arrival_s, b.arrival_s) and np.array_equal(a.input_tokens, b.input_tokens)
    assert not np.array_equal(a.arrival_s[:100], c.arrival_s[:100])


@needs_traces
def test_servegen_headline_trace_has_the_papers_shape(clients):
    t = servegen_trace(clients=clients)
    assert t.num_apps == 62
    assert 540_000 <= t.num_requests <= 660_000
    assert t.duration_s <= 1800.0
    # skew: the top 12 % of apps carry about 80 % of the requests
    assert 0.75 <= t.top_share(0.12) <= 0.88
    # bursts: many apps jump 5x or more over their trailing minute within 5 s
    ratios = [burst_ratio(t.arrival_s[t.app_ids == a]) for a in range(t.num_apps)]
    assert sum(r >= 5 for r in ratios) >= 20
    assert max(ratios) <= 100


def test_burst_ratio_sees_a_jump():
    steady = np.arange(0, 120, 0.5)  # 2 rps
    burst = np.sort(np.concatenate([steady, 100 + np.arange(0, 5, 0.05)]))  # +20 rps for 5 s at t = 100
    assert burst_ratio(steady) == pytest.approx(1.0, abs=0.1)
    assert burst_ratio(burst) > 8

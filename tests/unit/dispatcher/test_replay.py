"""The bench's replay on a small slice of a real trace: every request ends exactly once, and under overload
LST-IMH keeps more requests on time than the deadline-blind baselines."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SHARED = Path(os.environ.get("JANUS_SHARED_DIR", REPO.parent / "shared"))
TRACE = SHARED / "traces" / "azure2023_conv.csv"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_dispatch", REPO / "bench" / "dispatch.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not TRACE.exists(), reason="shared traces not present")
def test_overloaded_replay_favours_lst_imh():
    bench = load_bench()
    rows = bench.load_azure_conv(TRACE, 400, 0)
    fleet = bench.Fleet(num_instances=4, tokens_per_s=10_000.0, overhead_ms=10.0, noise_sigma=0.1)
    rate = 1.3 * bench.throughput_capacity_rps(rows, fleet)
    results = {name: bench.Replay(rows, rate, fleet, policy, 1000.0, seed=0).run()
               for name, policy in bench.POLICIES.items()}
    for result in results.values():
        assert result.num_on_time + result.num_late + result.num_failed == result.num_requests == 400
    assert results["round_robin"].num_failed == results["least_load"].num_failed == 0
    assert results["lst_imh/reject"].attainment > results["least_load"].attainment
    assert results["lst_imh/reject"].attainment > results["round_robin"].attainment
    # requeue serves some of what reject fails, late, without costing on-time requests
    assert results["lst_imh/requeue"].num_failed < results["lst_imh/reject"].num_failed

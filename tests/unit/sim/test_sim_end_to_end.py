"""Small whole-system runs: every system on one scenario, and the hand-checkable extremes."""
import numpy as np
import pytest

from sim.runner import EXTRA_SYSTEM_NAMES, SYSTEM_NAMES, ScenarioSpec, longest_first, run_many
from sim.scenario import build_scenario
from sim.systems.base import ControlPlane, SystemRun
from sim.systems.static import StaticPartition
from sim.trace import Trace

from .shared_data import needs_traces


def _one_app_scenario(arrivals, num_devices=1, is_warm_at_start=True):
    n = len(arrivals)
    trace = Trace.build(arrivals, [0] * n, [500] * n, [50] * n, ("solo",))
    scenario = build_scenario(trace, device_name="nvidia-h200", num_devices=num_devices,
                              tiers=((1.0, ("qwen2-7b",)),))
    scenario.is_warm_at_start = is_warm_at_start
    return scenario


def test_light_load_meets_every_slo():
    scenario = _one_app_scenario(np.arange(0, 20, 2.0))  # one request every 2 s
    result = SystemRun(scenario, StaticPartition()).run()
    s = result.summary
    assert s.token_attainment == 1.0 and s.ttft_attainment == 1.0 and s.num_failed == 0
    # one device for the whole 18 s trace
    assert s.device_hours == pytest.approx(18 / 3600)


def test_overload_misses_slos():
    scenario = _one_app_scenario(np.linspace(0, 1, 2000))  # 2000 requests in 1 s on one device
    s = SystemRun(scenario, StaticPartition()).run().summary
    assert s.token_attainment < 0.5


def test_rejections_are_kept_per_app_with_their_cause():
    # 2000 requests in 1 s on one device, and a dispatcher that rejects rather than requeues: it turns away what
    # cannot meet its deadline, as overloaded
    from dispatcher.core import Algorithm, DispatchPolicy, OverloadPolicy

    scenario = _one_app_scenario(np.linspace(0, 1, 2000))
    policy = DispatchPolicy(algorithm=Algorithm.LST_IMH, overload=OverloadPolicy.REJECT)
    result = SystemRun(scenario, StaticPartition(), dispatch_policy=policy).run()
    assert result.rejections, "an overload this deep must reject some requests"
    assert {code for _, _, code in result.rejections} == {"overloaded"}
    assert {app for _, app, _ in result.rejections} == {0}
    times = [t for t, _, _ in result.rejections]
    assert times == sorted(times) and 0.0 <= times[0] and times[-1] <= 30.0
    assert len(result.rejections) == result.counters["rejected"] == result.summary.num_failed


@pytest.mark.slow
# janus-learned profiles its kinds first on a fresh checkout (points of a request lifetime): 632 s alone on a 2-core
# host, and past 900 s with two simulations beside it
@pytest.mark.timeout(1800)
@needs_traces
def test_every_system_runs_the_same_small_scenario():
    spec = ScenarioSpec(num_apps=10, num_requests=6000, duration_s=120, window_s=20, num_devices=96,
                        oracle="clairvoyant")  # the learned one profiles first (test_sim_oracle_training.py)
    results = run_many(spec, list(SYSTEM_NAMES + EXTRA_SYSTEM_NAMES), processes=1)
    by_name = {r.system: r for r in results}
    assert set(by_name) == set(SYSTEM_NAMES + EXTRA_SYSTEM_NAMES)
    n = by_name["static"].summary.num_requests
    for r in results:
        s = r.summary
        assert s.num_requests == n
        assert 0.0 <= s.token_attainment <= 1.0
        assert s.device_hours > 0
    # static and prism-like reserve their devices for the whole run; static's are the fleet's split
    assert by_name["prism-like"].summary.mean_active_devices == pytest.approx(96, rel=0.01)
    assert by_name["static"].summary.mean_active_devices <= 96


def test_the_longest_systems_start_first():
    assert longest_first(["static", "janus", "prism-like", "elastic-only"]) == [
        "elastic-only", "janus", "prism-like", "static"]
    assert set(longest_first(list(SYSTEM_NAMES))) == set(SYSTEM_NAMES)


@pytest.mark.slow
@needs_traces
def test_parallel_results_come_back_in_the_order_asked():
    # started longest first (janus before static) on two processes, reported as listed
    spec = ScenarioSpec(num_apps=6, num_requests=1500, duration_s=60, window_s=5, num_devices=48,
                        oracle="clairvoyant")
    results = run_many(spec, ["static", "janus"], processes=2)
    assert [r.system for r in results] == ["static", "janus"]
    assert all(r.summary.num_requests == results[0].summary.num_requests > 0 for r in results)
    with pytest.raises(ValueError, match="listed twice"):
        run_many(spec, ["static", "static"], processes=2)


class _LaunchAtStart(ControlPlane):
    """One cold-loading instance of app 0 at t = 0, nothing else."""

    name = "launch-at-start"

    def install(self, run: SystemRun) -> None:
        run.launch(0, "colocated", "elastic", (0,), 0.0)


@pytest.mark.parametrize("max_wait_ms", [0.0, 120_000.0])
def test_requests_wait_for_a_starting_instance_only_when_the_policy_says_so(max_wait_ms):
    from dispatcher.core import Algorithm, DispatchPolicy, OverloadPolicy

    # all arrive while the weights load from disk (the model is warm nowhere)
    scenario = _one_app_scenario(np.linspace(0.1, 1.0, 10), is_warm_at_start=False)
    policy = DispatchPolicy(algorithm=Algorithm.LST_IMH, overload=OverloadPolicy.REQUEUE,
                            max_wait_for_instance_ms=max_wait_ms)
    result = SystemRun(scenario, _LaunchAtStart(), dispatch_policy=policy).run()
    assert scenario.cost(0).load_times().disk_s > 1.0  # the load outlasts the arrivals
    if max_wait_ms == 0:
        assert result.summary.num_failed == 10
        assert {code for _, _, code in result.rejections} == {"no_instance"}
    else:
        assert result.summary.num_failed == 0 and not result.rejections  # served once the instance is up
        assert result.summary.ttft_attainment == 0.0  # ... late: the load took longer than the TTFT SLO

"""A steady model's burst in the simulator: the overflow watch plans the steady pool early (planner.core.overflow),
and the model gets elastic replicas within seconds instead of at the next 30 s period."""
import numpy as np

from planner.core import PlannerPolicy, SteadyPolicy
from sim.scenario import build_scenario
from sim.systems.base import SystemRun
from sim.systems.janus import JanusControl
from sim.trace import Trace


def _burst_scenario():
    rng = np.random.default_rng(0)
    quiet = rng.uniform(0, 120, 60)  # "bursty": 0.5 req/s for two minutes ...
    burst = rng.uniform(65, 70, 200)  # ... and 40 req/s for 5 s, between two steady plans (60 and 90 s)
    neighbour = rng.uniform(0, 120, 240)  # "calm": 2 req/s throughout
    arrivals = np.concatenate([quiet, burst, neighbour])
    apps = [0] * (len(quiet) + len(burst)) + [1] * len(neighbour)
    n = len(arrivals)
    trace = Trace.build(arrivals, apps, rng.integers(200, 800, n), rng.integers(50, 200, n), ("bursty", "calm"))
    return build_scenario(trace, device_name="ascend-910c-die", num_devices=16, tiers=((1.0, ("qwen2-7b",)),))


def _steady_plans(control: JanusControl):
    return [p for p in control.plans if hasattr(p, "trigger")]


def test_a_steady_models_burst_gets_an_early_plan_and_is_served():
    scenario = _burst_scenario()
    control = JanusControl("both")
    result = SystemRun(scenario, control).run()
    plans = _steady_plans(control)
    assert "bursty" in plans[2].steady_models  # the periodic plan at 60 s: still small and calm
    early = [p for p in plans if p.trigger == "overflow"]
    assert len(early) == control.num_overflow_plans >= 1
    assert 65_000 < early[0].created_unix_ms < 72_000 and "bursty" not in early[0].steady_models

    off = JanusControl("both", planner_policy=PlannerPolicy(steady=SteadyPolicy(overflow_queue_depth=0)))
    without = SystemRun(scenario, off).run()
    assert not [p for p in _steady_plans(off) if p.trigger == "overflow"]
    assert result.summary.num_failed < without.summary.num_failed
    assert result.summary.token_attainment > without.summary.token_attainment + 0.1

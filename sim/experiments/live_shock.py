"""The live counterpart of the ablation's shock (issue 24): a scenario small enough for a CPU cluster of echo
workers (tests/bus/test_live_recovery.py), and the simulator's prediction for it.

Three apps on four devices, one of them shocked. The device is the ablation's die slowed `SLOWDOWN` times in compute
and memory bandwidth, with at most `MAX_NUM_SEQS` sequences per instance, so that an instance serves tens of tokens
per second: a rate a Python gateway streams on a shared two-core machine. The live workers' engines sleep each step
for this cost model's iteration time (the same `StepCost` the simulated devices run), with one step at a time per
device, so the live devices and the simulated ones are the same by construction; what differs is the control plane's
path (NATS, heartbeats, the dispatcher's windows, real activations) and the machine's noise. Recovery time as the
ablation defines it (docs/sim.md, "The five-app ablation")."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from ..scenario import AppSpec, Scenario, default_slos
from ..trace import Trace
from .ablation import ablation_trace, app_attainment_series, recovery_time_s

# (app, shape, base rate req/s): each app is one model, served live under the app's name
LIVE_APPS: tuple[tuple[str, str, float], ...] = (
    ("steady-a", "qwen2-0.5b", 1.0),
    ("steady-b", "qwen2-0.5b", 1.0),
    ("shocked", "qwen2-0.5b", 1.0),
)
SHOCK_APP = 2
SHOCK_FACTOR = 8.0  # 1 -> 8 req/s: ~180 tokens/s for the three apps, more than two instances serve
SHOCK_AT_S = 20.0  # the first 20 s bring the live cluster up from nothing and settle it
DURATION_S = 45.0
NUM_DEVICES = 4
SLOWDOWN = 150.0  # a decode step of ~0.12 s
MAX_NUM_SEQS = 8  # an instance serves ~70 tokens/s
INPUT_MEDIAN, OUTPUT_MEDIAN = 32, 16


def live_trace(seed: int = 0) -> Trace:
    return ablation_trace(LIVE_APPS, DURATION_S, SHOCK_APP, SHOCK_AT_S, SHOCK_FACTOR, seed,
                          input_median=INPUT_MEDIAN, output_median=OUTPUT_MEDIAN)


def live_scenario(seed: int = 0) -> Scenario:
    from oracle.roofline import Efficiency
    from oracle.specs import device, model_shape

    from ..costmodel import step_cost

    base = device("ascend-910c-die")
    dev = dataclasses.replace(base, name="live-echo", peak_bf16_flops_per_s=base.peak_bf16_flops_per_s / SLOWDOWN,
                              hbm_bytes_per_s=base.hbm_bytes_per_s / SLOWDOWN)
    eff = Efficiency(max_num_seqs=MAX_NUM_SEQS)
    apps = []
    for name, shape, _ in LIVE_APPS:
        ttft_s, tpot_s = default_slos(step_cost(dev, model_shape(shape), 1, eff))
        apps.append(AppSpec(name, shape, 1, ttft_s, tpot_s))
    return Scenario(live_trace(seed), dev, apps, NUM_DEVICES, eff)


def live_oracle(scenario: Scenario):
    """The oracle the simulated Janus plans with (systems/janus.py `make_oracle`), for the live planners too."""
    from ..systems.janus import make_oracle

    return make_oracle(SimpleNamespace(scenario=scenario, costs=[scenario.cost(a) for a in range(len(scenario.apps))]))


@dataclasses.dataclass(frozen=True)
class ShockOutcome:
    recovery_s: float
    shocked_attainment: float  # token attainment of the shocked app's requests that arrived after the shock
    bin_start_s: list
    shocked_series: list  # the shocked app's token attainment per 1 s bin


def shock_outcome(trace: Trace, num_on_time_tokens) -> ShockOutcome:
    """Recovery and the shocked app's attainment from each request's on-time tokens (the simulator's outcomes, or
    what a live client measured with `sim.metrics.on_time_tokens`)."""
    import numpy as np

    on_time = np.asarray(num_on_time_tokens)
    t, series = app_attainment_series(trace, SimpleNamespace(num_on_time_tokens=on_time), SHOCK_APP)
    shock = float(trace.meta["shock_at_s"])
    after = (trace.app_ids == SHOCK_APP) & (trace.arrival_s >= shock)
    att = float(on_time[after].sum() / max(1, trace.output_tokens[after].sum()))
    return ShockOutcome(recovery_time_s(t, series, shock), att, t.tolist(), series.tolist())


def predict(seed: int = 0, policy: dict | None = None) -> ShockOutcome:
    """The simulated Janus (live defaults, or `policy` as `janus config` prints it) on the live scenario."""
    from ..runner import janus_policies
    from ..systems.base import SystemRun
    from ..systems.janus import JanusControl

    planner, dispatch = janus_policies(policy)
    scenario = live_scenario(seed)
    result = SystemRun(scenario, JanusControl("both", planner, dispatch)).run()
    return shock_outcome(scenario.trace, result.outcomes.num_on_time_tokens)

"""The five-app ablation (issue 24, sim/experiments/ablation.py): the trace has its shock where it says, the
recovery time is computed as docs/sim.md defines it, and a tiny run goes end to end through `janus sim`."""
import json
import math

import numpy as np
import pytest

from sim.experiments.ablation import (FIVE_APPS, AblationSpec, ablation_trace, recovery_time_s,
                                      static_partition_devices, tiers_for)


def test_the_trace_has_the_shock_where_it_says():
    trace = ablation_trace(duration_s=120.0, shock_app=1, shock_at_s=40.0, shock_factor=20.0, seed=3)
    shock = trace.meta["shock_at_s"]
    assert abs(shock - 40.0) < 0.5  # the trace starts at its first arrival, a fraction of a second in
    for app, (_, _, rate) in enumerate(FIVE_APPS):
        t = trace.arrival_s[trace.app_ids == app]
        before = np.sum(t < shock) / shock
        after = np.sum(t >= shock) / (trace.duration_s - shock)
        factor = 20.0 if app == 1 else 1.0
        # Poisson counts: within 5 standard deviations of the rate
        assert abs(before - rate) < 5 * math.sqrt(rate / shock) + 1e-9
        assert abs(after - rate * factor) < 5 * math.sqrt(rate * factor / (trace.duration_s - shock))
    # the shocked app's rate jumps at the shock, not before: its last 10 s before vs first 10 s after
    t = trace.arrival_s[trace.app_ids == 1]
    assert np.sum((t >= shock - 10) & (t < shock)) < np.sum((t >= shock) & (t < shock + 10)) / 5


def test_the_trace_is_seeded_and_each_app_gets_its_model():
    a, b = ablation_trace(seed=1), ablation_trace(seed=1)
    assert np.array_equal(a.arrival_s, b.arrival_s) and np.array_equal(a.output_tokens, b.output_tokens)
    spec = AblationSpec()
    scenario = spec.build()
    assert [s.shape_name for s in scenario.apps] == [m for _, m, _ in FIVE_APPS]
    assert scenario.num_devices == static_partition_devices(scenario)  # 0: the static partition's size
    assert AblationSpec(num_devices=7).build().num_devices == 7
    assert len(tiers_for(a, [m for _, m, _ in FIVE_APPS])) == 5


def test_recovery_time_on_a_constructed_series():
    t = np.arange(60.0)
    att = np.ones(60)
    assert recovery_time_s(t, att, shock_at_s=20.0) == 0.0  # never dips
    att[20:27] = 0.3  # 7 s down
    assert recovery_time_s(t, att, 20.0) == 7.0
    att[29] = 0.5  # back for 2 s only, down again: the 5 s hold starts after it
    assert recovery_time_s(t, att, 20.0) == 10.0
    att[31:34] = np.nan  # bins without requests neither break a run (30, then 34 on) ...
    assert recovery_time_s(t, att, 20.0) == 10.0
    att[30] = np.nan  # ... nor start one: it starts at 34
    assert recovery_time_s(t, att, 20.0) == 14.0
    att[37:] = 0.89  # below 0.9 from 37 to the end: 34..36 is too short
    assert math.isinf(recovery_time_s(t, att, 20.0))
    assert recovery_time_s(t, att, 20.0, hold_s=3.0) == 14.0
    assert recovery_time_s(t, att, 20.0, threshold=0.85) == 14.0
    # a shock between bin starts: the first bin counted is the one after it
    assert recovery_time_s(t, np.ones(60), 20.5) == pytest.approx(0.5)


@pytest.mark.slow
def test_a_tiny_ablation_through_janus_sim(tmp_path):
    from sim.cli import main

    out = tmp_path / "ablation"
    fig = tmp_path / "shock.png"
    rc = main(["--experiment", "ablation", "--duration-s", "30", "--shock-at-s", "15", "--devices", "8",
               "--systems", "janus,elastic-only", "--processes", "1", "--out", str(out), "--figure", str(fig),
               "--oracle", "clairvoyant"])  # not the default learned one: no profiling in a test of the experiment
    assert rc == 0
    summary = json.loads((out / "ablation.json").read_text())
    rows = {r["system"]: r for r in summary["rows"]}
    assert set(rows) == {"janus", "elastic-only"}
    for r in rows.values():
        assert 0.0 <= r["token_attainment"] <= 1.0
        assert r["recovery_s"] >= 0.0  # json writes inf ("never") as Infinity
    assert summary["spec"]["num_devices"] == 8 and summary["spec"]["shock_at_s"] == 15.0
    series = summary["series"]["janus"]
    assert series["shock_app"] == "tail-8b" and len(series["shocked"]) == len(series["bin_start_s"])
    assert fig.stat().st_size > 0


def test_prism_with_janus_allocator_packs_the_tail_and_sizes_the_rest_with_the_oracle():
    """`prism-janus-allocator` (sim/systems/baselines.py): at its first placement the steady planner packs the four
    tail models onto shared devices and the elastic scaler gives the hot model the oracle's count within what the
    packing leaves; the run then goes through to an attainment."""
    from sim.runner import _systems
    from sim.systems.base import SystemRun

    scenario = AblationSpec(num_devices=9, duration_s=40.0, shock_at_s=20.0).build()
    control = _systems()["prism-janus-allocator"]()
    run = SystemRun(scenario, control)
    result = run.run()
    pools = control.pools
    steady_apps = {a for (_, a) in pools.steady}
    assert {1, 2, 3, 4} & steady_apps and len(pools.steady_devices) < len(steady_apps), "tail models share devices"
    hot = sum(len(v) for (app, _), v in pools.elastic.items() if app == 0)
    assert 1 <= hot <= scenario.num_devices - len(pools.steady_devices)
    assert control.planner_policy.elastic.is_debounced is False
    assert 0.0 < result.summary.token_attainment <= 1.0

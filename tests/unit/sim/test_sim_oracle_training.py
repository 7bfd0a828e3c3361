"""The simulated Janus learns its oracle as a deployment would: the oracle's profiling code against simulated
devices with effects the oracle does not know, GPs fitted on what it measured (sim/oracle_training.py)."""
from dataclasses import replace

import pytest

from contracts import ElasticityItem, ElasticityQuery, ElasticPlan
from oracle.profile.harness import HarnessSettings, is_pilot_long_enough, point_duration_s
from sim.device_effects import DeviceEffects
from sim.oracle_training import LENGTH_MARGIN, SIM_PLAN, cache_path, groups_of, learned_oracle, plan_for, profile_group
from sim.scenario import build_scenario
from sim.servegen import servegen_trace

pytestmark = pytest.mark.slow  # profiles two kinds of instance on simulated devices and fits four GPs

SMALL_PLAN = replace(SIM_PLAN, replicas=(1, 2), load_bands=((0.1, 0.3), (0.8, 1.2), (2.0, 3.0)), duration_s=4.0,
                     drain_s=8.0, pilot_duration_s=2.0, pilot_max_runs=4)


@pytest.fixture(scope="module")
def scenario():
    trace = servegen_trace(num_apps=4, duration_s=120.0, num_requests=2_000, seed=3)
    return build_scenario(trace, num_devices=16, tiers=((1.0, ("qwen2-7b", "qwen2.5-32b")),),
                          effects=DeviceEffects(seed=3))


def test_groups_are_kinds_of_instance_and_mixes_come_from_the_first_minute(scenario):
    groups = groups_of(scenario)
    assert sorted(a for g in groups for a in g.apps) == list(range(4))
    assert len({(g.shape_name, g.tp) for g in groups}) == len(groups)
    for g in groups:
        mixes = plan_for(scenario, g, SMALL_PLAN).mixes
        assert 3 <= len(mixes) <= 5 and all(m.input_len_mean >= 1 and m.output_len_mean >= 1 for m in mixes)
        # each third draws the first minute's own requests of its apps: every pair was sent by one of them
        early = scenario.trace.arrival_s < 60.0
        sent = {(int(p), int(o)) for a, p, o, e in zip(scenario.trace.app_ids, scenario.trace.input_tokens,
                                                         scenario.trace.output_tokens, early) if e and a in g.apps}
        shorter, *thirds, longer = mixes
        assert all(m.samples and set(m.samples) <= sent for m in thirds)
        # the margin: the shortest third's requests twice as short, the longest's twice as long
        assert (shorter.name, longer.name) == ("shorter", "longer")
        assert shorter.input_len_mean == pytest.approx(thirds[0].input_len_mean / LENGTH_MARGIN, rel=0.05)
        assert longer.output_len_mean == pytest.approx(thirds[-1].output_len_mean * LENGTH_MARGIN, rel=0.05)
        assert len(shorter.samples) == len(thirds[0].samples) and len(longer.samples) == len(thirds[-1].samples)


def test_profiles_are_cached_by_what_they_depend_on(scenario, tmp_path):
    group = groups_of(scenario)[0]
    plan = plan_for(scenario, group, SMALL_PLAN)
    first = profile_group(scenario, group, tmp_path, SMALL_PLAN)
    path = cache_path(scenario, group, plan, tmp_path)
    assert path.exists() and first.model == group.name
    grid_points = len(plan.mixes) * len(plan.replicas) * len(plan.load_bands)
    pilots = [s for s in first.elasticity if s.source == "pilot"]
    assert len(first.meta["points"]) == grid_points == len(first.elasticity) - len(pilots)
    # the knee searches' runs are training data too (m = 1): each spans two lifetimes of its mix's mean request, as
    # a grid point does, so each is long enough for its requests to finish
    settings = HarnessSettings(ttft_slo_ms=first.ttft_slo_ms, tpot_slo_ms=first.tpot_slo_ms)
    for run in first.meta["pilots"]:
        mix = next(m for m in plan.mixes if m.name == run["mix"])
        assert run["duration_s"] == pytest.approx(point_duration_s(mix.output_len_mean, settings,
                                                                   plan.pilot_duration_s), abs=1e-3)
    assert all(is_pilot_long_enough(s.features, 2 * point_duration_s(s.features.output_len_mean, settings,
                                                                        plan.pilot_duration_s), settings)
               for s in pilots)
    assert pilots and len(pilots) == len(first.meta["pilots"])
    assert all(s.num_replicas == 1 for s in pilots)
    assert profile_group(scenario, group, tmp_path, SMALL_PLAN).elasticity == first.elasticity  # from the cache
    other = replace(scenario, effects=DeviceEffects(seed=3, small_batch_penalty=0.5))
    assert cache_path(other, group, plan, tmp_path) != path  # other devices: another profile


def test_the_learned_oracle_answers_from_gps_that_follow_the_load(scenario, tmp_path):
    oracle = learned_oracle(scenario, tmp_path, SMALL_PLAN)
    app = scenario.apps[0].name
    group = next(g for g in groups_of(scenario) if 0 in g.apps)
    ts = profile_group(scenario, group, tmp_path, SMALL_PLAN)
    knee = max(ts.meta["capacities_rps"].values())
    mix = plan_for(scenario, group, SMALL_PLAN).mixes[0]
    from oracle.profile.grid import GridPoint

    light, heavy = GridPoint(0.2 * knee, mix, 1).features, GridPoint(3.0 * knee, mix, 1).features
    reply = oracle.elasticity(ElasticityQuery(items=(ElasticityItem(model=app, features=light, replicas=(1, 4)),
                                                     ElasticityItem(model=app, features=heavy, replicas=(1, 4)))))
    (light_1, light_4), (heavy_1, heavy_4) = (p.attainment_mean for p in reply.predictions)
    assert all(p.source == "gp" for p in reply.predictions)
    assert light_1 > heavy_1 + 0.2  # attainment falls with the load
    assert heavy_4 > heavy_1  # and comes back with replicas
    # its roofline is the datasheet with fitted efficiencies, not the simulated device's cost model
    assert oracle._profiles[app].roofline.efficiency != scenario.cost(0).roofline.efficiency


def test_three_oracles_side_by_side_and_a_clear_error_for_another():
    from sim.runner import EXTRA_SYSTEM_NAMES, _systems, uses_learned_oracle
    from sim.systems.janus import JanusControl

    assert {"janus-learned", "janus-clairvoyant", "janus-roofline"} <= set(EXTRA_SYSTEM_NAMES)
    names = ("janus", "elastic-only", "steady-only", "janus-learned", "janus-clairvoyant", "janus-roofline")
    fixed = {"janus-learned": "learned", "janus-clairvoyant": "clairvoyant", "janus-roofline": "roofline"}
    kinds = {name: _systems()[name]().oracle_kind for name in names}  # `janus sim`: the learned one by default
    assert kinds == {"janus": "learned", "elastic-only": "learned", "steady-only": "learned", **fixed}
    asked = {name: _systems(oracle="clairvoyant")[name]().oracle_kind  # `janus sim --oracle clairvoyant`
             for name in names}
    assert asked == {"janus": "clairvoyant", "elastic-only": "clairvoyant", "steady-only": "clairvoyant", **fixed}
    assert uses_learned_oracle("janus-learned") and uses_learned_oracle("janus")
    assert uses_learned_oracle("janus-learned", "clairvoyant")
    assert not uses_learned_oracle("janus", "clairvoyant") and not uses_learned_oracle("static")
    with pytest.raises(ValueError, match="unknown oracle"):
        JanusControl("both", oracle="psychic")


def _learning_online(monkeypatch):
    """A busy two-minute scenario whose learned oracle profiles SMALL_PLAN and refits after 4 new windows."""
    import sim.oracle_training as training

    trace = servegen_trace(num_apps=4, duration_s=120.0, num_requests=6_000, seed=3)
    busy = build_scenario(trace, num_devices=48, tiers=((1.0, ("qwen2-7b", "qwen2.5-32b")),),
                          effects=DeviceEffects(seed=3))
    profiled_oracle = training.learned_oracle

    def small_learned_oracle(scenario, cache_dir, **kwargs):
        oracle = profiled_oracle(scenario, cache_dir, plan=SMALL_PLAN, **kwargs)
        # two minutes of trace: a refit after 4 new windows of a pool, not the default 16 (windows are learnt one
        # per window length and only once the replica count has held a window before)
        oracle.policy = replace(oracle.policy, refit_min_new_samples=4)
        return oracle

    monkeypatch.setattr(training, "learned_oracle", small_learned_oracle)
    return busy


def test_the_simulated_janus_learns_online_from_token_level_windows(tmp_path, monkeypatch):
    """As the live oracle service does: the dispatchers' windows carry the workers' token-level outcomes, the
    oracle learns them against the serving replicas (the apps of a kind in one pool) and refits when due."""
    from sim.systems.base import SystemRun
    from sim.systems.janus import JanusControl

    busy = _learning_online(monkeypatch)
    control = JanusControl(oracle="learned", oracle_cache_dir=str(tmp_path))
    windows = []
    run = SystemRun(busy, control)
    run.dispatch.load_listeners.insert(0, lambda now_s, window: windows.append(window))
    profiled = {g.name: len(profile_group(busy, g, tmp_path, SMALL_PLAN).elasticity) for g in groups_of(busy)}
    result = run.run()
    scored = [w for w in windows if w.token_attainment is not None]
    assert scored and all(0.0 <= w.token_attainment <= 1.0 and w.num_tokens_due > 0 for w in scored)
    # the windows' token attainment is the run's (weighted by the tokens behind it; the windows overlap)
    measured = sum(w.token_attainment * w.num_tokens_due for w in scored) / sum(w.num_tokens_due for w in scored)
    assert measured == pytest.approx(result.summary.token_attainment, abs=0.05)
    learnt = {g: control.learner.num_samples(g)["elasticity"] - n for g, n in profiled.items()}
    # the 32B kind's busy apps were learnt; the one 7B app never had the 20 requests in a window a label needs
    assert learnt["qwen2.5-32b-tp2"] > 0 and learnt["qwen2-7b-tp1"] == 0, learnt
    busiest = max(w.num_requests for w in windows if w.model == busy.apps[3].name)
    assert busy.apps[3].shape_name == "qwen2-7b" and busiest < control.learner.policy.min_telemetry_requests
    assert control.num_refits >= 1 and result.counters["oracle_refits"] == control.num_refits
    # each new GP served only after its training's wall time on the simulated clock (sim/refitter.py)
    assert result.counters["oracle_refit_wall_s"] > 0 and control.refitter.in_flight is None
    group = next(g for g in groups_of(busy) if g.name == "qwen2.5-32b-tp2")
    version = control.learner.versions(group.name)["elasticity"]
    assert all(control.learner.versions(busy.apps[a].name)["elasticity"] == version for a in group.apps)
    assert any(control.intake.drift.summary(a.name) is not None for a in busy.apps)


def test_with_a_fixed_refit_wall_time_two_runs_of_the_same_learned_janus_are_the_same_run(tmp_path, monkeypatch):
    """`janus sim --refit-wall-s`: each refit serves that long after it starts, not after its measured wall time
    (which follows how busy the machine is), so the same code on the same trace decides the same."""
    from sim.systems.base import SystemRun
    from sim.systems.janus import JanusControl

    busy = _learning_online(monkeypatch)
    runs = []
    for _ in range(2):
        control = JanusControl(oracle="learned", oracle_cache_dir=str(tmp_path), refit_wall_s=1.5)
        result = SystemRun(busy, control).run()
        # what each elastic plan asked per model (ids and decision times differ between any two runs)
        asked = [[(t.model, t.desired_replicas, t.num_prefill, t.num_decode) for t in p.targets]
                 for p in control.plans if isinstance(p, ElasticPlan)]
        runs.append((result.summary, control.num_refits, asked))
    (first, refits, plans), (second, refits_again, plans_again) = runs
    assert refits >= 1 and refits == refits_again
    assert first.token_attainment == second.token_attainment and first.device_hours == second.device_hours
    assert len(plans) > 10 and plans == plans_again


def test_the_yaml_oracle_section_reaches_the_simulated_oracle_as_it_reaches_the_service(tmp_path, monkeypatch):
    """`janus sim --config` with `oracle: {learns_online: false}`: the simulated Janus's learned oracle takes the
    knob the oracle service takes from the same YAML (ops.effective), and learns nothing online."""
    from ops.effective import effective_policies
    from runtime.settings import ClusterConfig
    from sim.runner import _systems
    from sim.systems.base import SystemRun

    busy = _learning_online(monkeypatch)
    policy = effective_policies(ClusterConfig(oracle={"learns_online": False}))
    control = _systems(policy, oracle_cache_dir=str(tmp_path), oracle="learned")["janus"]()
    assert control.oracle_policy.learns_online is False
    profiled = {g.name: len(profile_group(busy, g, tmp_path, SMALL_PLAN).elasticity) for g in groups_of(busy)}
    result = SystemRun(busy, control).run()
    assert control.learner.policy.learns_online is False
    assert {g: control.learner.num_samples(g)["elasticity"] for g in profiled} == profiled  # profiles only
    assert control.num_refits == 0 and result.counters.get("oracle_refits", 0) == 0

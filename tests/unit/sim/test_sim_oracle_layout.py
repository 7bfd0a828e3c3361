"""The simulated Janus's oracle profiles the layout its elastic scaler runs (sim/oracle_training.py): m instances in
all, split into prefill and decode instances by planner.core's own rule from `min_num_disaggregated` on, with the
KV cache handed over the device link (oracle/profile/virtual_clock.py); and the replica counts its telemetry asks for."""
from dataclasses import replace

import pytest

from contracts import SamplingParams
from oracle.profile.grid import GridPoint, LengthMix
from oracle.core.policy import OraclePolicy
from oracle.profile.harness import HarnessSettings
from oracle.profile.virtual_clock import run_virtual
from oracle.specs import device, model_shape
from planner.core import ElasticPolicy
from planner.core.elastic import split_prefill_decode
from sim.costmodel import step_cost
from sim.device_effects import DeviceEffects
from sim.oracle_training import MAX_PROFILED_REPLICAS, SIM_PLAN, cache_path, groups_of, planner_layout, \
    telemetry_replicas
from sim.profile_device import DeviceClock, SimDeviceProfiler, SimulatedEngine, sim_step_probe
from sim.scenario import build_scenario
from sim.servegen import servegen_trace

COST = step_cost(device("nvidia-h200"), model_shape("qwen2-7b"), 1)
SETTINGS = HarnessSettings(duration_s=10.0, drain_s=20.0, ttft_slo_ms=1000.0, tpot_slo_ms=60.0, clock="thread_cpu")
MIX = LengthMix("chat", 1024, 1.0, 128)


def test_the_planners_layout_is_what_a_point_runs():
    layout = planner_layout(ElasticPolicy())
    profiler = SimDeviceProfiler("qwen2-7b", COST, DeviceEffects(), SETTINGS, max_replicas=8, layout=layout)
    for m in (1, 2, 3, 4, 8):
        point = GridPoint(5.0 * m, MIX, m)
        expected = split_prefill_decode(m, point.features, ElasticPolicy())
        assert profiler.layout_of(point) == expected
        capacity, sample, info = profiler.run_point(point, m)
        assert info["num_decode"] == expected[1] and sample.attainment > 0.9
        # needs are a colocated replica's (what the steady planner packs): none from a disaggregated point
        assert len(capacity) == (m if expected[1] == 0 else 0)
    assert ElasticPolicy().min_num_disaggregated == 3 and profiler.layout_of(GridPoint(1.0, MIX, 2)) == (2, 0)
    with pytest.raises(ValueError, match="layout of m=4"):
        SimDeviceProfiler("qwen2-7b", COST, DeviceEffects(), SETTINGS, max_replicas=4,
                          layout=lambda point: (4, 1)).run_point(GridPoint(1.0, MIX, 4), 0)


def test_prefill_engines_prefill_decode_engines_decode_and_the_kv_crosses_the_link():
    clock = DeviceClock()  # one device clock, as SimDeviceProfiler's engines share
    engines = [SimulatedEngine(COST, DeviceEffects.off(), clock, f"e{i}") for i in range(3)]
    from oracle.profile.workload import synth_requests

    workload = synth_requests(GridPoint(20.0, MIX, 3), 5.0, seed=1, max_prompt_len=8192, max_output_len=512)
    transfer_s = 0.25  # a slow link, so its time shows between the first and the second token
    result = run_virtual(engines, workload, 32_000, end_s=200.0, probe=sim_step_probe, timer=clock,
                         num_decode=1, transfer_s=lambda num_tokens: transfer_s)
    prefill, decode = result.replicas[:2], result.replicas[2]
    assert not result.is_truncated and all(prefill[i].steps for i in range(2)) and decode.steps
    assert all(s.num_decode_tokens == 0 for r in prefill for s in r.steps)  # a prefill step carries no decode
    assert all(s.num_prefill_tokens == 0 for s in decode.steps)  # nor a decode step a prefill chunk
    for request in workload:
        times = result.requests[request.request_id].token_times_s
        assert len(times) == request.output_len
        if request.output_len > 1:
            assert times[1] - times[0] >= transfer_s
    with pytest.raises(ValueError, match="decode engines"):
        run_virtual(engines, workload, 32_000, end_s=1.0, probe=sim_step_probe, timer=clock,
                    num_decode=3, transfer_s=lambda n: 0.0)


def test_a_decode_engine_admits_what_fits_in_its_kv_and_skips_what_does_not():
    engine = SimulatedEngine(COST, DeviceEffects.off(), DeviceClock(), "d")
    engine.kv_capacity_tokens = 3_000
    big, small = SamplingParams(max_tokens=2_000), SamplingParams(max_tokens=100)
    engine.add_prefilled_request("a", 500, big)  # 2,500 tokens of KV: fits
    engine.add_prefilled_request("b", 500, big)  # does not fit beside a: waits
    engine.add_prefilled_request("c", 100, small)  # fits beside a: admitted past b
    engine.add_prefilled_request("never", 5_000, small)  # could not fit on an empty engine: dropped
    engine.step()
    assert [s.request_id for s in engine.running] == ["a", "c"] and [s.request_id for s in engine.arrived] == ["b"]
    while engine.has_unfinished():
        engine.step()
    assert engine.kv_used_tokens == 0


def test_busy_kinds_profile_more_replicas_and_the_layout_keys_the_cache(tmp_path, monkeypatch):
    trace = servegen_trace(num_apps=6, duration_s=120.0, num_requests=20_000, seed=3)
    scenario = build_scenario(trace, num_devices=64, tiers=((1.0, ("qwen2-0.5b", "qwen2.5-32b")),),
                              effects=DeviceEffects(seed=3))
    grids = {g.name: telemetry_replicas(scenario, g, ElasticPolicy()) for g in groups_of(scenario)}
    assert all(grid[:4] == SIM_PLAN.replicas and max(grid) <= MAX_PROFILED_REPLICAS for grid in grids.values())
    assert any(max(grid) > 8 for grid in grids.values()) and any(grid == (1, 2, 4, 8) for grid in grids.values())
    # a scaler that never disaggregates needs another profile
    group = groups_of(scenario)[0]
    colocated = ElasticPolicy(min_num_disaggregated=1_000)
    assert cache_path(scenario, group, SIM_PLAN, tmp_path) != cache_path(scenario, group, SIM_PLAN, tmp_path,
                                                                         colocated)
    assert cache_path(scenario, group, SIM_PLAN, tmp_path) == cache_path(scenario, group, SIM_PLAN, tmp_path,
                                                                         ElasticPolicy())
    assert cache_path(scenario, group, replace(SIM_PLAN, replicas=(1, 2)), tmp_path) != \
        cache_path(scenario, group, SIM_PLAN, tmp_path)
    # nor can a split priced by the answers' spread reuse one laid out without it
    priced = ElasticPolicy(is_decode_priced_by_answer_spread=True)
    assert cache_path(scenario, group, SIM_PLAN, tmp_path, priced) != cache_path(scenario, group, SIM_PLAN, tmp_path)
    # nor points counted in the answer in flight; the oracle's `profile_lifetime_answer` sets the plan's
    in_flight = replace(SIM_PLAN, lifetime_answer="in-flight")
    assert cache_path(scenario, group, in_flight, tmp_path) != cache_path(scenario, group, SIM_PLAN, tmp_path)
    import sim.oracle_training as training

    asked = []

    def profiled(scenario, group, cache_dir, plan, **kw):
        asked.append(plan.lifetime_answer)
        raise LookupError("enough: the plan was seen")

    monkeypatch.setattr(training, "profile_group", profiled)
    for answer in ("mean", "in-flight"):
        with pytest.raises(LookupError):
            training.learned_oracle(scenario, tmp_path, policy=OraclePolicy(profile_lifetime_answer=answer))
    assert asked == ["mean", "in-flight"]


@pytest.mark.parametrize("shape, tp", [("qwen2-7b", 1), ("qwen2.5-32b", 2)])
def test_the_profile_measures_the_split_ratio_the_scaler_is_told(shape, tp):
    """The roofline fitted to the profile's calibration steps (no cost-model parameter read) gives the decode-over-
    prefill token cost within 15 % of the simulated device's own, and the profiled layout splits by it: what the
    learned oracle will tell the scaler (docs/oracle.md, "Prefill and decode")."""
    cost = step_cost(device("ascend-910c-die"), model_shape(shape), tp)
    profiler = SimDeviceProfiler(shape, cost, DeviceEffects.off(), SETTINGS, max_replicas=8)
    tpot_ms = 50.0
    mix = LengthMix("long-answers", 260, 0.5, 670)
    point = GridPoint(40.0, mix, 8)
    for policy in (ElasticPolicy(), ElasticPolicy(is_decode_priced_by_answer_spread=True)):
        # the answers' spread (the mix's CV 0.5) is in the price only with the knob, as in the scaler
        priced = point.features if policy.is_decode_priced_by_answer_spread else \
            point.features.model_copy(update={"output_len_var": 0.0})
        measured = profiler.roofline.decode_token_cost_ratio(priced, tpot_ms)
        truth = cost.roofline.decode_token_cost_ratio(priced, tpot_ms)
        assert measured == pytest.approx(truth, rel=0.15)
        layout = planner_layout(policy, profiler.roofline, tpot_ms)
        assert layout(point) == split_prefill_decode(8, point.features, policy, measured)
    assert planner_layout(ElasticPolicy())(point) == split_prefill_decode(8, point.features, ElasticPolicy())


def test_the_oracles_profile_max_replicas_widens_the_simulated_profiles_and_keeps_the_default_cache_names(tmp_path):
    """`oracle.profile_max_replicas` is the grid's cap (docs/bench/sim.md run 51): a kind its first minute sizes past
    16 instances is profiled on to 64 with it at 64, to 32 by default; the default plan's cache name is the one
    profiles had before the knob (the counts it widens to are in the key)."""
    from dataclasses import asdict

    from sim.oracle_training import plan_for, sim_plan

    trace = servegen_trace(num_apps=4, duration_s=120.0, num_requests=60_000, seed=3)
    scenario = build_scenario(trace, num_devices=256, tiers=((1.0, ("qwen2.5-32b",)),), effects=DeviceEffects(seed=3))
    group = groups_of(scenario)[0]
    assert sim_plan().max_replicas == MAX_PROFILED_REPLICAS == 32
    default = plan_for(scenario, group, sim_plan())
    wide = plan_for(scenario, group, sim_plan(OraclePolicy(profile_max_replicas=64)))
    assert max(default.replicas) == 32 and max(wide.replicas) == 64, (default.replicas, wide.replicas)
    assert cache_path(scenario, group, default, tmp_path) != cache_path(scenario, group, wide, tmp_path)
    assert "max_replicas" in asdict(default)
    assert cache_path(scenario, group, default, tmp_path) == cache_path(
        scenario, group, replace(default, max_replicas=128), tmp_path)  # same counts, same profile

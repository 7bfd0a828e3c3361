"""A learned oracle drives the elastic scaler: the real oracle service with a GP fitted on a training set from
`<state_dir>/oracle/<model>.json`, the real elastic scaler service, a real nats-server. The test plays the
dispatchers (load windows at three rates), the workers (heartbeats of idle devices: the budget) and the steady
planner (one plan that hands the model to the elastic pool); nothing stands in for the oracle.

Each published ElasticPlan's target follows the GP: its prediction comes from the GP (`source == "gp"`, the GP's
`gp-elasticity-...-n<points>-...` version, the same the oracle answers with) and m* is the least m whose bound the
oracle, asked directly over the bus with an ElasticityQuery, says meets the target.

The training set is synthetic (oracle/profile/synthetic.py: a roofline's answers with seeded noise): a real profile
(`janus profile --quick`, minutes) is far past this test's budget. The file is written where the oracle service looks
for it (<state_dir>/oracle/<model>.json) and also named in the cluster config's `oracle.training_sets`, so the test
holds whether or not the service reads the state directory by itself (if it loads the same file twice, the GP sees
every point twice: the test reads the version and point count off the oracle, not off the file)."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from contracts import (
    DeviceInfo,
    ElasticityItem,
    ElasticityQuery,
    ElasticityReply,
    ElasticPlan,
    ElasticTarget,
    LoadFeatures,
    ModelLoadWindow,
    PageCounters,
    WorkerHeartbeat,
    subjects,
)
from oracle.training_files import load_training_set, save_training_set
from oracle.profile.grid import GridPoint, LengthMix, load_grid
from oracle.profile.synthetic import roofline_training_set
from oracle.roofline import RooflineModel
from oracle.specs import h200, model_shape
from planner.core import ElasticPolicy
from planner.core.elastic import priced_for_split, split_prefill_decode
from runtime.service import Service, run_service
from runtime.settings import ClusterConfig, JanusSettings

from .cluster import stop_services, wait_for
from .planner_bus_helpers import every_model_elastic, fresh_plans_stream

MODEL = "demo-tiny"
TTFT_SLO_MS, TPOT_SLO_MS = 300.0, 20.0
TARGET = 0.9
K_SIGMA = 1.0
CAP = 16  # the scaler's max_num_replicas; the budget (idle workers) is at least the largest m* below
NUM_WORKERS = 12
CHAT = LengthMix("chat", 400, 0.8, 150)
SHORT = LengthMix("short", 100, 0.3, 300)
PROFILED = RooflineModel(h200(), model_shape("qwen2-7b"))  # the roofline the training set records as fitted
RATES_RPS = (20.0, 100.0, 200.0)  # ascending: a count only grows, so no scale-in rule changes what is asked


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory) -> Path:
    """A state directory holding the model's training set at <state_dir>/oracle/<model>.json."""
    root = tmp_path_factory.mktemp("gp-plans")
    roofline = PROFILED
    grid = load_grid([2, 5, 10, 20, 40, 80, 160], [CHAT, SHORT], [1, 2, 4, 8])
    training_set = roofline_training_set(MODEL, roofline, grid, TTFT_SLO_MS, TPOT_SLO_MS, need_noise_rel=0.05,
                                         attainment_noise=0.01, seed=1)
    path = root / "oracle" / f"{MODEL}.json"
    path.parent.mkdir(parents=True)
    save_training_set(training_set, path)
    return root


def features_at(rate_rps: float) -> LoadFeatures:
    return GridPoint(rate_rps, CHAT, 1).features


def window(rate_rps: float) -> ModelLoadWindow:
    """What a dispatcher would report at this rate (no attainment and no replicas serving it: the oracle has
    nothing to learn from it, so the GP stays the one fitted on the file)."""
    return ModelLoadWindow(model=MODEL, window_s=1.0, end_unix_ms=time.time() * 1000.0, num_requests=int(rate_rps),
                           request_rate_rps=rate_rps, features=features_at(rate_rps), dispatcher_id="gp-plans-test")


def idle_heartbeat(worker_id: str) -> WorkerHeartbeat:
    return WorkerHeartbeat(worker_id=worker_id, seq=1, sent_unix_ms=time.time() * 1000.0,
                           device=DeviceInfo(kind="cpu", name="cpu", hbm_bytes=1 << 30),
                           pages=PageCounters(page_size_bytes=2 << 20, num_pages_total=10, num_pages_free=10,
                                              fragmentation=0.0))


def target_of(plan: ElasticPlan) -> ElasticTarget | None:
    return next((t for t in plan.targets if t.model == MODEL), None)


async def ask_oracle(bus, rate_rps: float) -> ElasticityReply:
    query = ElasticityQuery(items=(ElasticityItem(model=MODEL, features=features_at(rate_rps),
                                                  replicas=tuple(range(1, CAP + 1))),), k_sigma=K_SIGMA)
    return await bus.request(subjects.ORACLE_ELASTICITY, query, ElasticityReply, timeout_s=10.0)


async def test_elastic_plans_follow_the_gp_of_the_oracle_service(nats_url, bus_factory, demo_models_dir, state_dir):
    from oracle.service import OracleService
    from planner.elastic_service import ElasticScalerService

    path = state_dir / "oracle" / f"{MODEL}.json"
    file_points = len(load_training_set(path).elasticity)
    cluster = ClusterConfig.model_validate({
        "models": [{"name": MODEL, "path": str(demo_models_dir / MODEL), "ttft_slo_ms": TTFT_SLO_MS,
                    "tpot_slo_ms": TPOT_SLO_MS}],
        "workers": {"count": NUM_WORKERS, "placement": {}},
        "oracle": {"training_sets": [str(path)]},
        "planner": {
            "elastic": {"period_s": 0.25, "target_attainment": TARGET, "k_sigma": K_SIGMA, "max_num_replicas": CAP,
                        # size for the window's rate as measured, so the plan's question is the test's
                        "load_headroom": 1.0, "scale_in_headroom": 1.0, "backlog_drain_s": 0.0},
            "elastic_republish_s": 0.25,  # every tick's plan goes out
        },
    })

    def settings(instance: str) -> JanusSettings:
        return JanusSettings(nats_url=nats_url, instance=instance, state_dir=state_dir)

    bus = await bus_factory("gp-plans-test")
    await fresh_plans_stream(bus)
    # the steady planner's part: the model goes to the elastic pool, no steady device
    plans = await every_model_elastic(bus, (MODEL,), "gp-plans-steady")

    rate_now: list[float] = []  # the rate the test's dispatcher reports (none yet)

    async def workers_and_load() -> None:
        workers = [f"gp-w{i}" for i in range(NUM_WORKERS)]
        while True:
            for w in workers:
                await bus.publish(subjects.worker_telemetry(w), idle_heartbeat(w))
            if rate_now:
                await bus.publish(subjects.model_telemetry(MODEL), window(rate_now[-1]))
            await asyncio.sleep(0.2)

    services: dict[str, Service] = {"oracle": OracleService(settings("gp-oracle"), cluster)}
    tasks = [asyncio.create_task(run_service(services["oracle"], install_signals=False))]
    background = asyncio.create_task(workers_and_load())
    try:
        # the oracle fits its GP on the file in the background, at start
        oracle = services["oracle"]
        await wait_for(lambda: oracle.oracle.versions(MODEL)["elasticity"].startswith("gp-"), timeout_s=45,
                       what="the oracle's elasticity GP fitted on the training set", tasks=tasks)
        version = oracle.oracle.versions(MODEL)["elasticity"]
        num_points = oracle.oracle.num_samples(MODEL)["elasticity"]
        assert version.startswith("gp-elasticity-") and f"-n{num_points}-" in version, version
        assert num_points % file_points == 0, (num_points, file_points)  # the file's points (once, or twice)

        services["elastic-scaler"] = ElasticScalerService(settings("gp-elastic"), cluster)
        tasks.append(asyncio.create_task(run_service(services["elastic-scaler"], install_signals=False)))

        found: list[int] = []
        disaggregated: list[tuple[tuple[int, int], tuple[int, int]]] = []  # (measured split, the policy's)
        for rate in RATES_RPS:
            # what the oracle says, asked directly: m* = the least m whose bound meets the target
            reply = await ask_oracle(bus, rate)
            answer = reply.predictions[0]
            assert answer.source == "gp" and answer.model_version == version, answer
            bounds = dict(zip(answer.replicas, answer.attainment_bound))
            expected = next((m for m in answer.replicas if bounds[m] >= TARGET), None)
            assert expected is not None, f"{rate} rps: the target is out of reach in 1..{CAP}: {bounds}"

            rate_now.append(rate)
            tps = features_at(rate).token_rate_tps

            def planned_for_this_rate() -> list[ElasticPlan]:
                return [p for p in plans if target_of(p) is not None and target_of(p).prediction is not None
                        and p.loads and p.loads[0].features.token_rate_tps == tps]

            # a plan for this load, and the count settled there (the first instance comes at once, more once two
            # plans agree: the debounce)
            await wait_for(lambda: any(target_of(p).num_prefill + target_of(p).num_decode == expected
                                       for p in planned_for_this_rate()),
                           timeout_s=30, what=f"a plan at {rate} rps with m*={expected} instances", tasks=tasks)
            for plan in planned_for_this_rate():
                target = target_of(plan)
                prediction = target.prediction
                # the plan's prediction is the GP's: its source and version, its bounds the oracle's
                assert prediction.source == "gp", prediction
                assert prediction.model_version == version, (prediction.model_version, version)
                for m, bound in zip(prediction.replicas, prediction.attainment_bound):
                    assert bound == pytest.approx(bounds[m], abs=1e-9), (m, bound, bounds[m])
                # m* = the least m whose bound meets the target
                assert target.desired_replicas == expected, (rate, target.desired_replicas, expected, target.reason)
                assert target.reason.startswith(f"m*={expected}: bound"), target.reason
                assert expected in prediction.replicas and (expected == 1 or expected - 1 in prediction.replicas)
                # the split: by the decode-over-prefill token cost of the profile's fitted roofline, not the policy's
                # the answers' spread the dispatcher saw travels with the load; the split prices it only with
                # is_decode_priced_by_answer_spread (off)
                assert plan.loads[0].features.output_len_var == pytest.approx(features_at(rate).output_len_var)
                assert plan.loads[0].features.output_len_var > 0
                priced = priced_for_split(plan.loads[0].features, ElasticPolicy())
                ratio = PROFILED.decode_token_cost_ratio(priced, TPOT_SLO_MS)
                assert prediction.decode_token_cost_ratio == pytest.approx(ratio, rel=1e-6)
                layout = split_prefill_decode(expected, plan.loads[0].features, ElasticPolicy(), ratio)
                is_settled = target.num_prefill + target.num_decode == expected  # not a debounced count
                if is_settled and expected >= ElasticPolicy().min_num_disaggregated:
                    assert (target.num_prefill, target.num_decode) == layout, (target, ratio)
                    disaggregated.append((layout, split_prefill_decode(expected, plan.loads[0].features,
                                                                       ElasticPolicy())))
            found.append(expected)
        assert disaggregated, "some rate was served by prefill and decode instances"
        assert any(measured != policys for measured, policys in disaggregated), disaggregated  # the ratio mattered
        # the plans followed the load through the GP: more replicas at each higher rate
        assert found == sorted(found) and len(set(found)) == len(found) and found[0] >= 1, found
    finally:
        background.cancel()
        await asyncio.gather(background, return_exceptions=True)
        await stop_services({n: services[n] for n in reversed(list(services))}, tasks)

"""The decode floor live: the real elastic scaler service on a real nats-server reads its decode instances' KV from
the workers' heartbeats and keeps as many decode instances as their sequences in flight fill
(`planner.elastic.decode_kv_fill_target`). The test plays the workers (heartbeats: two of them report a decode
instance of the model, full or calm), the dispatchers (one load window rate) and the steady planner (the model goes
to the elastic pool); a table oracle answers on the oracle subjects (the scaler is what is tested). A real worker
reports its KV blocks in its heartbeat in tests/bus/test_lifecycle_two_workers.py."""
from __future__ import annotations

import asyncio
import time

from contracts import (
    DeviceInfo,
    ElasticPlan,
    InstanceRole,
    InstanceStatus,
    LoadFeatures,
    ModelLoadWindow,
    ModelState,
    PageCounters,
    Pool,
    WorkerHeartbeat,
    subjects,
)
from runtime.service import Service, run_service
from runtime.settings import ClusterConfig, JanusSettings
from tests.unit.planner.planner_test_oracles import TableOracle

from .cluster import stop_services, wait_for
from .planner_bus_helpers import every_model_elastic, fresh_plans_stream, serve_oracle

MODEL = "demo-tiny"
NUM_WORKERS = 12
# 4,000 tokens/s on 512-token prompts and 128-token answers: the table oracle (1,000 tokens/s a replica) sizes 8
# instances for it, split 5 prefill / 3 decode at the policy's decode-over-prefill ratio of 2.
FEATURES = LoadFeatures(token_rate_tps=4000.0, input_len_mean=512.0, input_len_var=0.0, output_len_mean=128.0)
SPLIT = (5, 3)
FILL = 0.9


def decode_status(worker_id: str, used: int, free: int, running: int, waiting: int) -> InstanceStatus:
    return InstanceStatus(instance_id=f"{MODEL}@{worker_id}/decode", model=MODEL, role=InstanceRole.DECODE,
                          pool=Pool.ELASTIC, state=ModelState.ACTIVE, num_kv_blocks_used=used,
                          num_kv_blocks_free=free, num_running=running, num_waiting=waiting)


def heartbeat(worker_id: str, instances: tuple[InstanceStatus, ...]) -> WorkerHeartbeat:
    return WorkerHeartbeat(worker_id=worker_id, seq=1, sent_unix_ms=time.time() * 1000.0,
                           device=DeviceInfo(kind="cpu", name="cpu", hbm_bytes=1 << 30),
                           pages=PageCounters(page_size_bytes=2 << 20, num_pages_total=10, num_pages_free=10,
                                              fragmentation=0.0), instances=instances)


def window() -> ModelLoadWindow:
    return ModelLoadWindow(model=MODEL, window_s=1.0, end_unix_ms=time.time() * 1000.0, num_requests=6,
                           request_rate_rps=FEATURES.token_rate_tps / 640.0, features=FEATURES,
                           dispatcher_id="decode-floor-test")


def split_of(plan: ElasticPlan) -> tuple[int, int] | None:
    target = next((t for t in plan.targets if t.model == MODEL), None)
    return (target.num_prefill, target.num_decode) if target is not None else None


async def test_the_scaler_keeps_the_decode_instances_the_heartbeats_kv_fills(nats_url, bus_factory, demo_models_dir,
                                                                               tmp_path):
    from planner.elastic_service import ElasticScalerService

    cluster = ClusterConfig.model_validate({
        "models": [{"name": MODEL, "path": str(demo_models_dir / MODEL)}],
        "workers": {"count": NUM_WORKERS, "placement": {}},
        "planner": {
            "elastic": {"period_s": 0.2, "load_headroom": 1.0, "scale_in_headroom": 1.0, "backlog_drain_s": 0.0,
                        "decode_kv_fill_target": FILL},
            "elastic_republish_s": 0.2,  # every tick's plan goes out
        },
    })
    bus = await bus_factory("decode-floor-test")
    await fresh_plans_stream(bus)
    await serve_oracle(bus, TableOracle())
    plans = await every_model_elastic(bus, (MODEL,), "decode-floor-steady")

    # Two decode instances of 100 blocks: 38 sequences hold 190, 40 wait. 190 + 40 x 5 = 390 blocks, over 90 a
    # decode instance at 0.9: a floor of 5.
    full = (decode_status("df-w0", 95, 5, 19, 20), decode_status("df-w1", 95, 5, 19, 20))
    calm = (decode_status("df-w0", 30, 70, 6, 0), decode_status("df-w1", 30, 70, 6, 0))
    reported: list[tuple[InstanceStatus, ...]] = [full]

    async def workers_and_load() -> None:
        while True:
            for i in range(NUM_WORKERS):
                w = f"df-w{i}"
                mine = tuple(s for s in reported[-1] if s.instance_id.endswith(f"@{w}/decode"))
                await bus.publish(subjects.worker_telemetry(w), heartbeat(w, mine))
            await bus.publish(subjects.model_telemetry(MODEL), window())
            await asyncio.sleep(0.2)

    settings = JanusSettings(nats_url=nats_url, instance="decode-floor-elastic", state_dir=tmp_path)
    services: dict[str, Service] = {"elastic-scaler": ElasticScalerService(settings, cluster)}
    background = asyncio.create_task(workers_and_load())
    tasks = [asyncio.create_task(run_service(services["elastic-scaler"], install_signals=False))]
    try:
        await wait_for(lambda: any(split_of(p) == (5, 5) for p in plans), timeout_s=30,
                       what="a plan with the 5 decode instances the reported KV fills", tasks=tasks)
        floored = next(p for p in plans if split_of(p) == (5, 5))
        (target,) = [t for t in floored.targets if t.model == MODEL]
        assert "its sequences in flight fill 5 decode instances to 0.9 of their KV" in target.reason, target.reason
        assert target.desired_replicas == 10, target.reason
        assert SPLIT not in [split_of(p) for p in plans], "while the decode KV is full, never the bare split"

        seen = len(plans)
        reported.append(calm)  # the sequences end: 60 blocks of 200, no floor past the split
        await wait_for(lambda: any(split_of(p) == SPLIT for p in plans[seen:]), timeout_s=30,
                       what="the oracle's split again once the decode KV is calm", tasks=tasks)
    finally:
        background.cancel()
        await asyncio.gather(background, return_exceptions=True)
        await stop_services(services, tasks)

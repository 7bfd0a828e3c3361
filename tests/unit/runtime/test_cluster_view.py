from __future__ import annotations

from contracts import (
    BinAssignment,
    DeviceInfo,
    InstanceRecord,
    InstanceRole,
    InstanceStatus,
    LoadFeatures,
    ModelLoadWindow,
    ModelState,
    NeedVector,
    PageCounters,
    Pool,
    SteadyPlan,
    WorkerHeartbeat,
)
from runtime.cluster_view import build_snapshot


def test_snapshot_joins_registry_heartbeats_loads_and_plans():
    rec = [InstanceRecord(instance_id="w0/a", model="a", worker_id="w0", role=InstanceRole.COLOCATED,
                          pool=Pool.STEADY, state=ModelState.ACTIVE, is_ready=True, updated_unix_ms=0),
           InstanceRecord(instance_id="w1/a", model="a", worker_id="w1", role=InstanceRole.PREFILL,
                          pool=Pool.ELASTIC, state=ModelState.WAKING, is_ready=False, updated_unix_ms=0)]
    hb = [WorkerHeartbeat(worker_id="w0", seq=3, sent_unix_ms=9_000, device=DeviceInfo(kind="cpu", name="x",
                                                                                       hbm_bytes=1 << 30),
                          pages=PageCounters(page_size_bytes=2 << 20, num_pages_total=512, num_pages_free=400,
                                             fragmentation=0.01, pages_by_model={"a": {"weights": 100, "kv": 12}}),
                          instances=(InstanceStatus(instance_id="w0/a", model="a", role=InstanceRole.COLOCATED,
                                                    pool=Pool.STEADY, state=ModelState.ACTIVE, num_waiting=2,
                                                    num_running=5),))]
    load = [ModelLoadWindow(model="a", window_s=2, end_unix_ms=9_000, num_requests=10, request_rate_rps=5,
                            features=LoadFeatures(token_rate_tps=100, input_len_mean=10, input_len_var=1,
                                                  output_len_mean=10), ttft_attainment=0.9, queue_depth=3)]
    plan = [SteadyPlan(plan_id="p1", created_unix_ms=8_000, trigger="periodic", steady_models=("a",),
                       elastic_models=(), bins=(BinAssignment(worker_id="w0", models=("a",),
                                                              used=NeedVector(hbm=0.2, compute=0.1, bandwidth=0.1)),))]
    snap = build_snapshot(rec, hb, load, plan, [], now_unix_ms=10_000)
    assert snap["devices"][0]["pages_free"] == 400 and snap["devices"][0]["age_s"] == 1.0
    by_id = {i["instance_id"]: i for i in snap["instances"]}
    assert by_id["w0/a"]["num_running"] == 5 and by_id["w0/a"]["is_ready"]
    assert by_id["w1/a"]["state"] == "waking" and not by_id["w1/a"]["is_ready"]
    model = snap["models"][0]
    assert model["replicas"] == {"steady": 1, "elastic": 1} and model["ready"] == 1
    assert model["queue_depth"] == 3 and model["ttft_attainment"] == 0.9
    assert snap["plans"][0]["bins"] == {"w0": ["a"]}

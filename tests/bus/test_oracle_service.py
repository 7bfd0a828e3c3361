"""The oracle service over a real nats-server: batched replies, typed errors, learning from telemetry windows."""

import pytest

from contracts import (CapacityItem, CapacityQuery, CapacityReply, DeviceInfo, ElasticityItem, ElasticityQuery,
                       ElasticityReply, ErrorCode, InstanceRole, InstanceStatus, LoadFeatures, ModelLoadWindow,
                       ModelState, PageCounters, Pool, WorkerHeartbeat, subjects)
from oracle.service import OracleService
from runtime.bus import BusError
from runtime.settings import ClusterConfig, JanusSettings, ModelSpec
from tests.polling import wait_for

FEATURES = LoadFeatures(token_rate_tps=500.0, input_len_mean=128.0, input_len_var=4096.0, output_len_mean=32.0)


def heartbeat(worker_id, model, num_active, extra=()):
    return WorkerHeartbeat(
        worker_id=worker_id, seq=1, sent_unix_ms=0.0, device=DeviceInfo(kind="cpu", name="cpu", hbm_bytes=1 << 30),
        pages=PageCounters(page_size_bytes=2 << 20, num_pages_total=10, num_pages_free=10, fragmentation=0.0),
        instances=tuple(InstanceStatus(instance_id=f"{worker_id}-{i}", model=model, role=InstanceRole.COLOCATED,
                                       pool=Pool.ELASTIC, state=ModelState.ACTIVE) for i in range(num_active)) + extra)


def instance(instance_id, model, role, state=ModelState.ACTIVE):
    return InstanceStatus(instance_id=instance_id, model=model, role=role, pool=Pool.ELASTIC, state=state)


@pytest.fixture
async def service(bus_factory, demo_models_dir, nats_url):
    settings = JanusSettings(nats_url=nats_url, instance="oracle-test", state_dir=demo_models_dir.parent)
    cluster = ClusterConfig(models=[ModelSpec(name="tiny", path=demo_models_dir / "demo-tiny", ttft_slo_ms=500,
                                              tpot_slo_ms=50)],
                            oracle={"refit_min_new_samples": 3, "refit_min_interval_s": 0.0, "num_train_iters": 10})
    svc = OracleService(settings, cluster)
    await svc.start(await bus_factory("oracle"))
    yield svc
    await svc.stop()


async def test_batched_queries_get_roofline_answers_with_versions(service, bus_factory):
    client = await bus_factory("planner")
    query = CapacityQuery(items=(CapacityItem(model="tiny", features=FEATURES),
                                 CapacityItem(model="tiny", features=FEATURES.model_copy(
                                     update={"token_rate_tps": 5000.0}))))
    reply = await client.request(subjects.ORACLE_CAPACITY, query, CapacityReply)
    assert [p.source for p in reply.predictions] == ["roofline", "roofline"]
    assert reply.predictions[0].mean.compute < reply.predictions[1].mean.compute
    assert reply.predictions[0].model_version.startswith("roofline-cpu-calibrated-tiny")
    ela = await client.request(subjects.ORACLE_ELASTICITY, ElasticityQuery(
        items=(ElasticityItem(model="tiny", features=FEATURES, replicas=(1, 2, 8)),)), ElasticityReply)
    bound = ela.predictions[0].attainment_bound
    assert list(bound) == sorted(bound)


async def test_unknown_models_get_a_typed_error(service, bus_factory):
    client = await bus_factory("planner")
    with pytest.raises(BusError) as err:
        await client.request(subjects.ORACLE_CAPACITY,
                             CapacityQuery(items=(CapacityItem(model="ghost", features=FEATURES),)), CapacityReply)
    assert err.value.error.code == ErrorCode.UNKNOWN_MODEL


async def test_windows_are_learnt_with_the_replica_count_from_heartbeats(service, bus_factory):
    publisher = await bus_factory("dispatcher")
    await publisher.publish(subjects.worker_telemetry("w1"), heartbeat("w1", "tiny", 2))
    await publisher.publish(subjects.worker_telemetry("w2"), heartbeat("w2", "tiny", 1))
    # a prefill and a decode instance count (the scaler's m is both, as the profiles ran it); a tensor-parallel
    # decode instance in two devices' beats counts once; one still loading does not count
    await publisher.publish(subjects.worker_telemetry("w3"), heartbeat("w3", "tiny", 0, (
        instance("p0", "tiny", InstanceRole.PREFILL), instance("d0", "tiny", InstanceRole.DECODE),
        instance("loading", "tiny", InstanceRole.PREFILL, ModelState.LOADING))))
    await publisher.publish(subjects.worker_telemetry("w4"), heartbeat("w4", "tiny", 0, (
        instance("d0", "tiny", InstanceRole.DECODE),)))
    await wait_for(lambda: service.num_replicas("tiny") == 5, timeout_s=10, interval_s=0.02,
                   what="the replica count from four heartbeats")
    def tiny_window(end_ms: float, i: int) -> ModelLoadWindow:
        return ModelLoadWindow(model="tiny", window_s=10.0, end_unix_ms=end_ms, num_requests=20, request_rate_rps=2.0,
                               features=FEATURES.model_copy(update={"token_rate_tps": 300.0 * (i + 1)}),
                               ttft_attainment=1.0 - 0.2 * i)

    # a window that began less than a window length after the count last changed straddles the change: not learnt;
    # windows that begin a window length after it are, each a window length after the last
    counted_ms = service.replica_counts.since_ms("tiny")
    await publisher.publish(subjects.model_telemetry("tiny"), tiny_window(counted_ms + 15_000.0, 4))
    for i in range(4):
        await publisher.publish(subjects.model_telemetry("tiny"), tiny_window(counted_ms + 20_000.0 + 10_000.0 * i, i))
    await wait_for(lambda: service.num_windows_learnt >= 4, timeout_s=10, interval_s=0.02, what="four windows learnt")
    assert service.num_replicas("tiny") == 5
    assert service.num_windows_learnt == 4
    samples = service.oracle._elasticity_samples["tiny"]
    assert {s.num_replicas for s in samples} == {5}
    assert [s.features.token_rate_tps for s in samples] == [300.0, 600.0, 900.0, 1200.0]
    # the refitter was woken: the elasticity model is refitted in the background
    await wait_for(lambda: service.oracle.versions("tiny")["elasticity"].startswith("gp-"), timeout_s=30,
                   what="the elasticity model refitted as a GP")
    assert service.health().detail["tiny.elasticity"].startswith("gp-")


async def test_windows_of_two_dispatchers_are_learnt_as_the_models_whole_load(service, bus_factory):
    """Two dispatchers share a model's requests (a queue group): the service learns their merged window, the
    model's whole load against its replicas, not each dispatcher's half (oracle/core/intake.py)."""
    publisher = await bus_factory("dispatchers")
    await publisher.publish(subjects.worker_telemetry("w1"), heartbeat("w1", "tiny", 2))
    await wait_for(lambda: service.num_replicas("tiny") == 2, timeout_s=10, interval_s=0.02,
                   what="the replica count from a heartbeat")
    counted_ms = service.replica_counts.since_ms("tiny")

    def half(dispatcher: str, end_ms: float, attainment: float) -> ModelLoadWindow:
        return ModelLoadWindow(model="tiny", window_s=10.0, end_unix_ms=end_ms, num_requests=15, request_rate_rps=1.5,
                               features=FEATURES.model_copy(update={"token_rate_tps": 400.0}),
                               ttft_attainment=attainment, dispatcher_id=dispatcher)

    await publisher.publish(subjects.model_telemetry("tiny"), half("d1", counted_ms + 30_000.0, 1.0))
    await publisher.publish(subjects.model_telemetry("tiny"), half("d2", counted_ms + 30_300.0, 0.8))
    await wait_for(lambda: service.num_windows_learnt >= 1, timeout_s=10, interval_s=0.02, what="a window learnt")
    (sample,) = service.oracle._elasticity_samples["tiny"]  # one dispatcher's 15 requests are too few alone
    assert sample.features.token_rate_tps == 800.0 and sample.num_replicas == 2 and sample.num_requests == 30
    assert sample.attainment == pytest.approx(0.9)

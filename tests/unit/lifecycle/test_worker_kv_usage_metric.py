"""janus_worker_kv_cache_usage_ratio: per model, the KV blocks its engines on this worker use over those they may
hold, set with the other per-model gauges at each heartbeat, gone with the model; and each engine's stats are read
once per heartbeat (stats() takes the engine's lock)."""
from __future__ import annotations

from types import SimpleNamespace

from contracts import InstanceStatus, PageCounters
from runtime.metrics import REGISTRY
from worker.shell.heartbeat import build_heartbeat, read_stats
from worker.shell.metrics import kv_usage_by_model, observe_heartbeat

WORKER = "w-kv-usage"


def _status(model: str, used: int, free: int, instance_id: str = "i") -> InstanceStatus:
    return InstanceStatus(instance_id=instance_id, model=model, role="colocated", pool="steady", state="active",
                          num_kv_blocks_used=used, num_kv_blocks_free=free)


def _heartbeat(*statuses: InstanceStatus) -> SimpleNamespace:
    pages = PageCounters(page_size_bytes=1, num_pages_total=10, num_pages_free=10, fragmentation=0.0)
    return SimpleNamespace(worker_id=WORKER, pages=pages, instances=statuses)


def _usage(model: str) -> float | None:
    return REGISTRY.get_sample_value("janus_worker_kv_cache_usage_ratio", {"worker": WORKER, "model": model})


def test_usage_sums_a_models_instances_and_skips_those_without_blocks():
    usage = kv_usage_by_model([_status("a", 30, 70, "a0"), _status("a", 10, 90, "a1"), _status("b", 0, 0)])
    assert usage == {"a": 0.2}  # b's instance has no engine (parked): no blocks, no ratio


def test_the_gauge_follows_heartbeats_and_leaves_with_the_model():
    observe_heartbeat(_heartbeat(_status("a", 25, 75), _status("b", 0, 64, "b0")))
    assert _usage("a") == 0.25
    assert _usage("b") == 0.0  # idle, but serving: 0, not absent
    observe_heartbeat(_heartbeat(_status("b", 64, 0, "b0")))
    assert _usage("a") is None  # a left the device: it leaves the scrape too
    assert _usage("b") == 1.0


class _Engine:
    def __init__(self) -> None:
        self.num_reads = 0

    def stats(self) -> SimpleNamespace:
        self.num_reads += 1
        return SimpleNamespace(num_kv_blocks_used=1, num_kv_blocks_free=3)


def test_read_stats_reads_each_engine_once_and_skips_instances_without_one():
    engines = [_Engine(), _Engine()]
    instances = {"i0": SimpleNamespace(engine=engines[0]), "i1": SimpleNamespace(engine=engines[1]),
                 "parked": SimpleNamespace(engine=None)}
    stats = read_stats(instances)
    assert set(stats) == {"i0", "i1"}
    assert [e.num_reads for e in engines] == [1, 1]


def test_build_heartbeat_uses_the_stats_it_is_given_without_reading_again():
    engine = _Engine()
    inst = SimpleNamespace(instance_id="i0", model="a", role="colocated", pool_kind="steady", state="active",
                           segments=(), engine=engine)
    counters = PageCounters(page_size_bytes=1, num_pages_total=4, num_pages_free=4, fragmentation=0.0)
    pages = SimpleNamespace(device="cpu", num_pages=4, page_size_bytes=1, counters=lambda: counters)
    stats = read_stats({"i0": inst})
    hb = build_heartbeat(WORKER, 1, 0.0, pages, {"i0": inst}, "", False, None, stats)
    assert engine.num_reads == 1  # the caller's read only: the prefix cache series use the same stats
    assert (hb.instances[0].num_kv_blocks_used, hb.instances[0].num_kv_blocks_free) == (1, 3)
    build_heartbeat(WORKER, 2, 0.0, pages, {"i0": inst}, "", False)
    assert engine.num_reads == 2  # read here when not given

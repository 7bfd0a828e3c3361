"""A remote warm pull over real parts: a WARM instance's pinned host copy, registered with its worker's Mooncake
transfer engine and offered in the heartbeat, is what another worker pulls the model from, instead of its disk. The
planner's cluster view picks the offer from the real heartbeat (planner/core/cluster_view.py)."""
from __future__ import annotations

import time

import torch

from contracts import LifecycleAction, ModelState
from lifecycle_fixtures import greedy_tokens
from planner.core.cluster_view import ClusterView
from worker.shell.heartbeat import build_heartbeat
from worker.lifecycle.host_offers import HostCopyOffers

A = LifecycleAction
S = ModelState


def _heartbeat(worker):
    instances = worker.controller.instances
    return build_heartbeat(worker.worker_id, 1, time.time() * 1e3, worker.pages, instances,
                           worker.transfer.session, False, worker.controller.host_offers.offered())


def _source_from_heartbeat(worker, target_worker: str):
    """What the reconciler would send: the source its cluster view picks from the worker's real heartbeat."""
    view = ClusterView(heartbeat_timeout_ms=60_000)
    hb = _heartbeat(worker)
    view.on_heartbeat(hb.sent_unix_ms, hb)
    return view.fork_source("demo-tiny", view.alive_workers(hb.sent_unix_ms), set(), target_worker=target_worker)


async def test_a_warm_copy_on_another_worker_is_pulled_instead_of_read_from_disk(make_worker,
                                                                                tiny_dir_without_checkpoint):
    src = make_worker("src")
    dst = make_worker("dst", model_dir=tiny_dir_without_checkpoint)  # any read of the checkpoint would fail
    await src.run("a", A.ACTIVATE)
    engine = src.controller.instances["a"].engine
    weights, expected_tokens = engine.weight_buffer.clone(), greedy_tokens(engine)
    assert _source_from_heartbeat(src, "dst") is None  # nothing warm offered while active (and no registry here)

    reply = await src.run("a", A.WARM)
    assert reply.ok and reply.state == S.WARM and "host copy offered" in reply.detail
    status = next(s for s in _heartbeat(src).instances if s.instance_id == "a")
    assert status.state == S.WARM and status.weight_segments == ()
    offer = status.host_copy
    assert sum(s.num_bytes for s in offer.segments) == weights.numel() and all(s.checksum for s in offer.segments)
    source = _source_from_heartbeat(src, "dst")
    assert source.kind == "host_copy" and source.base_offset_bytes == offer.base_offset_bytes
    assert _source_from_heartbeat(src, "src") is None  # the warm worker itself wakes its own copy

    reply = await dst.run("b", A.FORK_FROM, fork_source=source)
    assert reply.ok and reply.state == S.ACTIVE, reply
    assert "fork failed" not in reply.detail and "from the host copy of a" in reply.detail
    assert [(e.to_state, e.via) for e in dst.host.events] == [
        (S.FORKING, "remote_warm"), (S.VERIFYING, "remote_warm"), (S.ACTIVE, "remote_warm")]
    target = dst.controller.instances["b"].engine
    assert torch.equal(target.weight_buffer, weights)
    assert greedy_tokens(target) == expected_tokens
    assert dst.transfer.stats().num_bytes == weights.numel()
    # the source stayed warm, its copy intact: it still wakes to the same weights
    assert src.controller.instances["a"].state == S.WARM
    reply = await src.run("a", A.ACTIVATE)
    assert reply.ok and [e.via for e in src.host.events[-3:]] == ["warm_copy"] * 3
    assert torch.equal(engine.weight_buffer, weights)


async def test_a_released_copy_is_withdrawn_and_a_late_pull_falls_back_to_the_disk(make_worker):
    src, dst = make_worker("src"), make_worker("dst")
    clock = [0.0]
    offers = src.controller.host_offers = HostCopyOffers(src.transfer, clock=lambda: clock[0])
    await src.run("a", A.ACTIVATE)
    await src.run("a", A.WARM)
    source = _source_from_heartbeat(src, "dst")
    assert source is not None and len(offers.offered()) == 1

    reply = await src.run("a", A.COLD)
    assert reply.ok and reply.state == S.COLD
    assert offers.offered() == {} and _source_from_heartbeat(src, "dst") is None
    # the instance let go of its copy; the offers keep its memory a while, for a read already under way
    assert src.controller.instances.get("a") is None and offers.num_retired == 1
    clock[0] += 30.0
    assert offers.offered() == {} and offers.num_retired == 1
    clock[0] += 31.0
    assert offers.offered() == {} and offers.num_retired == 0

    # a pull with the stale source (sent before the release) reads nothing freed: it fails and loads from disk
    reply = await dst.run("b", A.FORK_FROM, fork_source=source)
    assert reply.ok and reply.state == S.ACTIVE, reply
    assert "fork failed: pull from" in reply.detail and dst.host.events[-1].via == "cold_load"


async def test_a_warm_target_wakes_its_own_copy_rather_than_pull_a_peer_one(make_worker):
    src, dst = make_worker("src"), make_worker("dst")
    for worker in (src, dst):
        await worker.run("i", A.ACTIVATE)
        await worker.run("i", A.WARM)
    source = _source_from_heartbeat(src, "dst")
    reply = await dst.run("i", A.FORK_FROM, fork_source=source)
    assert reply.ok and reply.state == S.ACTIVE, reply
    assert [e.via for e in dst.host.events[-3:]] == ["warm_copy"] * 3 and dst.transfer.stats().num_bytes == 0

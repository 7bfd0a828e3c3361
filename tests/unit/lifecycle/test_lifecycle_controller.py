"""The lifecycle controller over real parts: CPU page pools, engines on the tiny demo model, Mooncake over TCP
loopback. Each test checks where the bytes are (pool counters, the weight buffer) and what the engine computes."""
from __future__ import annotations

import torch

from contracts import ForkSource, LifecycleAction, ModelState
from lifecycle_fixtures import greedy_tokens
from worker.engine.engine import EngineConfig, LLMEngine
from worker.lifecycle.commands import CommandBook

A = LifecycleAction
S = ModelState


def _weight_pages(worker, instance_id: str) -> int:
    return worker.pages.counters().pages_by_model.get(instance_id, {}).get("weights", 0)


async def test_cold_load_verifies_and_marks_ready_last(make_worker):
    w = make_worker()
    reply = await w.run("i", A.ACTIVATE)
    assert reply.ok and reply.state == S.ACTIVE, reply
    assert [e.to_state for e in w.host.events] == [S.LOADING, S.VERIFYING, S.ACTIVE]
    assert [e.via for e in w.host.events] == ["cold_load"] * 3
    assert "load_ms" in reply.timings_ms and reply.timings_ms["canary_ms"] > 0
    # the engine joins the loop before the record that says ready, never after
    assert w.host.calls[-2:] == [("serve", "i"), ("record", "active:True")]
    inst = w.controller.instances["i"]
    assert sum(s.num_bytes for s in inst.segments) == inst.engine.weight_buffer.numel()
    assert all(s.checksum for s in inst.segments) and _weight_pages(w, "i") > 0


async def test_warm_releases_device_pages_and_wake_restores_identical_weights(make_worker):
    w = make_worker()
    await w.run("i", A.ACTIVATE)
    engine = w.controller.instances["i"].engine
    expected_tokens = greedy_tokens(engine)
    weights = engine.weight_buffer.clone()
    free_active = w.pages.counters().num_pages_free

    reply = await w.run("i", A.WARM)
    assert reply.ok and reply.state == S.WARM
    assert [e.to_state for e in w.host.events[-2:]] == [S.DRAINING, S.WARM]
    # leaving active: the record says not ready before the drain starts, the engine is parked before release
    calls = w.host.calls[-4:]
    assert calls[0] == ("record", "draining:False") and calls[1] == ("drain", "i") and calls[2] == ("park", "i")
    assert _weight_pages(w, "i") == 0 and w.pages.counters().num_pages_free > free_active
    assert w.pages.is_asleep("i")

    reply = await w.run("i", A.ACTIVATE)
    assert reply.ok and reply.state == S.ACTIVE, reply
    assert [e.via for e in w.host.events[-3:]] == ["warm_copy"] * 3
    assert reply.timings_ms["copy_ms"] >= 0 and reply.timings_ms["checksum_ms"] > 0
    assert torch.equal(engine.weight_buffer, weights)
    assert greedy_tokens(engine) == expected_tokens
    assert w.num_builds == 1  # the engine (tokenizer, metadata, views) survived Warm


async def test_fork_over_mooncake_gives_bit_identical_weights_and_the_same_greedy_output(make_worker):
    src, dst = make_worker("src"), make_worker("dst")
    await src.run("a", A.ACTIVATE)
    source_inst = src.controller.instances["a"]
    expected_tokens = greedy_tokens(source_inst.engine)
    fork = ForkSource(worker_id="src", instance_id="a", transfer_session=src.transfer.session,
                      segments=source_inst.segments)

    reply = await dst.run("b", A.FORK_FROM, fork_source=fork)
    assert reply.ok and reply.state == S.ACTIVE, reply
    assert [e.to_state for e in dst.host.events] == [S.FORKING, S.VERIFYING, S.ACTIVE]
    assert "pull_ms" in reply.timings_ms and "pulled" in reply.detail
    target = dst.controller.instances["b"].engine
    assert torch.equal(target.weight_buffer, source_inst.engine.weight_buffer)
    assert greedy_tokens(target) == expected_tokens
    assert src.transfer.stats().num_bytes == 0 and dst.transfer.stats().num_bytes == target.weight_buffer.numel()


async def test_a_fork_onto_a_cold_target_reads_no_checkpoint(make_worker, tiny_dir_without_checkpoint):
    src = make_worker("src")
    dst = make_worker("dst", model_dir=tiny_dir_without_checkpoint)  # any read of the checkpoint would fail
    await src.run("a", A.ACTIVATE)
    source = src.controller.instances["a"]
    fork = ForkSource(worker_id="src", instance_id="a", transfer_session=src.transfer.session,
                      segments=source.segments)
    reply = await dst.run("b", A.FORK_FROM, fork_source=fork)
    assert reply.ok and reply.state == S.ACTIVE, reply
    assert "fork failed" not in reply.detail and {"build_ms", "pull_ms", "checksum_ms"} <= set(reply.timings_ms)
    target = dst.controller.instances["b"].engine
    assert torch.equal(target.weight_buffer, source.engine.weight_buffer)
    assert target.reference_canary.matches(source.engine.reference_canary)  # recorded once the checksums held
    assert greedy_tokens(target) == greedy_tokens(source.engine)
    # without a checkpoint and with a source that lies, nothing can verify: the target says so and stays down
    lying = tuple(s.model_copy(update={"checksum": "w64:" + "0" * 32}) for s in source.segments)
    bad = ForkSource(worker_id="src", instance_id="a", transfer_session=src.transfer.session, segments=lying)
    reply = await dst.run("c", A.FORK_FROM, fork_source=bad)
    assert not reply.ok and "checksum mismatch" in reply.detail and "c" not in dst.controller.instances


async def test_a_fork_that_fails_verification_falls_back_to_a_cold_load_and_says_why(make_worker):
    src, dst = make_worker("src"), make_worker("dst")
    await src.run("a", A.ACTIVATE)
    segments = src.controller.instances["a"].segments
    lying = tuple(s.model_copy(update={"checksum": "w64:" + "0" * 32}) for s in segments)
    fork = ForkSource(worker_id="src", instance_id="a", transfer_session=src.transfer.session, segments=lying)

    reply = await dst.run("b", A.FORK_FROM, fork_source=fork)
    assert reply.ok and reply.state == S.ACTIVE
    assert "fork failed: checksum mismatch" in reply.detail
    states = [(e.from_state, e.to_state) for e in dst.host.events]
    assert (S.VERIFYING, S.LOADING) in states and states[-1] == (S.VERIFYING, S.ACTIVE)
    fallback = next(e for e in dst.host.events if e.to_state == S.LOADING)
    assert "checksum mismatch" in fallback.reason and fallback.via == "cold_load"


async def test_a_fork_from_an_unreachable_source_falls_back_to_the_warm_copy(make_worker):
    w = make_worker()
    await w.run("i", A.ACTIVATE)
    weights = w.controller.instances["i"].engine.weight_buffer.clone()
    segments = w.controller.instances["i"].segments
    await w.run("i", A.WARM)
    fork = ForkSource(worker_id="gone", instance_id="x", transfer_session="127.0.0.1:1", segments=segments)
    reply = await w.run("i", A.FORK_FROM, fork_source=fork)
    assert reply.ok and reply.state == S.ACTIVE
    assert "fork failed" in reply.detail and "host -> device" in reply.detail
    assert [e.to_state for e in w.host.events[-3:]] == [S.WAKING, S.VERIFYING, S.ACTIVE]
    assert torch.equal(w.controller.instances["i"].engine.weight_buffer, weights)


async def test_a_corrupted_host_copy_is_caught_and_reloaded_from_disk(make_worker):
    w = make_worker()
    await w.run("i", A.ACTIVATE)
    await w.run("i", A.WARM)
    inst = w.controller.instances["i"]
    weights = inst.host.buffer.clone()
    inst.host.buffer[1000:1010] ^= 0xFF
    reply = await w.run("i", A.ACTIVATE)
    assert reply.ok and "wake failed: checksum mismatch" in reply.detail
    assert torch.equal(inst.engine.weight_buffer, weights)


async def test_cold_releases_everything_and_warm_from_cold_loads_into_host_memory(make_worker):
    w = make_worker()
    await w.run("i", A.ACTIVATE)
    reply = await w.run("i", A.COLD)
    assert reply.ok and reply.state == S.COLD and "i" not in w.controller.instances
    assert "i" not in w.pages.owners() and w.pages.counters().num_pages_free == w.pages.num_pages
    assert w.host.events[-1].via == "release"

    reply = await w.run("j", A.WARM)
    assert reply.ok and reply.state == S.WARM
    inst = w.controller.instances["j"]
    assert inst.has_host_copy and _weight_pages(w, "j") == 0
    assert ("serve", "j") not in w.host.calls  # never served while loading to host
    # the checkpoint went straight into host memory: no device -> host copy, and the bytes are the checkpoint's
    assert "load_ms" in reply.timings_ms and "snapshot_ms" not in reply.timings_ms
    plain = LLMEngine(w.controller.instances["j"].model_dir, config=EngineConfig(kv_cache_bytes=1 << 20))
    num_bytes = plain.weight_layout.total_bytes
    assert torch.equal(inst.host.buffer[:num_bytes], plain.weight_buffer[:num_bytes])
    assert inst.engine.reference_canary is None  # the device never held these weights yet
    reply = await w.run("j", A.ACTIVATE)
    assert reply.ok and [e.via for e in w.host.events[-3:]] == ["warm_copy"] * 3
    assert reply.timings_ms["checksum_ms"] > 0  # against the checksums taken of the host copy at load
    assert torch.equal(inst.engine.weight_buffer[:num_bytes], plain.weight_buffer[:num_bytes])
    assert greedy_tokens(inst.engine) == greedy_tokens(plain)
    assert inst.engine.reference_canary.matches(plain.reference_canary)


async def test_repeats_and_noops_change_nothing(make_worker):
    w = make_worker()
    book = CommandBook()
    cmd = w.command("i", A.ACTIVATE)
    first = await book.submit(cmd, w.controller.execute)
    num_events = len(w.host.events)
    again = await book.submit(cmd, w.controller.execute)
    assert again == first and book.num_repeats == 1 and len(w.host.events) == num_events
    # a new command that is already satisfied is a no-op too
    reply = await w.run("i", A.ACTIVATE)
    assert reply.ok and reply.detail == "already active" and len(w.host.events) == num_events
    assert w.host.calls[-1] == ("refresh", "i")  # but the registry record is asserted again
    reply = await w.run("never", A.COLD)
    assert reply.ok and reply.state == S.COLD and "never" not in w.controller.instances


async def test_bad_commands_get_typed_refusals(make_worker):
    w = make_worker()
    await w.run("i", A.ACTIVATE)
    other = w.command("i", A.ACTIVATE).model_copy(update={"model": "demo-small"})
    reply = await w.controller.execute(other)
    assert not reply.ok and reply.error.code == "invalid_request" and "demo-tiny" in reply.detail
    stray = w.command("i", A.WARM).model_copy(update={"worker_id": "elsewhere"})
    reply = await w.controller.execute(stray)
    assert not reply.ok and "elsewhere" in reply.detail


async def test_a_wake_without_room_stays_warm_and_says_so(make_worker, tiny_dir):
    w = make_worker(pool_bytes=1 << 20)  # 16 pages of 64 KiB: room for one model's weights, not two
    assert (await w.run("a", A.ACTIVATE)).ok
    assert (await w.run("a", A.WARM)).ok
    assert (await w.run("b", A.ACTIVATE)).ok  # takes the pages a gave back
    reply = await w.run("a", A.ACTIVATE)
    assert not reply.ok and reply.state == S.WARM and "wake failed" in reply.detail
    assert w.host.events[-1].to_state == S.WARM
    assert (await w.run("b", A.COLD)).ok
    reply = await w.run("a", A.ACTIVATE)
    assert reply.ok and reply.state == S.ACTIVE


async def test_commands_queued_on_one_instance_run_in_order_and_never_lose_it(make_worker):
    import asyncio

    w = make_worker()
    await w.run("i", A.ACTIVATE)
    # cold, then activate, issued together: the second waits for the first, then brings the same id back
    cold, active = await asyncio.gather(w.run("i", A.COLD), w.run("i", A.ACTIVATE))
    assert cold.ok and cold.state == S.COLD
    assert active.ok and active.state == S.ACTIVE
    assert w.controller.instances["i"].is_ready and "i" in w.pages.owners()


class _SlowDrainHost:
    """A shell whose drain lasts until the instance is wanted again (a long stream still running), as the worker
    service's drain does."""

    def __init__(self, host) -> None:
        self._host = host

    def __getattr__(self, name):
        return getattr(self._host, name)

    async def drain(self, inst, timeout_s: float) -> dict[str, float]:
        import asyncio

        self._host.calls.append(("drain", inst.instance_id))
        try:
            await asyncio.wait_for(inst.resume_requested.wait(), timeout_s)
        except TimeoutError:
            pass
        return {"drain_ms": 1.0}


async def test_an_activation_during_a_drain_resumes_the_instance_in_place(make_worker):
    import asyncio

    w = make_worker()
    await w.run("i", A.ACTIVATE)
    inst = w.controller.instances["i"]
    expected = greedy_tokens(inst.engine)
    w.controller.host = _SlowDrainHost(w.host)
    removal = asyncio.create_task(w.run("i", A.WARM))
    for _ in range(200):
        if inst.state == S.DRAINING:
            break
        await asyncio.sleep(0.01)
    assert inst.state == S.DRAINING
    active = await asyncio.wait_for(w.run("i", A.ACTIVATE), 10)
    removed = await asyncio.wait_for(removal, 10)
    assert active.ok and active.state == S.ACTIVE, active
    assert not removed.ok and removed.error.code.value == "cancelled" and removed.state == S.ACTIVE, removed
    assert [e.to_state for e in w.host.events[-2:]] == [S.DRAINING, S.ACTIVE]
    assert inst.is_ready and _weight_pages(w, "i") > 0, "the weights never left"
    assert greedy_tokens(inst.engine) == expected
    assert not inst.resume_requested.is_set()
    # a later removal drains (and is not stopped by the old request)
    w.controller.host = w.host
    again = await w.run("i", A.WARM)
    assert again.ok and again.state == S.WARM


async def test_a_warm_instance_without_a_host_copy_comes_back_by_a_cold_load(make_worker):
    # e.g. an engine without weights (the echo engine) parked WARM keeps no host copy: activating it again must not
    # try WARM -> LOADING (not a transition) but go through COLD
    w = make_worker()
    await w.run("i", A.ACTIVATE)
    assert (await w.run("i", A.WARM)).state == S.WARM
    inst = w.controller.instances["i"]
    inst.host = None  # the host copy is gone
    reply = await w.run("i", A.ACTIVATE)
    assert reply.ok and reply.state == S.ACTIVE, reply
    assert [e.to_state for e in w.host.events[-4:]] == [S.COLD, S.LOADING, S.VERIFYING, S.ACTIVE]
    assert inst.is_ready and greedy_tokens(inst.engine)

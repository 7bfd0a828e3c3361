"""Lifecycle and data plane through a real nats-server and two real worker processes (`janus serve worker`), each
with its own page pool and Mooncake transfer engine (TCP loopback): fork, P/D hand-over, drain under load,
idempotent commands. The test process plays the reconciler (lifecycle commands) and, where no dispatcher runs, the
dispatcher (RunAssignments); the drain test runs a real dispatcher."""
from __future__ import annotations

import asyncio
import time

import pytest
import torch
import yaml

from contracts import (
    ForkSource,
    InstanceRole,
    KVTarget,
    LifecycleAction,
    LifecycleEvent,
    ModelState,
    MoveDecodes,
    MoveDecodesAck,
    Pool,
    RequestDone,
    RequestFailed,
    ResendReply,
    ResendRequest,
    RunAssignment,
    SubmitAck,
    TokenChunk,
    subjects,
)
from runtime.bus import BusError
from tests.bus.worker_procs import (
    MODEL,
    Observer,
    command,
    make_request,
    read_replicas,
    run_on,
    running_workers,
    whole_and_split,
)
from tests.polling import wait_for

pytestmark = pytest.mark.slow  # two worker processes start (torch, engines): ~10-20 s on a shared 2-core box

A, B = "lc-a", "lc-b"
INST_A, INST_B = f"{A}/{MODEL}", f"{B}/{MODEL}"


@pytest.fixture(scope="module")
async def cluster(nats_url, demo_models_dir, tmp_path_factory, bus_factory_module):
    state = tmp_path_factory.mktemp("lc-state")
    config = state / "cluster.yaml"
    config.write_text(yaml.safe_dump({
        "models": [{"name": MODEL, "path": str(demo_models_dir / MODEL), "ttft_slo_ms": 60_000}],
        "workers": {"pool_bytes": 96 << 20, "max_num_seqs": 4, "placement": {A: [MODEL], B: []}},
    }))
    bus = await bus_factory_module("lifecycle-test")
    obs = Observer()
    await obs.start(bus)
    async with running_workers(bus, (A, B), config, state, nats_url):
        yield bus, obs, config


@pytest.fixture(scope="module")
async def bus_factory_module(nats_url):
    from runtime.bus import Bus

    opened = []

    async def make(service: str):
        bus = await Bus.connect(nats_url, service)
        opened.append(bus)
        return bus

    yield make
    for bus in opened:
        await bus.close()


async def _ensure_active(bus, obs, worker_id: str, instance_id: str) -> None:
    reply = await command(bus, worker_id, instance_id, LifecycleAction.ACTIVATE)
    assert reply.ok and reply.state == ModelState.ACTIVE, reply


async def test_fork_gives_bit_identical_weights_and_identical_greedy_output(cluster):
    bus, obs, _ = cluster
    await _ensure_active(bus, obs, A, INST_A)
    hb_a = await obs.heartbeat_after(A, time.time() * 1e3)
    source = next(s for s in hb_a.instances if s.instance_id == INST_A)
    assert hb_a.transfer_session and source.weight_segments and all(s.checksum for s in source.weight_segments)
    assert hb_a.pages.pages_by_model[MODEL]["weights"] > 0

    # the source keeps serving while it is read
    busy = [make_request([3, 1, 4, 1, 5], max_tokens=24) for _ in range(3)]
    for req in busy:
        await run_on(bus, A, INST_A, req)
    fork = ForkSource(worker_id=A, instance_id=INST_A, transfer_session=hb_a.transfer_session,
                      segments=source.weight_segments)
    reply = await command(bus, B, INST_B, LifecycleAction.FORK_FROM, fork_source=fork)
    assert reply.ok and reply.state == ModelState.ACTIVE, reply
    assert "pulled" in reply.detail and reply.timings_ms["pull_ms"] > 0
    for req in busy:
        tokens, end = await obs.result(req.request_id)
        assert isinstance(end, RequestDone) and len(tokens) == 24

    fork_events = [e for e in obs.events if e.instance_id == INST_B and e.command_id == reply.command_id]
    assert [(e.from_state, e.to_state) for e in fork_events] == [
        (ModelState.COLD, ModelState.FORKING), (ModelState.FORKING, ModelState.VERIFYING),
        (ModelState.VERIFYING, ModelState.ACTIVE)]
    assert {e.via for e in fork_events} == {"fork"} and "pull_ms" in fork_events[1].timings_ms

    # bit-identical: read both replicas' weight pages out of the two worker processes
    hb_a = await obs.heartbeat_after(A, time.time() * 1e3)
    hb_b = await obs.heartbeat_after(B, time.time() * 1e3)
    weights_a, weights_b = await read_replicas(None, (hb_a, INST_A), (hb_b, INST_B))
    assert weights_a.numel() > 0 and torch.equal(weights_a, weights_b)
    assert [s.checksum for s in next(i for i in hb_b.instances if i.instance_id == INST_B).weight_segments]

    await _assert_same_greedy_output(bus, obs, (A, INST_A), (B, INST_B), max_tokens=16)


async def _assert_same_greedy_output(bus, obs, one: tuple[str, str], other: tuple[str, str], max_tokens: int) -> None:
    """The same greedy request on two instances ((worker, instance) each) yields the same tokens."""
    prompt = [17, 4, 99, 250, 8, 31, 77]
    requests = [make_request(prompt, max_tokens=max_tokens) for _ in range(2)]
    for (worker, instance), req in zip((one, other), requests):
        await run_on(bus, worker, instance, req)
    tokens = [(await obs.result(req.request_id))[0] for req in requests]
    assert len(tokens[0]) == max_tokens and tokens[0] == tokens[1]


def _text(obs, request_id: str) -> str:
    return "".join(e.text for e in sorted(obs.streams[request_id], key=lambda e: e.seq) if isinstance(e, TokenChunk))


@pytest.mark.parametrize("prefill,decode", [((A, INST_A), (B, INST_B)), ((B, INST_B), (A, INST_A))])
@pytest.mark.parametrize("prompt,max_tokens", [
    ([5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 3, 8, 3, 2, 7, 9, 5, 0, 2, 8, 8, 4, 1, 9, 7],
     20),  # a prompt over three KV blocks (16 tokens each)
    ([11, 12], 12),
    ([40, 41, 42], 1),  # ends at its first token, on the prefill instance
])
async def test_pd_request_yields_exactly_the_tokens_of_one_instance(cluster, prefill, decode, prompt, max_tokens):
    bus, obs, _ = cluster
    await _ensure_active(bus, obs, *prefill)
    await _ensure_active(bus, obs, *decode)
    (tokens_whole, end_whole), (tokens_split, end_split), whole, split = await whole_and_split(
        bus, obs, prefill, decode, prompt, max_tokens=max_tokens)
    assert isinstance(end_split, RequestDone), end_split
    assert tokens_split == tokens_whole and len(tokens_split) == max_tokens
    assert _text(obs, split.request_id) == _text(obs, whole.request_id)
    # the first token came from the prefill instance, everything after it (terminal included) from the decode one;
    # a request that ends at its first token ends on the prefill instance
    assert end_whole.instance_id == prefill[1]
    assert end_split.instance_id == (decode[1] if max_tokens > 1 else prefill[1])
    assert end_split.num_output_tokens == max_tokens
    # nothing is left behind: the decode side's reservation was used or released, the prefill side's blocks freed
    deadline = time.monotonic() + 5
    while True:
        hb_p = await obs.heartbeat_after(prefill[0], time.time() * 1e3)
        hb_d = await obs.heartbeat_after(decode[0], time.time() * 1e3)
        used = [next(i for i in hb.instances if i.instance_id == iid).num_kv_blocks_used
                for hb, iid in ((hb_p, prefill[1]), (hb_d, decode[1]))]
        if used == [0, 0] or time.monotonic() > deadline:
            break
    assert used == [0, 0]
    first = min(obs.streams[split.request_id], key=lambda e: e.seq)
    assert first.seq == 0 and isinstance(first, TokenChunk) and len(first.token_ids) == 1
    assert any(p.request_id == split.request_id and p.ok and p.instance_id == prefill[1]
               and not p.handed_over_to_instance_id for p in obs.prefills)
    # and, once D took it over, a hand-over notice: the dispatchers then tie the stream's fate to D, not P
    notices = [p.handed_over_to_instance_id for p in obs.prefills
               if p.request_id == split.request_id and p.handed_over_to_instance_id]
    assert notices == ([decode[1]] if max_tokens > 1 else [])


async def test_pd_seeded_sampling_continues_the_same_random_stream(cluster):
    bus, obs, _ = cluster
    await _ensure_active(bus, obs, A, INST_A)
    await _ensure_active(bus, obs, B, INST_B)
    (tokens_whole, _), (tokens_split, _), _, _ = await whole_and_split(
        bus, obs, (A, INST_A), (B, INST_B), [11, 12], max_tokens=24, temperature=1.0, seed=7)
    assert tokens_split == tokens_whole


async def test_pd_streams_are_resent_whole_by_the_prefill_worker(cluster):
    """A gateway that lost every event of the decode side knows only the prefill worker (chunk 0 names it): asked
    from seq 0, it answers its own chunk and fetches the rest from the decode worker. The decode worker answers for
    what it streamed."""
    bus, obs, _ = cluster
    await _ensure_active(bus, obs, A, INST_A)
    await _ensure_active(bus, obs, B, INST_B)
    _, (tokens, end), _, split = await whole_and_split(bus, obs, (A, INST_A), (B, INST_B), [21, 22, 23],
                                                        max_tokens=9)
    streamed = sorted(obs.streams[split.request_id], key=lambda e: e.seq)
    assert isinstance(end, RequestDone) and [e.worker_id for e in streamed[:2]] == [A, B]
    # The test sees D's last event before A may have had D's hand-over ack (two messages in flight): until then A
    # knows only its own chunk and answers that, a prefix, and the gateway asks again while its stream is open
    # (gateway/service.py `_recover`). So does the test: every answer a prefix, the whole within a few seconds.
    deadline_s = time.monotonic() + 5.0
    while True:
        whole = await bus.request(subjects.worker_resend(A), ResendRequest(request_id=split.request_id, from_seq=0),
                                  ResendReply, timeout_s=5)
        assert whole.is_known and list(whole.events) == streamed[:len(whole.events)], whole
        if len(whole.events) == len(streamed) or time.monotonic() > deadline_s:
            break
        await asyncio.sleep(0.05)
    assert list(whole.events) == streamed
    decode_part = await bus.request(subjects.worker_resend(B), ResendRequest(request_id=split.request_id,
                                                                             from_seq=0), ResendReply, timeout_s=5)
    assert decode_part.is_known and list(decode_part.events) == streamed[1:]


async def test_a_draining_decode_instance_honours_its_reservations_and_takes_no_new_ones(cluster):
    """The test plays the prefill worker: it reserves blocks on B, deactivates B, then hands the request over. The
    hand-over is still accepted and streamed to the end; B goes warm only after it, and refuses new reservations."""
    bus, obs, _ = cluster
    await _ensure_active(bus, obs, B, INST_B)
    req = make_request([9, 8, 7, 6, 5], max_tokens=24)
    reserve = RunAssignment(request=req, instance_id=INST_B, phase="decode", dispatched_unix_ms=time.time() * 1e3)
    target = await bus.request(subjects.worker_run(B), reserve, KVTarget, timeout_s=5)
    assert target.decode_instance_id == INST_B and len(target.block_offsets_bytes) == 1
    assert target.transfer_session == obs.heartbeats[B].transfer_session

    warm = asyncio.create_task(command(bus, B, INST_B, LifecycleAction.WARM))
    await wait_for(lambda: any(e.instance_id == INST_B and e.to_state == ModelState.DRAINING for e in obs.events[-5:]),
                   timeout_s=10, interval_s=0.02, what=f"{INST_B} draining")
    late = make_request([1, 2, 3], max_tokens=4)
    with pytest.raises(BusError) as refused:
        await bus.request(subjects.worker_run(B), RunAssignment(request=late, instance_id=INST_B, phase="decode",
                                                                 dispatched_unix_ms=time.time() * 1e3),
                          KVTarget, timeout_s=5)
    assert refused.value.error.code == "no_instance"

    handoff = RunAssignment(request=req.model_copy(update={"prompt_token_ids": (*req.prompt_token_ids, 42)}),
                            instance_id=INST_B, phase="decode", kv_target=target,
                            dispatched_unix_ms=time.time() * 1e3)
    ack = await bus.request(subjects.worker_run(B), handoff, KVTarget, timeout_s=5)
    assert ack == target
    tokens, end = await obs.result(req.request_id)
    assert isinstance(end, RequestDone) and end.instance_id == INST_B
    assert len(tokens) == 23 and end.num_output_tokens == 24  # the first token was the prefill side's
    reply = await warm
    assert reply.ok and reply.state == ModelState.WARM
    warm_event = next(e for e in obs.events if e.command_id == reply.command_id and e.to_state == ModelState.WARM)
    last_chunk = max((e for e in obs.streams[req.request_id] if isinstance(e, TokenChunk)), key=lambda e: e.seq)
    assert warm_event.unix_ms >= last_chunk.emitted_unix_ms  # released only after the hand-over was served


@pytest.mark.parametrize("temperature,seed", [(0.0, None), (1.0, 11)])
async def test_a_draining_instance_moves_its_running_decode_and_the_stream_goes_on(cluster, temperature, seed):
    """A long request decodes on A; A is told to go warm (it drains), and its worker to move its decodes to B (what
    the dispatcher does: dispatcher/core/moves.py). The client's stream continues from B without a gap or a
    repeat, token for token what one instance yields (seeded sampling too), A goes warm long before the request
    ends, and A still answers a resend of the whole stream."""
    bus, obs, _ = cluster
    await _ensure_active(bus, obs, A, INST_A)
    await _ensure_active(bus, obs, B, INST_B)
    prompt = [7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5, 9, 0, 4, 5, 2, 3, 5, 3, 6]
    whole = make_request(prompt, max_tokens=600, temperature=temperature, seed=seed)
    moving = make_request(prompt, max_tokens=600, temperature=temperature, seed=seed)
    await run_on(bus, B, INST_B, whole)
    await run_on(bus, A, INST_A, moving)
    await wait_for(lambda: len(obs.streams.get(moving.request_id, ())) >= 5, timeout_s=30, interval_s=0.01,
                   what="the request decoding on A")
    warm = asyncio.create_task(command(bus, A, INST_A, LifecycleAction.WARM))
    await wait_for(lambda: any(e.instance_id == INST_A and e.to_state == ModelState.DRAINING for e in obs.events[-5:]),
                   timeout_s=10, interval_s=0.01, what=f"{INST_A} draining")
    with pytest.raises(BusError) as refused:
        await bus.request(subjects.worker_move(A), MoveDecodes(instance_id=INST_A, target_worker_id=A,
                                                               target_instance_id=INST_A, max_requests=1),
                          MoveDecodesAck, timeout_s=5)
    assert refused.value.error.code == "invalid_request"
    ack = await bus.request(subjects.worker_move(A), MoveDecodes(instance_id=INST_A, target_worker_id=B,
                                                                 target_instance_id=INST_B, max_requests=4),
                            MoveDecodesAck, timeout_s=5)
    assert ack.request_ids == (moving.request_id,)
    reply = await warm
    assert reply.ok and reply.state == ModelState.WARM
    warm_at = next(e.unix_ms for e in obs.events if e.command_id == reply.command_id and e.to_state == ModelState.WARM)

    tokens, end = await obs.result(moving.request_id)
    tokens_whole, _ = await obs.result(whole.request_id)
    assert isinstance(end, RequestDone) and end.instance_id == INST_B and end.num_output_tokens == 600
    assert tokens == tokens_whole and _text(obs, moving.request_id) == _text(obs, whole.request_id)
    streamed = sorted(obs.streams[moving.request_id], key=lambda e: e.seq)
    assert [e.seq for e in streamed] == list(range(len(streamed)))  # no gap, no chunk twice
    by_worker = [e.worker_id for e in streamed]
    assert by_worker[0] == A and by_worker[-1] == B and by_worker == sorted(by_worker, key=lambda w: w != A)
    chunks = [e for e in streamed if isinstance(e, TokenChunk)]
    last_from_a = max(e.emitted_unix_ms for e in chunks if e.worker_id == A)
    assert last_from_a <= warm_at < chunks[-1].emitted_unix_ms  # A went warm before the request ended
    assert sum(len(e.token_ids) for e in chunks if e.worker_id == B) > 300  # most of it decoded on B
    assert [p.handed_over_to_instance_id for p in obs.prefills
            if p.request_id == moving.request_id and p.handed_over_to_instance_id] == [INST_B]
    whole_again = await bus.request(subjects.worker_resend(A), ResendRequest(request_id=moving.request_id,
                                                                             from_seq=0), ResendReply, timeout_s=5)
    assert whole_again.is_known and list(whole_again.events) == streamed


async def test_a_move_the_target_refuses_keeps_the_decode_where_it_is(cluster):
    bus, obs, _ = cluster
    await _ensure_active(bus, obs, A, INST_A)
    req = make_request([3, 3, 4, 4, 5], max_tokens=300)
    await run_on(bus, A, INST_A, req)
    await wait_for(lambda: len(obs.streams.get(req.request_id, ())) >= 3, timeout_s=30, interval_s=0.01,
                   what="the request decoding on A")
    ack = await bus.request(subjects.worker_move(A), MoveDecodes(instance_id=INST_A, target_worker_id=B,
                                                                 target_instance_id=f"{B}/no-such-model",
                                                                 max_requests=1), MoveDecodesAck, timeout_s=5)
    assert ack.request_ids == (req.request_id,)
    tokens, end = await obs.result(req.request_id)
    assert isinstance(end, RequestDone) and end.instance_id == INST_A and len(tokens) == 300
    streamed = sorted(obs.streams[req.request_id], key=lambda e: e.seq)
    assert [e.seq for e in streamed] == list(range(len(streamed))) and {e.worker_id for e in streamed} == {A}


async def test_lifecycle_commands_are_idempotent_over_the_bus(cluster):
    bus, obs, _ = cluster
    await _ensure_active(bus, obs, A, INST_A)
    inst = f"{A}/{MODEL}-extra"
    num_events = len(obs.events)
    first = await command(bus, A, inst, LifecycleAction.WARM, command_id="idem-1")
    again = await command(bus, A, inst, LifecycleAction.WARM, command_id="idem-1")
    assert first.ok and first.state == ModelState.WARM and again == first

    def mine() -> list[LifecycleEvent]:
        return [e for e in obs.events[num_events:] if e.instance_id == inst]

    await wait_for(lambda: any(e.to_state == ModelState.WARM for e in mine()), timeout_s=10,
                   what=f"the lifecycle event of {inst} going warm")
    # what must NOT come is a second transition for the repeated command. Nothing marks that none will, so a short
    # window after the first command's events: a loaded machine can only make it miss a wrong one, never fail
    await asyncio.sleep(0.3)
    assert [e.to_state for e in mine()] == [ModelState.LOADING, ModelState.WARM]
    hb = await obs.heartbeat_after(A, time.time() * 1e3)
    assert next(s for s in hb.instances if s.instance_id == inst).state == ModelState.WARM
    cold = await command(bus, A, inst, LifecycleAction.COLD)
    assert cold.ok and cold.state == ModelState.COLD
    hb = await obs.heartbeat_after(A, time.time() * 1e3)
    assert inst not in {s.instance_id for s in hb.instances}
    wrong = await command(bus, A, INST_A, LifecycleAction.ACTIVATE, command_id="idem-2")
    assert wrong.ok and wrong.detail == "already active"


async def test_a_warm_copy_offered_in_the_heartbeat_is_pulled_by_the_other_worker(cluster):
    from planner.core.cluster_view import ClusterView

    bus, obs, _ = cluster
    await _ensure_active(bus, obs, A, INST_A)
    warm, pulled = f"{A}/{MODEL}-warm", f"{B}/{MODEL}-pulled"
    try:
        reply = await command(bus, A, warm, LifecycleAction.WARM)  # the checkpoint into A's host memory
        assert reply.ok and reply.state == ModelState.WARM and "host copy offered" in reply.detail, reply
        hb = await obs.heartbeat_after(A, time.time() * 1e3)
        offer = next(s for s in hb.instances if s.instance_id == warm).host_copy
        assert offer is not None and offer.segments and all(s.checksum for s in offer.segments)
        # the source the reconciler's view picks from that heartbeat (no live replica known to it)
        view = ClusterView(heartbeat_timeout_ms=60_000)
        view.on_heartbeat(hb.sent_unix_ms, hb)
        source = view.fork_source(MODEL, {A, B}, exclude_ids=set(), target_worker=B)
        assert (source.kind, source.instance_id, source.transfer_session) == ("host_copy", warm, hb.transfer_session)

        reply = await command(bus, B, pulled, LifecycleAction.FORK_FROM, fork_source=source)
        assert reply.ok and reply.state == ModelState.ACTIVE and f"from the host copy of {warm}" in reply.detail, reply
        events = [e for e in obs.events if e.instance_id == pulled and e.command_id == reply.command_id]
        assert events and {e.via for e in events} == {"remote_warm"}
        await _assert_same_greedy_output(bus, obs, (A, INST_A), (B, pulled), max_tokens=12)
    finally:
        for worker, inst in ((A, warm), (B, pulled)):
            await command(bus, worker, inst, LifecycleAction.COLD)


async def test_deactivating_under_load_loses_no_request(cluster, nats_url, demo_models_dir):
    from dispatcher.service import DispatcherService
    from runtime.service import run_service
    from runtime.settings import ClusterConfig, JanusSettings

    bus, obs, config = cluster
    await _ensure_active(bus, obs, A, INST_A)
    await _ensure_active(bus, obs, B, INST_B)
    cluster_config = ClusterConfig.model_validate(yaml.safe_load(config.read_text()))
    dispatcher = DispatcherService(JanusSettings(nats_url=nats_url, instance="lc-dispatcher",
                                                 state_dir=demo_models_dir.parent), cluster_config)
    task = asyncio.create_task(run_service(dispatcher, install_signals=False))
    try:
        await wait_for(lambda: sum(1 for r in dispatcher._records.values() if r.is_ready) >= 2, timeout_s=30,
                       tasks=[task], what="both instances ready in the dispatcher's registry")
        max_tokens = 32
        reqs = [make_request([7 + i % 50, 3, 9, 27], max_tokens=max_tokens) for i in range(24)]
        for req in reqs:
            ack = await bus.request(subjects.req(MODEL), req, SubmitAck, timeout_s=5)
            assert ack.status == "queued", ack
        # deactivate A while it is streaming
        await wait_for(lambda: any(obs.streams.get(r.request_id) for r in reqs), timeout_s=30, interval_s=0.01,
                       what="a request streaming")
        reply = await command(bus, A, INST_A, LifecycleAction.WARM)
        assert reply.ok and reply.state == ModelState.WARM, reply
        results = [await obs.result(r.request_id, timeout_s=120) for r in reqs]
        # the dispatcher forgets each request as its worker reports its end (RequestOutcome, even when heard before
        # the first token); one that failed after its first token has no outcome and stays until the gateway's
        # timeout, one that failed before it never streamed
        num_unfinished = sum(1 for tokens, end in results if not isinstance(end, RequestDone) and tokens)
        try:
            await wait_for(lambda: dispatcher.health_detail()["streaming"] == str(num_unfinished), timeout_s=10,
                           what="the dispatcher forgetting every request that finished")
        except TimeoutError:
            raise AssertionError(f"streaming {dispatcher.health_detail()['streaming']}, expected {num_unfinished}: "
                                 f"{[type(end).__name__ for _, end in results]}") from None
    finally:
        dispatcher.stopped.set()
        await asyncio.gather(task, return_exceptions=True)
    failed = [end for _, end in results if not isinstance(end, RequestDone)]
    for end in failed:  # allowed only as a clear, typed error
        assert isinstance(end, RequestFailed) and end.error.code and end.error.message, end
    assert all(len(tokens) == max_tokens for tokens, end in results if isinstance(end, RequestDone))
    drain = [e for e in obs.events if e.instance_id == INST_A and e.command_id == reply.command_id]
    assert [e.to_state for e in drain] == [ModelState.DRAINING, ModelState.WARM]
    assert "drain_ms" in reply.timings_ms
    # A was really serving when it stopped admitting: some requests it held either finished there after the drain
    # began, or were handed back before their first token
    drained_at = drain[0].unix_ms
    finished_on_a = [end for _, end in results if isinstance(end, RequestDone) and end.instance_id == INST_A
                     and end.first_token_unix_ms and end.first_token_unix_ms < drained_at]
    handed_back = [p for p in obs.prefills if not p.ok and p.instance_id == INST_A]
    assert finished_on_a or handed_back
    assert any(end.instance_id == INST_B for _, end in results if isinstance(end, RequestDone))
    # a handed-back request never goes back to the draining instance (InstanceView.is_routable: ready and ACTIVE
    # only), so every request completes
    assert not failed, f"{len(failed)} of {len(reqs)} requests failed: {failed[0].error.message}"


async def test_the_dispatcher_moves_the_decodes_off_a_draining_decode_instance(cluster, nats_url, demo_models_dir):
    """P/D with a real dispatcher (`moves_draining_decodes` on): a prefill instance on B, a decode instance on each
    worker. While the requests decode, A's decode instance is told to go warm; the dispatcher sees it draining in
    A's heartbeat and orders its decodes to B's decode instance (at once: `move_after_draining_ms` 0 here). Every
    request ends on B with all its tokens, and A goes warm long before they end."""
    from dispatcher.service import DispatcherService
    from runtime.service import run_service
    from runtime.settings import ClusterConfig, JanusSettings

    bus, obs, config = cluster
    prefill, decode_a, decode_b = f"{B}/{MODEL}/prefill", f"{A}/{MODEL}/decode", f"{B}/{MODEL}/decode"
    for worker, instance in ((A, INST_A), (B, INST_B)):  # only P/D instances serve: every request splits
        await command(bus, worker, instance, LifecycleAction.WARM)
    for worker, instance, role in ((B, prefill, InstanceRole.PREFILL), (A, decode_a, InstanceRole.DECODE),
                                   (B, decode_b, InstanceRole.DECODE)):
        reply = await command(bus, worker, instance, LifecycleAction.ACTIVATE, role=role, pool=Pool.ELASTIC)
        assert reply.ok and reply.state == ModelState.ACTIVE, reply
    cluster_config = ClusterConfig.model_validate({**yaml.safe_load(config.read_text()), "dispatcher": {
        "moves_draining_decodes": True, "move_after_draining_ms": 0.0}})  # at A's first DRAINING heartbeat
    dispatcher = DispatcherService(JanusSettings(nats_url=nats_url, instance="lc-mover",
                                                 state_dir=demo_models_dir.parent), cluster_config)
    task = asyncio.create_task(run_service(dispatcher, install_signals=False))
    try:
        await wait_for(lambda: {prefill, decode_a, decode_b} <= {r.instance_id for r in dispatcher._records.values()
                                                                if r.is_ready}, timeout_s=30, tasks=[task],
                       what="the P/D instances ready in the dispatcher's registry")
        # long enough to be decoding still when A's next heartbeat (0.5 s) says it drains, on an idle machine too
        reqs = [make_request([5 + i, 8, 13, 21, 34], max_tokens=2000) for i in range(4)]
        for req in reqs:
            ack = await bus.request(subjects.req(MODEL), req, SubmitAck, timeout_s=5)
            assert ack.status == "queued", ack
        await wait_for(lambda: all(len(obs.streams.get(r.request_id, ())) >= 3 for r in reqs), timeout_s=30,
                       interval_s=0.01, what="every request decoding")
        on_a = [r for r in reqs if obs.streams[r.request_id][-1].worker_id == A]
        assert on_a, "the least-backlog rule put some decodes on A"
        reply = await command(bus, A, decode_a, LifecycleAction.WARM)
        assert reply.ok and reply.state == ModelState.WARM, reply
        warm_at = next(e.unix_ms for e in obs.events if e.command_id == reply.command_id
                       and e.to_state == ModelState.WARM)
        results = {r.request_id: await obs.result(r.request_id, timeout_s=120) for r in reqs}
        assert dispatcher.health_detail()["decodes_moved"] == str(len(on_a))
    finally:
        dispatcher.stopped.set()
        await asyncio.gather(task, return_exceptions=True)
        for worker, instance in ((B, prefill), (A, decode_a), (B, decode_b)):
            await command(bus, worker, instance, LifecycleAction.COLD)
    for req in reqs:
        tokens, end = results[req.request_id]
        assert isinstance(end, RequestDone) and len(tokens) == 2000 and end.instance_id == decode_b, end
        chunks = sorted(obs.streams[req.request_id], key=lambda e: e.seq)
        assert [e.seq for e in chunks] == list(range(len(chunks)))
    last_chunk = max(e.emitted_unix_ms for r in on_a for e in obs.streams[r.request_id] if isinstance(e, TokenChunk))
    assert warm_at < last_chunk  # A left before the decodes it held had ended
    assert {p.handed_over_to_instance_id for p in obs.prefills if p.instance_id == decode_a
            and p.handed_over_to_instance_id} == {decode_b}

"""Lossless streams over bus failover, worker side: a real worker (WorkerService, echo engine) keeps what it streamed
and answers janus.worker.<w>.resend with exactly those events, for a finished request, a running one, and (not
known) one it never had. The test plays the dispatcher (RunAssignments straight to the worker) and the gateway."""
from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time

import pytest

from contracts import (
    STREAM_EVENT,
    CancelRequest,
    GenerateRequest,
    RequestDone,
    RequestFailed,
    ResendReply,
    ResendRequest,
    RunAssignment,
    SamplingParams,
    TokenChunk,
    subjects,
)

from .cluster import wait_until

WORKER = "rs-worker-0"
MODEL = "demo-tiny"
INSTANCE = f"{WORKER}/{MODEL}"
_ids = itertools.count()


@pytest.fixture(scope="module")
async def worker(nats_url, demo_models_dir):
    from runtime.service import run_service
    from runtime.settings import ClusterConfig, JanusSettings
    from worker.shell.service import WorkerService

    cluster = ClusterConfig.model_validate({
        "models": [{"name": MODEL, "path": str(demo_models_dir / MODEL)}],
        "workers": {"engine": "echo", "pool_bytes": 64 << 20}})
    svc = WorkerService(JanusSettings(nats_url=nats_url, instance=WORKER, state_dir=demo_models_dir.parent), cluster,
                        worker_id=WORKER)
    task = asyncio.create_task(run_service(svc, install_signals=False))
    await wait_until(lambda: INSTANCE in svc.residents and svc.residents[INSTANCE].is_ready, timeout_s=60,
                     tasks=[task])
    yield svc
    svc.stopped.set()
    await asyncio.gather(task, return_exceptions=True)


@pytest.fixture
async def client(bus_factory):
    bus = await bus_factory("resend-test")
    streams: dict[str, list] = {}

    async def on_event(event, env) -> None:
        streams.setdefault(event.request_id, []).append(event)

    await bus.subscribe(subjects.reply_wildcard("rstest"), STREAM_EVENT, on_event, traced=False)
    return bus, streams


async def _submit(bus, max_tokens: int) -> str:
    rid = f"rs-{next(_ids)}-{os.getpid()}"
    now = time.time() * 1e3
    req = GenerateRequest(request_id=rid, model=MODEL, prompt_token_ids=(11, 12, 13),
                          sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0),
                          arrival_unix_ms=now, ttft_deadline_unix_ms=now + 60_000, tpot_slo_ms=1000,
                          reply_subject=subjects.reply("rstest", rid))
    await bus.publish(subjects.worker_run(WORKER), RunAssignment(request=req, instance_id=INSTANCE,
                                                                 dispatched_unix_ms=now))
    return rid


async def _resend(bus, rid: str, from_seq: int) -> ResendReply:
    return await bus.request(subjects.worker_resend(WORKER), ResendRequest(request_id=rid, from_seq=from_seq),
                             ResendReply, timeout_s=5)


async def _resend_all(bus, rid: str, from_seq: int) -> list:
    """What a gateway does: a reply too large for one message carries a prefix; ask again from past it."""
    events: list = []
    while True:
        reply = await _resend(bus, rid, from_seq)
        assert reply.is_known
        if not reply.events:
            return events
        events += reply.events
        from_seq = reply.events[-1].seq + 1


def _is_terminal(event) -> bool:
    return isinstance(event, (RequestDone, RequestFailed))


async def test_a_finished_request_is_resent_exactly(worker, client):
    bus, streams = client
    rid = await _submit(bus, max_tokens=6)
    await wait_until(lambda: any(_is_terminal(e) for e in streams.get(rid, [])), timeout_s=20)
    received = sorted(streams[rid], key=lambda e: e.seq)
    assert [e.seq for e in received] == list(range(7)) and isinstance(received[-1], RequestDone)
    assert all(e.worker_id == WORKER for e in received if isinstance(e, TokenChunk))  # where to ask again

    everything = await _resend(bus, rid, 0)
    assert everything.is_known and list(everything.events) == received
    tail = await _resend(bus, rid, 4)
    assert tail.is_known and list(tail.events) == received[4:]
    past_the_end = await _resend(bus, rid, 7)
    assert past_the_end.is_known and past_the_end.events == ()


async def test_a_running_request_is_resent_up_to_what_was_streamed(worker, client):
    bus, streams = client
    rid = await _submit(bus, max_tokens=1_000_000)  # runs until cancelled
    await wait_until(lambda: len(streams.get(rid, [])) >= 5, timeout_s=20)
    # hold the engine between two steps (as a lifecycle operation would): the request stays running, and what it
    # streamed so far is fixed; the echo engine would otherwise flood this process with tokens
    release = threading.Event()
    holding = asyncio.create_task(asyncio.to_thread(
        worker._stepped[INSTANCE].between_steps, lambda engine: release.wait(30)))
    try:
        await _quiet(streams, rid)
        so_far = await _resend_all(bus, rid, 2)
        assert [e.seq for e in so_far] == list(range(2, 2 + len(so_far))) and len(so_far) >= 3
        assert not any(_is_terminal(e) for e in so_far)
        # every event this client got is resent as it was (a slow consumer may also have lost some: the premise)
        received = [e for e in streams[rid] if e.seq >= 2]
        assert received and all(so_far[e.seq - 2] == e for e in received)
        nothing_new = await _resend(bus, rid, 2 + len(so_far))
        assert nothing_new.is_known and nothing_new.events == ()  # still running, nothing from there on yet
        await bus.publish(subjects.CANCEL, CancelRequest(request_id=rid, reason="test over"))
    finally:
        release.set()
        await holding
    await wait_until(lambda: any(_is_terminal(e) for e in streams[rid]), timeout_s=20)
    end = next(e for e in streams[rid] if _is_terminal(e))
    after = await _resend(bus, rid, end.seq)
    assert after.is_known and list(after.events) == [end] and isinstance(end, RequestFailed)


async def _quiet(streams, rid: str, quiet_s: float = 0.3) -> None:
    """Until no event of the request arrived for quiet_s."""
    count, since = -1, time.monotonic()
    while time.monotonic() - since < quiet_s:
        if len(streams[rid]) != count:
            count, since = len(streams[rid]), time.monotonic()
        await asyncio.sleep(0.02)


async def test_a_request_the_worker_never_had_is_not_known(worker, client):
    bus, _ = client
    reply = await _resend(bus, "never-seen-here", 0)
    assert reply.request_id == "never-seen-here" and not reply.is_known and reply.events == ()

"""Real worker processes (`janus serve worker`) for bus tests that play the reconciler and the dispatcher: start and
stop them, command their instances, hand them requests, and observe what they publish."""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from contracts import (
    STREAM_EVENT,
    GenerateRequest,
    KVTarget,
    HealthReply,
    LifecycleAction,
    LifecycleCommand,
    LifecycleEvent,
    LifecycleReply,
    PrefillDone,
    RunAssignment,
    SamplingParams,
    TokenChunk,
    WorkerHeartbeat,
    subjects,
)
from runtime.bus import BusError

MODEL = "demo-tiny"
_ids = itertools.count()


class Observer:
    """Everything the workers publish that the tests look at: heartbeats, lifecycle events, streams, prefills."""

    def __init__(self) -> None:
        self.heartbeats: dict[str, WorkerHeartbeat] = {}
        self.events: list[LifecycleEvent] = []
        self.streams: dict[str, list] = {}
        self.prefills: list[PrefillDone] = []
        self.done: dict[str, asyncio.Event] = {}

    async def start(self, bus) -> None:
        async def on_hb(hb: WorkerHeartbeat, env) -> None:
            self.heartbeats[hb.worker_id] = hb

        async def on_event(ev: LifecycleEvent, env) -> None:
            self.events.append(ev)

        async def on_stream(ev, env) -> None:
            self.streams.setdefault(ev.request_id, []).append(ev)
            if not isinstance(ev, TokenChunk):
                self.done.setdefault(ev.request_id, asyncio.Event()).set()

        async def on_prefill(done: PrefillDone, env) -> None:
            self.prefills.append(done)

        await bus.subscribe(subjects.WORKER_TELEMETRY_WILDCARD, WorkerHeartbeat, on_hb, traced=False)
        await bus.subscribe(subjects.LIFECYCLE_EVENT, LifecycleEvent, on_event, traced=False)
        await bus.subscribe(subjects.reply_wildcard("lctest"), STREAM_EVENT, on_stream, traced=False)
        await bus.subscribe(subjects.PREFILL_DONE, PrefillDone, on_prefill, traced=False)

    async def result(self, request_id: str, timeout_s: float = 60.0) -> tuple[list[int], object]:
        """(tokens in seq order, the terminal event) of one request."""
        await asyncio.wait_for(self.done.setdefault(request_id, asyncio.Event()).wait(), timeout_s)
        events = sorted(self.streams[request_id], key=lambda e: e.seq)
        tokens = [t for e in events if isinstance(e, TokenChunk) for t in e.token_ids]
        return tokens, next(e for e in events if not isinstance(e, TokenChunk))

    async def heartbeat_after(self, worker_id: str, since_unix_ms: float, timeout_s: float = 10.0) -> WorkerHeartbeat:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            hb = self.heartbeats.get(worker_id)
            if hb is not None and hb.sent_unix_ms > since_unix_ms:
                return hb
            await asyncio.sleep(0.05)
        raise TimeoutError(f"no heartbeat from {worker_id}")


def make_request(prompt, *, max_tokens: int, temperature: float = 0.0, seed: int | None = None) -> GenerateRequest:
    rid = f"lc-{next(_ids)}-{os.getpid()}"
    now = time.time() * 1e3
    return GenerateRequest(request_id=rid, model=MODEL, prompt_token_ids=tuple(prompt),
                           sampling=SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed,
                                                   ignore_eos=True),
                           arrival_unix_ms=now, ttft_deadline_unix_ms=now + 60_000, tpot_slo_ms=1000,
                           reply_subject=subjects.reply("lctest", rid))


async def run_on(bus, worker_id: str, instance_id: str, req: GenerateRequest, **kw) -> None:
    await bus.publish(subjects.worker_run(worker_id),
                      RunAssignment(request=req, instance_id=instance_id, dispatched_unix_ms=time.time() * 1e3, **kw))


async def command(bus, worker_id: str, instance_id: str, action: LifecycleAction, *, command_id: str | None = None,
                   **kw) -> LifecycleReply:
    cmd = LifecycleCommand(command_id=command_id or f"cmd-{next(_ids)}", worker_id=worker_id, model=MODEL,
                           instance_id=instance_id, action=action, issued_unix_ms=time.time() * 1e3, **kw)
    return await bus.request(subjects.worker_cmd(worker_id), cmd, LifecycleReply, timeout_s=60)


def start_worker(worker_id: str, config: Path, state: Path, nats_url: str, log: Path) -> subprocess.Popen:
    janus = Path(sys.executable).parent / "janus"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "JANUS_LOG_LEVEL": "WARNING"}
    return subprocess.Popen([str(janus), "serve", "worker", "--nats", nats_url, "--config", str(config),
                             "--id", worker_id, "--state-dir", str(state)], env=env, stdout=log.open("w"),
                            stderr=subprocess.STDOUT)


async def _read_weights(bus_transfer, hb: WorkerHeartbeat, instance_id: str) -> torch.Tensor:
    """Read an instance's weight segments out of its worker's device pool through Mooncake, into one buffer."""
    status = next(s for s in hb.instances if s.instance_id == instance_id)
    total = sum(s.num_bytes for s in status.weight_segments)
    out = torch.zeros(total, dtype=torch.uint8)
    offsets, local = [], []
    pos = 0
    for seg in status.weight_segments:
        local.append(out.data_ptr() + pos)
        offsets.append(seg.global_offset_bytes)
        pos += seg.num_bytes
    await asyncio.to_thread(bus_transfer.read, hb.transfer_session, local, offsets,
                            [s.num_bytes for s in status.weight_segments])
    return out


async def read_replicas(settings, *replicas: tuple[WorkerHeartbeat, str]) -> list[torch.Tensor]:
    """The weights of each (heartbeat, instance) replica, read through a transfer engine of this process that
    listens as `settings` say (None: this machine only)."""
    from worker.dataplane.transfer import MooncakeTransfer

    reader = MooncakeTransfer.start(settings)
    scratch = torch.zeros(1, dtype=torch.uint8)
    reader.register(scratch.data_ptr(), 1)  # an engine that registered nothing cannot read
    try:
        return [await _read_weights(reader, hb, instance) for hb, instance in replicas]
    finally:
        reader.close()


def _unresolved(decode: tuple[str, str]) -> KVTarget:
    """What a dispatcher sends with a prefill: the decode instance, no session or offsets yet (its worker fills
    them in when the prefill worker asks it to reserve)."""
    return KVTarget(decode_worker_id=decode[0], decode_instance_id=decode[1], transfer_session="",
                    block_offsets_bytes=(), block_num_bytes=1)


async def whole_and_split(bus, obs, prefill, decode, prompt, **kw):
    """The same request twice on `prefill` ((worker, instance)): whole there, and split with its decode on `decode`;
    returns ((tokens, end) of each, then the two requests)."""
    whole, split = make_request(prompt, **kw), make_request(prompt, **kw)
    await run_on(bus, prefill[0], prefill[1], whole)
    await run_on(bus, prefill[0], prefill[1], split, phase="prefill", kv_target=_unresolved(decode))
    return (await obs.result(whole.request_id)), (await obs.result(split.request_id)), whole, split


@contextlib.asynccontextmanager
async def running_workers(bus, worker_ids, config: Path, state: Path, nats_url: str, *, start_timeout_s: float = 120):
    """Start one worker process per id on `config`, wait until each answers its health check, stop them after."""
    procs = {w: start_worker(w, config, state, nats_url, state / f"{w}.log") for w in worker_ids}
    try:
        deadline = time.monotonic() + start_timeout_s
        for w, proc in procs.items():
            while True:
                assert proc.poll() is None, (state / f"{w}.log").read_text()[-3000:]
                try:
                    await bus.request(subjects.health("worker", w), None, HealthReply, timeout_s=1)
                    break
                except BusError:
                    assert time.monotonic() < deadline, f"{w} did not start"
                    await asyncio.sleep(0.2)
        yield procs
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()

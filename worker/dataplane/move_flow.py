"""Moving running decodes off a draining instance S to an active instance T of the same model, on the bus.

A draining decode instance keeps its devices until its longest sequence ends, minutes for long outputs
(docs/bench/sim.md, run 56). The dispatcher, which sees S draining and T's backlog, asks S's worker to move some of
S's decodes to T (`MoveDecodes` on janus.worker.<S's worker>.move). Per request, the P/D hand-over again
(pd_flow.py), from a decode instead of a prefill:

1. S's engine takes the request out of its batch at its next step and holds its blocks
   (`LLMEngine.detach_decode`); the output saying so comes after the request's last tokens, so the stream's
   position (`RequestTrack.next_seq`) is final when the move goes on.
2. S's worker -> T's worker, request/reply `janus.worker.<T>.run`, phase="decode", `moved` set, no kv_target:
   "reserve blocks for the KV of the prompt and of the tokens so far"; T answers with the resolved `KVTarget`.
3. S writes the held blocks into T's (Mooncake by global offset; a copy inside the page pool on one worker).
4. S's worker -> T's worker, request/reply: the same with kv_target set and `moved` saying where the stream
   stands (its next chunk number, the tokens streamed, how many were on time). T admits the decode
   (`add_migrated_decode`) and streams every later chunk itself, the terminal event included.
5. S releases its blocks and tells the dispatchers that T streams the request now (a `PrefillDone` hand-over
   notice, as P/D's), and resends of later chunks are T's to answer.

Failures never lose a request: T cannot reserve, the write or the hand-over is refused -> S decodes on from its own
blocks (`reattach_decode`); no answer to the hand-over -> the client gets a clear error (T may or may not have it;
two streams must never interleave).
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol

from contracts import (ErrorCode, ErrorInfo, KVTarget, MoveDecodes, MoveDecodesAck, MovedStream, PrefillDone,
                       RunAssignment, subjects)
from runtime.bus import Bus, BusError, Envelope

from ..core.streaming import RequestTrack, failure
from ..lifecycle.instance import ModelInstance
from ..lifecycle.kv_transfer import write_kv_blocks
from .pd_flow import end_unanswered
from .transfer import MooncakeTransfer

log = logging.getLogger("janus.worker.move")

RESERVE_TIMEOUT_S = 2.0
HANDOFF_TIMEOUT_S = 5.0
# Every dispatcher hears every heartbeat and may order the same moves: orders for one instance closer together than
# this (one dispatcher waits a heartbeat, 0.5 s, between two) are the same order again and start nothing
MIN_ORDER_GAP_S = 0.4


class MoveHost(Protocol):
    """What moving decodes needs of the worker shell (WorkerService), and nothing more."""

    worker_id: str
    bus: Bus
    transfer: MooncakeTransfer | None
    pages: Any
    residents: dict[str, ModelInstance]

    def instance_of(self, track: RequestTrack) -> ModelInstance | None: ...

    async def send(self, track: RequestTrack, events: list) -> None: ...

    def wake_engines(self) -> None: ...


def is_movable(track: RequestTrack) -> bool:
    """Past its first token, decoding here (not a P/D prefill about to hand over), and not ending."""
    return (track.first_token_unix_ms is not None and not track.is_finished and not track.is_cancelled
            and track.extra.get("phase") in (None, "decode") and "request" in track.extra)


class DecodeMoveFlow:
    def __init__(self, host: MoveHost) -> None:
        self.host = host
        self._moving: dict[str, tuple[str, str]] = {}  # request -> (target worker, target instance)
        self._ordered_at: dict[str, float] = {}  # instance -> when its last order started moves (monotonic s)
        self.num_moved = 0
        self.num_kept = 0  # moves that failed before the hand-over: the request decodes on where it was
        self.move_ms: list[float] = []  # detached -> handed over, per request (for the bench)

    # ---- the command ------------------------------------------------------------------------------------------
    async def on_move(self, cmd: MoveDecodes, env: Envelope) -> MoveDecodesAck:
        """Start moving up to `max_requests` of the instance's decodes, the longest-running first (the ones most
        likely to hold the instance longest)."""
        host = self.host
        inst = host.residents.get(cmd.instance_id)
        if inst is None or inst.engine is None or not hasattr(inst.engine, "detach_decode"):
            raise BusError.of(ErrorCode.NO_INSTANCE, f"{cmd.instance_id} does not decode on {host.worker_id}")
        if cmd.target_instance_id == cmd.instance_id:
            raise BusError.of(ErrorCode.INVALID_REQUEST, "a decode cannot move to its own instance")
        now_s = time.monotonic()
        if now_s - self._ordered_at.get(cmd.instance_id, -MIN_ORDER_GAP_S) < MIN_ORDER_GAP_S:
            return MoveDecodesAck()
        tracks = sorted((t for t in inst.in_flight.values() if is_movable(t) and t.request_id not in self._moving),
                        key=lambda t: -t.num_output_tokens)[: cmd.max_requests]
        if tracks:
            self._ordered_at[cmd.instance_id] = now_s
            for stale in [i for i in self._ordered_at if i not in self.host.residents]:
                del self._ordered_at[stale]
        loop = asyncio.get_running_loop()

        def forget_if_refused(future, request_id: str) -> None:  # engine thread
            if future.exception() is not None:  # it ended or was preempted meanwhile: nothing moves
                loop.call_soon_threadsafe(self._moving.pop, request_id, None)

        for track in tracks:
            rid = track.request_id
            self._moving[rid] = (cmd.target_worker_id, cmd.target_instance_id)
            # success comes as the engine's output (on_detached), in order after the request's last tokens
            inst.engine.detach_decode(rid).add_done_callback(lambda f, rid=rid: forget_if_refused(f, rid))
        host.wake_engines()
        return MoveDecodesAck(request_ids=tuple(t.request_id for t in tracks))

    def on_detached(self, track: RequestTrack, out: Any) -> None:
        """The engine's output saying the request left its batch: every earlier token of it was streamed."""
        target = self._moving.get(track.request_id)
        inst = self.host.instance_of(track)
        if target is None or inst is None:  # not ours to move (cannot happen): keep decoding here
            if inst is not None and inst.engine is not None:
                inst.engine.reattach_decode(track.request_id)
                self.host.wake_engines()
            return
        asyncio.create_task(self._move(track, inst, out.detached, *target))

    # ---- one request ------------------------------------------------------------------------------------------
    async def _move(self, track: RequestTrack, inst: ModelInstance, detached: Any, target_worker: str,
                    target_instance: str) -> None:
        host = self.host
        engine = inst.engine
        rid = track.request_id
        started = time.perf_counter()
        try:
            if track.is_cancelled:
                engine.release_kv_blocks(rid)
                await host.send(track, [failure(track, ErrorInfo(code=ErrorCode.CANCELLED, message="cancelled"))])
                return
            req = track.extra["request"].model_copy(update={"prompt_token_ids": detached.prompt_token_ids})
            moved = MovedStream(output_token_ids=detached.output_token_ids, next_seq=track.next_seq,
                                first_token_unix_ms=track.first_token_unix_ms,
                                num_on_time_tokens=min(track.num_on_time_tokens, len(detached.output_token_ids)))
            subject = subjects.worker_run(target_worker)
            try:
                target = await host.bus.request(subject, RunAssignment(
                    request=req, instance_id=target_instance, phase="decode", moved=moved,
                    dispatched_unix_ms=_now_ms()), KVTarget, timeout_s=RESERVE_TIMEOUT_S)
                await asyncio.to_thread(write_kv_blocks, host.pages, engine, detached.kv_block_ids, target,
                                        host.transfer, is_local=target_worker == host.worker_id)
            except Exception as exc:  # noqa: BLE001 - T cannot take it, or the write failed: it stays here
                self._keep(inst, rid, f"{type(exc).__name__}: {exc}")
                return
            try:
                await host.bus.request(subject, RunAssignment(
                    request=req, instance_id=target_instance, phase="decode", kv_target=target, moved=moved,
                    dispatched_unix_ms=_now_ms()), KVTarget, timeout_s=HANDOFF_TIMEOUT_S)
            except BusError as exc:
                if exc.error.code == ErrorCode.TIMEOUT:
                    await end_unanswered(host, track, engine, f"instance {target_instance} did not answer the "
                                         "move of the request")
                    return
                self._keep(inst, rid, exc.error.message)
                return
            engine.release_kv_blocks(rid)
            self.num_moved += 1
            self.move_ms.append((time.perf_counter() - started) * 1e3)
            del self.move_ms[:-4096]
            track.is_finished = True  # T streams the rest
            track.extra["handed_to"] = target_worker  # resends of later chunks are T's to answer
            await host.send(track, [])
            await host.bus.publish(subjects.PREFILL_DONE, PrefillDone(
                request_id=rid, model=track.model, worker_id=host.worker_id, instance_id=track.instance_id,
                num_prompt_tokens=track.num_prompt_tokens, prefill_ms=0.0,
                first_token_unix_ms=track.first_token_unix_ms, handed_over_to_instance_id=target_instance),
                propagate=False)
        finally:
            self._moving.pop(rid, None)

    def _keep(self, inst: ModelInstance, request_id: str, why: str) -> None:
        log.info("%s: %s stays on %s (%s)", self.host.worker_id, request_id, inst.instance_id, why)
        self.num_kept += 1
        inst.engine.reattach_decode(request_id)
        self.host.wake_engines()


def _now_ms() -> float:
    return time.time() * 1e3

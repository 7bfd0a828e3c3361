"""Prefill/decode disaggregation on the bus: how a request moves from a prefill instance P to a decode instance D.

Messages (all `RunAssignment`, so the existing contracts carry them; see docs/lifecycle.md):

1. dispatcher -> P's worker, `janus.worker.<P>.run`: phase="prefill", instance_id=P, kv_target=KVTarget naming
   D (`decode_worker_id`, `decode_instance_id`) and left *unresolved* (`transfer_session=""`, no offsets).
2. P's worker -> D's worker, request/reply on `janus.worker.<D>.run`: phase="decode", instance_id=D,
   kv_target=None: "reserve KV blocks for this prompt". D answers with the resolved `KVTarget` (its transfer
   session, the global offsets of the blocks it reserved, the block size) or a typed error.
3. P prefills (prefill-only), streams the first token (chunk seq 0) to the client and `PrefillDone` to the
   dispatchers, writes the prompt's KV blocks into D's blocks (Mooncake write by global offset), releases its own.
4. P's worker -> D's worker, request/reply: phase="decode", instance_id=D, kv_target=the resolved target, and the
   request with the first token appended to `prompt_token_ids` (the contract has no field for it yet). D admits the
   decode, acknowledges (echoing the target), and streams every later event (seq 1 on) itself, terminal included.

Failures never lose a request: D cannot reserve -> P runs the request in full; the KV write or the hand-over is
refused -> P continues the decode itself from its own KV; no answer to the hand-over -> the client gets a clear
error (D may or may not have it; two streams must never interleave).
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any, Protocol

from contracts import CancelRequest, ErrorCode, ErrorInfo, KVTarget, PrefillDone, RunAssignment, subjects
from runtime.bus import Bus, BusError, Envelope

from ..core.streaming import Emission, RequestTrack, emissions_for, failure
from ..lifecycle.instance import ModelInstance, Reservation
from ..lifecycle.kv_transfer import write_kv_blocks
from .transfer import MooncakeTransfer

log = logging.getLogger("janus.worker.pd")

RESERVE_TIMEOUT_S = 2.0
HANDOFF_TIMEOUT_S = 5.0
RESERVATION_TTL_S = 120.0  # a reservation whose hand-over never came (the prefill worker died) is freed


class PrefillDecodeHost(Protocol):
    """What the P/D flow needs of the worker shell (WorkerService), and nothing more."""

    worker_id: str
    bus: Bus
    transfer: MooncakeTransfer | None  # None where Mooncake cannot run: P/D falls back to running in full
    pages: Any  # the worker's xTensor (worker.xtensor.XTensor): the KV write reads the prefill's blocks from it

    def instance_of(self, track: RequestTrack) -> ModelInstance | None: ...

    async def send(self, track: RequestTrack, events: list) -> None:
        """Log, then publish, a request's events to its client."""

    async def notify_dispatchers(self, emission: Emission) -> None:
        """Publish what an emission tells the dispatchers (its prefill notice, its outcome)."""

    def track(self, inst: ModelInstance, track: RequestTrack) -> None:
        """Take the request in: its events are logged for resends from now on."""

    def wake_engines(self) -> None: ...


def is_unresolved(target: KVTarget) -> bool:
    return not target.block_offsets_bytes


class PrefillDecodeFlow:
    def __init__(self, host: PrefillDecodeHost) -> None:
        self.host = host
        self.num_handoffs = 0
        self.num_local_fallbacks = 0
        self.handoff_ms: list[float] = []  # first token -> decode admitted, per request (for the bench)

    # ---- prefill side -----------------------------------------------------------------------------------------
    async def start_prefill(self, run: RunAssignment, inst: ModelInstance, track: RequestTrack) -> None:
        """Resolve the KV target (ask D to reserve), then queue the prefill; without a target, run it in full."""
        req = run.request
        target = run.kv_target
        engine = inst.engine
        if target is not None and is_unresolved(target) and hasattr(engine, "add_prefill_request"):
            try:
                target = await self.host.bus.request(
                    subjects.worker_run(target.decode_worker_id),
                    RunAssignment(request=req, instance_id=target.decode_instance_id, phase="decode",
                                  dispatched_unix_ms=_now_ms(), dispatcher_id=run.dispatcher_id),
                    KVTarget, timeout_s=RESERVE_TIMEOUT_S)
            except BusError as exc:
                log.warning("%s: decode instance %s cannot take %s (%s): running it in full", self.host.worker_id,
                            target.decode_instance_id, req.request_id, exc.error.message)
                target = None
            if track.is_finished:  # handed back (a drain) while we waited: D's reservation expires or is reused
                return
        if target is None or not hasattr(engine, "add_prefill_request"):
            engine.add_request(req.request_id, list(req.prompt_token_ids), req.sampling)
            return
        track.extra.update(phase="prefill", target=target, request=req)
        engine.add_prefill_request(req.request_id, list(req.prompt_token_ids), req.sampling)

    async def on_prefill_output(self, track: RequestTrack, out: Any, now_ms: float) -> None:
        """The prefill's one output: first token to the client, then the KV and the request go to D. A request
        that ended at its first token (max_tokens 1, a stop token or string) ends here, and D forgets its blocks."""
        if out.is_finished:
            emission = emissions_for(track, out, worker_id=self.host.worker_id, now_unix_ms=now_ms)
            await self.host.notify_dispatchers(emission)
            await self.host.send(track, emission.to_client)
            # "whoever holds the request stops work on it": D holds a reservation; the dispatchers are done with it
            await self.host.bus.publish(subjects.CANCEL, CancelRequest(request_id=track.request_id,
                                                                      reason="ended at its first token"),
                                       propagate=False)
            return
        first = dataclasses.replace(out, is_finished=False, finish_reason=None)
        emission = emissions_for(track, first, worker_id=self.host.worker_id, now_unix_ms=now_ms)
        await self.host.notify_dispatchers(emission)
        await self.host.send(track, emission.to_client)
        track.extra["phase"] = "handoff"
        asyncio.create_task(self._hand_off(track, out))

    async def _hand_off(self, track: RequestTrack, out: Any) -> None:
        """Write the KV into D's blocks, hand the request over, and only then let go of our own blocks: until D
        says yes, this instance can still finish the request itself."""
        host = self.host
        inst = host.instance_of(track)
        target: KVTarget = track.extra["target"]
        req = track.extra["request"]
        engine = inst.engine
        rid = track.request_id
        first_token = out.token_ids[-1]
        started = time.perf_counter()
        if track.is_cancelled:
            engine.release_kv_blocks(rid)
            await host.send(track, [failure(track, ErrorInfo(code=ErrorCode.CANCELLED, message="cancelled"))])
            return
        try:
            await asyncio.to_thread(write_kv_blocks, host.pages, engine, out.kv_block_ids, target, host.transfer,
                                    is_local=target.decode_worker_id == host.worker_id)
        except Exception as exc:  # noqa: BLE001 - keep the request here instead
            log.warning("%s: KV write for %s failed: %s", host.worker_id, rid, exc)
            await self._continue_here(track, out, engine, req, first_token)
            return
        handoff = RunAssignment(
            request=req.model_copy(update={"prompt_token_ids": (*req.prompt_token_ids, first_token)}),
            instance_id=target.decode_instance_id, phase="decode", kv_target=target,
            dispatched_unix_ms=track.first_token_unix_ms or _now_ms())
        try:
            await host.bus.request(subjects.worker_run(target.decode_worker_id), handoff, KVTarget,
                                  timeout_s=HANDOFF_TIMEOUT_S)
        except BusError as exc:
            if exc.error.code == ErrorCode.TIMEOUT:
                await end_unanswered(host, track, engine, f"decode instance {target.decode_instance_id} did not "
                                     "answer the hand-over")
                return
            log.warning("%s: hand-over of %s refused (%s): decoding here", host.worker_id, rid, exc.error.message)
            await self._continue_here(track, out, engine, req, first_token)
            return
        engine.release_kv_blocks(rid)
        self.num_handoffs += 1
        self.handoff_ms.append((time.perf_counter() - started) * 1e3)
        del self.handoff_ms[:-4096]
        track.is_finished = True  # D streams the rest; this worker is done with it
        track.extra["handed_to"] = target.decode_worker_id  # resends of later events are D's to answer
        await host.send(track, [])
        # tell the dispatchers who streams the request now (its fate follows D's, not ours)
        notice = PrefillDone(request_id=rid, model=track.model, worker_id=host.worker_id,
                             instance_id=track.instance_id, num_prompt_tokens=track.num_prompt_tokens,
                             prefill_ms=0.0, first_token_unix_ms=track.first_token_unix_ms or _now_ms(),
                             handed_over_to_instance_id=target.decode_instance_id)
        await host.bus.publish(subjects.PREFILL_DONE, notice, propagate=False)

    async def _continue_here(self, track: RequestTrack, out: Any, engine: Any, req: Any, first_token: int) -> None:
        """The KV could not go to D: decode on this instance from its own held blocks."""
        self.num_local_fallbacks += 1
        rid = track.request_id
        try:
            data = await asyncio.to_thread(engine.read_kv_blocks, out.kv_block_ids)
            engine.release_kv_blocks(rid)
            blocks = engine.reserve_kv_blocks(rid, len(req.prompt_token_ids))
            if blocks is None:
                raise RuntimeError("no KV blocks left here")
            await asyncio.to_thread(engine.write_kv_blocks, blocks, data)
            engine.add_decode_request(rid, list(req.prompt_token_ids), first_token, req.sampling, blocks)
        except Exception as exc:  # noqa: BLE001
            await self.host.send(track, [failure(track, ErrorInfo(
                code=ErrorCode.INSTANCE_FAILED, message=f"prefill done but the decode could not start: {exc}"))])
            return
        track.extra["phase"] = "decode"
        self.host.wake_engines()

    # ---- decode side ------------------------------------------------------------------------------------------
    async def serve_decode(self, run: RunAssignment, env: Envelope, inst: ModelInstance | None) -> None:
        """A reservation request (no kv_target) or a hand-over (kv_target set); answers on env.reply."""
        if inst is None or inst.engine is None or not hasattr(inst.engine, "reserve_kv_blocks"):
            raise BusError.of(ErrorCode.NO_INSTANCE, f"{run.instance_id} cannot decode on {self.host.worker_id}",
                              retryable=True)
        if run.kv_target is None:
            target = self._reserve(run, inst)
        else:
            target = self._admit(run, inst)
        if env.reply:
            await self.host.bus.publish(env.reply, target, propagate=False)

    def _reserve(self, run: RunAssignment, inst: ModelInstance) -> KVTarget:
        req = run.request
        if not inst.is_ready:
            raise BusError.of(ErrorCode.NO_INSTANCE, f"{inst.instance_id} is {inst.state.value}", retryable=True)
        engine = inst.engine
        # a moved decode brings the KV of its tokens so far too (all but the last, which has none yet)
        num_kv_tokens = req.num_prompt_tokens + (len(run.moved.output_token_ids) - 1 if run.moved else 0)
        earlier = inst.reservations.get(req.request_id)
        if earlier is not None and earlier.num_prompt_tokens == num_kv_tokens and run.moved is None:
            earlier.created_monotonic_s = time.monotonic()
            return earlier.target  # a re-dispatch after a hand-back: the blocks were never written, reuse them
        try:
            blocks = engine.reserve_kv_blocks(req.request_id, num_kv_tokens)
        except ValueError as exc:
            raise BusError.of(ErrorCode.INVALID_REQUEST, str(exc)) from None
        if blocks is None:
            raise BusError.of(ErrorCode.OVERLOADED, f"{inst.instance_id} has no KV blocks for "
                              f"{num_kv_tokens} tokens now", retryable=True)
        target = KVTarget(decode_worker_id=self.host.worker_id, decode_instance_id=inst.instance_id,
                          transfer_session=self.host.transfer.session if self.host.transfer else "",
                          block_offsets_bytes=engine.kv_block_global_offsets(blocks),
                          block_num_bytes=engine.kv_block_num_bytes)
        inst.reservations[req.request_id] = Reservation(req.request_id, tuple(blocks), num_kv_tokens, target,
                                                        time.monotonic())
        return target

    def _admit(self, run: RunAssignment, inst: ModelInstance) -> KVTarget:
        req = run.request
        reservation = inst.reservations.get(req.request_id)
        if reservation is None:
            raise BusError.of(ErrorCode.INVALID_REQUEST, f"no KV reservation for {req.request_id} on "
                              f"{inst.instance_id}")
        if run.moved is None:  # P/D: the prompt and the first token
            tokens = req.prompt_token_ids
            if len(tokens) != reservation.num_prompt_tokens + 1:
                raise BusError.of(ErrorCode.INVALID_REQUEST, "a hand-over carries the prompt and the first token")
            prompt, outputs = list(tokens[:-1]), [tokens[-1]]
            # the hand-over's dispatched_unix_ms is when P emitted the first token: the first of the outcome's tokens
            first_ms, next_seq = run.dispatched_unix_ms, 1
            num_on_time = int(first_ms <= req.ttft_deadline_unix_ms)
        else:  # a decode moving here (move_flow.py): the prompt, and where the stream stands
            prompt, outputs = list(req.prompt_token_ids), list(run.moved.output_token_ids)
            if len(prompt) + len(outputs) - 1 != reservation.num_prompt_tokens:
                raise BusError.of(ErrorCode.INVALID_REQUEST, "the move does not match its reservation")
            first_ms, next_seq = run.moved.first_token_unix_ms, run.moved.next_seq
            num_on_time = run.moved.num_on_time_tokens
        try:
            inst.engine.add_migrated_decode(req.request_id, prompt, outputs, req.sampling,
                                            list(reservation.block_ids))
        except ValueError as exc:
            raise BusError.of(ErrorCode.INVALID_REQUEST, str(exc)) from None
        del inst.reservations[req.request_id]
        track = RequestTrack(request_id=req.request_id, model=req.model, instance_id=inst.instance_id,
                             reply_subject=req.reply_subject, num_prompt_tokens=len(prompt),
                             started_unix_ms=_now_ms(), want_logprobs=req.sampling.logprobs,
                             next_seq=next_seq, num_output_tokens=len(outputs), first_token_unix_ms=first_ms,
                             ttft_deadline_unix_ms=req.ttft_deadline_unix_ms, tpot_slo_ms=req.tpot_slo_ms,
                             num_on_time_tokens=num_on_time)
        track.extra.update(phase="decode", request=req.model_copy(update={"prompt_token_ids": tuple(prompt)}))
        self.host.track(inst, track)
        self.host.wake_engines()
        return reservation.target

    def release_reservation(self, inst: ModelInstance, request_id: str) -> bool:
        if inst.reservations.pop(request_id, None) is None:
            return False
        if inst.engine is not None:
            inst.engine.abort(request_id)  # frees a reservation the hand-over never used
            self.host.wake_engines()
        return True

    def expire_reservations(self, inst: ModelInstance, now_monotonic_s: float, ttl_s: float = RESERVATION_TTL_S) -> int:
        stale = [rid for rid, r in inst.reservations.items() if now_monotonic_s - r.created_monotonic_s > ttl_s]
        for rid in stale:
            log.warning("%s: reservation of %s expired without a hand-over", self.host.worker_id, rid)
            self.release_reservation(inst, rid)
        return len(stale)


async def end_unanswered(host: PrefillDecodeHost, track: RequestTrack, engine: Any, message: str) -> None:
    """A hand-over that got no answer: the other side may have taken the request, and two streams must never
    interleave, so it ends here with a clear error and its held blocks go."""
    engine.release_kv_blocks(track.request_id)
    await host.send(track, [failure(track, ErrorInfo(code=ErrorCode.INSTANCE_FAILED, retryable=False,
                                                     message=message))])


def _now_ms() -> float:
    return time.time() * 1e3

"""Carries out lifecycle commands on a worker's instances: the route from the core (worker/core/lifecycle.py), each
step with its state transitions and timings, fallbacks when bringing an instance up fails.

The controller owns no I/O: the shell (`LifecycleHost`, the worker service) publishes events and registry records,
drains requests, and adds or parks engines in its engine loop. Device work runs in a thread.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, Protocol

from contracts import (
    ErrorCode,
    ErrorInfo,
    ForkSource,
    LifecycleAction,
    LifecycleCommand,
    LifecycleEvent,
    LifecycleReply,
    ModelState,
)

from ..core.lifecycle import TRANSITIONS, UP_STEPS, IllegalTransitionError, Step, Via, route
from .fork import pull_weights
from .host_offers import HostCopyOffers
from .instance import ModelInstance
from .verify import Reference, Verdict, verify

log = logging.getLogger("janus.worker.lifecycle")
S = ModelState


class LifecycleHost(Protocol):
    """What the controller needs from the worker shell."""

    def now_unix_ms(self) -> float: ...

    async def on_transition(self, inst: ModelInstance, event: LifecycleEvent) -> None:
        """Publish the event and write the instance's registry record (delete it at COLD)."""

    async def drain(self, inst: ModelInstance, min_drain_s: float) -> dict[str, float]:
        """Finish or hand back everything in flight on `inst` (already not ready in the registry); return early,
        failing nothing more, once `inst.resume_requested` is set."""

    async def refresh_record(self, inst: ModelInstance) -> None:
        """Write the instance's registry record again, unchanged (a no-op command re-asserts the truth)."""

    def start_serving(self, inst: ModelInstance) -> None: ...

    def stop_serving(self, inst: ModelInstance) -> None:
        """Park the engine (blocks until a step in progress ends) and take it out of the engine loop."""


class LifecycleFailed(Exception):
    def __init__(self, error: ErrorInfo) -> None:
        super().__init__(error.message)
        self.error = error


class DrainResumed(Exception):
    """A removal's drain stopped because the instance is wanted again: it admits again instead."""


class LifecycleController:
    def __init__(self, worker_id: str, host: LifecycleHost, make_instance: Callable[[LifecycleCommand],
                 ModelInstance], transfer: Any | None, *, min_drain_s: float = 30.0) -> None:
        self.worker_id = worker_id
        self.host = host
        self.make_instance = make_instance
        self.host_offers = HostCopyOffers(transfer)  # WARM host copies that peers may pull
        self.transfer = transfer
        self.min_drain_s = min_drain_s  # what a drain waits at least (a running request waits longer)
        self.instances: dict[str, ModelInstance] = {}

    @property
    def transfer(self) -> Any | None:
        """The worker's MooncakeTransfer (None: no transfer engine; set by the shell once it has started)."""
        return self._transfer

    @transfer.setter
    def transfer(self, transfer: Any | None) -> None:
        self._transfer = transfer
        self.host_offers.transfer = transfer

    # ---- commands -----------------------------------------------------------------------------------------------
    async def execute(self, cmd: LifecycleCommand) -> LifecycleReply:
        """Run one command to its end state. Never raises: failures are replies with ok=False and the reason."""
        if cmd.worker_id != self.worker_id:
            return self._refusal(cmd, S.COLD, ErrorCode.INVALID_REQUEST,
                                 f"command for worker {cmd.worker_id} reached {self.worker_id}")
        while True:
            inst = self.instances.get(cmd.instance_id)
            if inst is not None and inst.model != cmd.model:
                return self._refusal(cmd, inst.state, ErrorCode.INVALID_REQUEST,
                                     f"{cmd.instance_id} is an instance of {inst.model}, not {cmd.model}")
            if (inst is not None and cmd.action in (LifecycleAction.ACTIVATE, LifecycleAction.FORK_FROM)
                    and inst.state == S.DRAINING and inst.lock.locked()):
                inst.resume_requested.set()  # a removal is draining it: stop the drain, admit again
            if inst is None:
                if cmd.action not in (LifecycleAction.ACTIVATE, LifecycleAction.FORK_FROM, LifecycleAction.WARM):
                    return LifecycleReply(command_id=cmd.command_id, instance_id=cmd.instance_id, ok=True,
                                          state=S.COLD, detail="not resident: nothing to do")
                try:
                    inst = self.make_instance(cmd)
                except Exception as exc:  # noqa: BLE001 - an unknown model, a bad path: the reply says so
                    return self._refusal(cmd, S.COLD, ErrorCode.UNKNOWN_MODEL, str(exc))
                self.instances[cmd.instance_id] = inst
            async with inst.lock:
                live = self.instances.get(cmd.instance_id)
                if live is not inst:
                    if live is not None:
                        continue  # went cold and came back while we waited: act on the live one
                    self.instances[cmd.instance_id] = inst  # went cold while we waited: it is ours again
                reply = await self._execute_locked(inst, cmd)
                if inst.state == S.COLD and self.instances.get(cmd.instance_id) is inst:
                    del self.instances[cmd.instance_id]
                return reply

    async def _execute_locked(self, inst: ModelInstance, cmd: LifecycleCommand) -> LifecycleReply:
        timings: dict[str, float] = {}
        notes: list[str] = []
        try:
            source = cmd.fork_source
            # a remote host copy is no faster than this instance's own: it wakes from that instead
            has_fork_source = source is not None and not (source.kind == "host_copy" and inst.has_host_copy)
            plan = route(cmd.action, inst.state, has_host_copy=inst.has_host_copy, has_fork_source=has_fork_source)
            if cmd.action in (LifecycleAction.ACTIVATE, LifecycleAction.FORK_FROM) and inst.state != S.ACTIVE:
                inst.role, inst.pool_kind = cmd.role, cmd.pool
            if plan.is_noop:
                notes.append(f"already {inst.state.value}")
                if inst.state != S.COLD:
                    await self.host.refresh_record(inst)
            for step in plan.steps:
                if step in UP_STEPS:
                    await self._bring_up(inst, (step, *plan.fallbacks), cmd, timings, notes)
                else:
                    await self._run_step(inst, step, cmd, timings, notes)
            return LifecycleReply(command_id=cmd.command_id, instance_id=cmd.instance_id, ok=True,
                                  state=inst.state, detail="; ".join(notes), timings_ms=timings)
        except DrainResumed:
            inst.resume_requested.clear()
            self.host.start_serving(inst)
            await self._go(inst, S.ACTIVE, cmd, reason="wanted again while draining: admitting again", via="drain")
            message = f"{cmd.action.value} stopped: the instance was wanted again and resumed"
            return LifecycleReply(command_id=cmd.command_id, instance_id=cmd.instance_id, ok=False, state=inst.state,
                                  detail=message, timings_ms=timings,
                                  error=ErrorInfo(code=ErrorCode.CANCELLED, message=message))
        except LifecycleFailed as exc:
            return LifecycleReply(command_id=cmd.command_id, instance_id=cmd.instance_id, ok=False,
                                  state=inst.state, detail="; ".join(notes), timings_ms=timings, error=exc.error)
        except (IllegalTransitionError, ValueError) as exc:
            return self._refusal(cmd, inst.state, ErrorCode.ILLEGAL_TRANSITION, str(exc))
        except Exception as exc:  # noqa: BLE001 - a bug or a device error: the instance is failed, said so
            log.exception("%s: %s of %s failed", self.worker_id, cmd.action.value, cmd.instance_id)
            await self._fail(inst, f"{cmd.action.value} failed: {exc}", cmd)
            return LifecycleReply(command_id=cmd.command_id, instance_id=cmd.instance_id, ok=False,
                                  state=inst.state, detail="; ".join(notes), timings_ms=timings,
                                  error=ErrorInfo(code=ErrorCode.INTERNAL, message=str(exc)))

    def _refusal(self, cmd: LifecycleCommand, state: ModelState, code: ErrorCode, message: str) -> LifecycleReply:
        return LifecycleReply(command_id=cmd.command_id, instance_id=cmd.instance_id, ok=False, state=state,
                              detail=message, error=ErrorInfo(code=code, message=message))

    # ---- transitions --------------------------------------------------------------------------------------------
    async def _go(self, inst: ModelInstance, to: ModelState, cmd: LifecycleCommand | None, *, reason: str = "",
                  via: Via = "", timings: dict[str, float] | None = None) -> None:
        event = inst.lifecycle.transition(to, now_unix_ms=self.host.now_unix_ms(), reason=reason, via=via,
                                          timings_ms=timings, command_id=cmd.command_id if cmd else "")
        await self.host.on_transition(inst, event)

    async def _fail(self, inst: ModelInstance, why: str, cmd: LifecycleCommand | None) -> None:
        if inst.state != S.FAILED and S.FAILED in TRANSITIONS[inst.state]:
            if inst.engine is not None:
                await asyncio.to_thread(self.host.stop_serving, inst)
            await self._go(inst, S.FAILED, cmd, reason=why)

    # ---- steps --------------------------------------------------------------------------------------------------
    async def _run_step(self, inst: ModelInstance, step: Step, cmd: LifecycleCommand, timings: dict[str, float],
                        notes: list[str]) -> None:
        if step == Step.CLEANUP:
            await asyncio.to_thread(self.host.stop_serving, inst)
            timings["release_ms"] = await self._release_everything(inst)
            await self._go(inst, S.COLD, cmd, reason="cleared after a failure", via="release")
        elif step == Step.DRAIN:
            inst.resume_requested.clear()
            await self._go(inst, S.DRAINING, cmd, reason=f"{cmd.action.value} requested", via="drain")
            drained = await self.host.drain(inst, self.min_drain_s)
            timings.update(drained)
            if inst.resume_requested.is_set():
                raise DrainResumed()
            notes.append("drained")
        elif step == Step.RESUME:
            self.host.start_serving(inst)
            await self._go(inst, S.ACTIVE, cmd, reason="admitting again", via="drain")
        elif step == Step.TO_WARM:
            await asyncio.to_thread(self.host.stop_serving, inst)
            self.host_offers.withdraw(inst.instance_id)  # the snapshot rewrites (or replaces) the buffer
            copy = await asyncio.to_thread(inst.snapshot_to_host)
            timings["snapshot_ms"] = copy.copy_ms
            timings["release_ms"] = await asyncio.to_thread(inst.release_device_pages)
            notes.append(f"device -> host {_size(copy.num_bytes)} in {copy.copy_ms:.1f} ms")
            self._offer_host_copy(inst, notes)
            await self._go(inst, S.WARM, cmd, reason="weights kept in host memory", via="release",
                           timings={"snapshot_ms": copy.copy_ms, "release_ms": timings["release_ms"]})
        elif step == Step.RELEASE:
            await asyncio.to_thread(self.host.stop_serving, inst)
            timings["release_ms"] = await self._release_everything(inst)
            await self._go(inst, S.COLD, cmd, reason="pages and host copy released", via="release",
                           timings={"release_ms": timings["release_ms"]})
        elif step == Step.LOAD_HOST:
            await self._go(inst, S.LOADING, cmd, reason="cold -> warm", via="cold_load")
            try:
                if inst.engine is None:  # metadata and views only: the checkpoint goes to host memory, not here
                    timings["build_ms"] = await asyncio.to_thread(inst.build, False)
                timings.update(await asyncio.to_thread(inst.load_into_host))  # with the reference checksums
                timings["release_ms"] = await asyncio.to_thread(inst.release_device_pages)
            except Exception as exc:  # noqa: BLE001
                await self._release_everything(inst)
                await self._go(inst, S.COLD, cmd, reason=f"load failed: {exc}")
                raise LifecycleFailed(ErrorInfo(code=ErrorCode.INTERNAL, message=f"cold -> warm failed: {exc}",
                                                retryable=True)) from None
            self._offer_host_copy(inst, notes)
            await self._go(inst, S.WARM, cmd, reason="loaded into host memory", via="cold_load",
                           timings=dict(timings))
        else:
            raise ValueError(f"{step} is not a plain step")

    def _offer_host_copy(self, inst: ModelInstance, notes: list[str]) -> None:
        if self.host_offers.offer(inst) is not None:
            notes.append("host copy offered to peers")

    async def _release_everything(self, inst: ModelInstance) -> float:
        """Cold: withdraw the host copy's offer first (no peer may read the buffer once it is freed)."""
        self.host_offers.withdraw(inst.instance_id)
        return await asyncio.to_thread(inst.release_everything)

    async def _bring_up(self, inst: ModelInstance, attempts: tuple[Step, ...], cmd: LifecycleCommand,
                        timings: dict[str, float], notes: list[str]) -> None:
        """Try each way up in turn until one verifies; every failure is recorded (event reason, reply detail)."""
        tried: list[Step] = []
        for k, step in enumerate(attempts):
            if step in tried or (step == Step.WAKE and not inst.has_host_copy):
                continue
            tried.append(step)
            why = await self._attempt(inst, step, cmd, timings, notes)
            if why is None:
                started = time.perf_counter()
                await asyncio.to_thread(inst.record_segments)  # what forks and later restores check against
                timings["segments_ms"] = (time.perf_counter() - started) * 1e3
                self.host.start_serving(inst)
                await self._go(inst, S.ACTIVE, cmd, reason=f"verified after {step.value}", via=_via(step, cmd),
                               timings={k2: v for k2, v in timings.items() if k2 in ("checksum_ms", "canary_ms")})
                return
            notes.append(f"{step.value} failed: {why}")
            log.warning("%s: %s of %s failed: %s", self.worker_id, step.value, inst.instance_id, why)
            if inst.state in (S.COLD, S.WARM):  # the attempt gave up cleanly; nothing further can be tried
                break
        if inst.state not in (S.COLD, S.WARM, S.FAILED):
            await self._fail(inst, "; ".join(notes), cmd)
        raise LifecycleFailed(ErrorInfo(code=ErrorCode.INSTANCE_FAILED, retryable=True,
                                        message="could not bring the instance up: " + "; ".join(notes)))

    async def _attempt(self, inst: ModelInstance, step: Step, cmd: LifecycleCommand, timings: dict[str, float],
                       notes: list[str]) -> str | None:
        """One way up, ending in VERIFYING; returns None when verified, else why not."""
        entry = {Step.COLD_LOAD: S.LOADING, Step.WAKE: S.WAKING, Step.FORK: S.FORKING}[step]
        if step == Step.COLD_LOAD and inst.state == S.WARM:
            # warm without a host copy to wake from (an engine with no weights, or a copy lost): start from cold
            timings["release_ms"] = await self._release_everything(inst)
            await self._go(inst, S.COLD, cmd, reason="no host copy to wake from: loading from disk", via="release")
        if inst.state != entry:
            reason = f"{cmd.action.value}" if not notes else f"fallback after: {notes[-1]}"
            await self._go(inst, entry, cmd, reason=reason, via=_via(step, cmd))
        try:
            reference, phase_ms = await self._fill(inst, step, cmd.fork_source, notes)
        except Exception as exc:  # noqa: BLE001 - a failed way up is a fallback, not a crash
            timings.update({k: v for k, v in getattr(exc, "timings", {}).items()})
            if step == Step.WAKE:
                # the device has no room for the pages (or the copy broke): stay warm, a cold load would not fit
                await asyncio.to_thread(self.host.stop_serving, inst)
                await asyncio.to_thread(inst.release_device_pages)
                await self._go(inst, S.WARM, cmd, reason=f"wake failed: {exc}")
            elif step == Step.COLD_LOAD:
                await self._release_everything(inst)
                await self._go(inst, S.COLD, cmd, reason=f"cold load failed: {exc}")
            return str(exc)
        timings.update(phase_ms)
        await self._go(inst, S.VERIFYING, cmd, reason=f"{step.value} done", via=_via(step, cmd), timings=phase_ms)
        verdict: Verdict = await asyncio.to_thread(verify, inst.engine, reference)
        timings.update(verdict.timings_ms)
        if verdict.is_ok:
            return None
        return verdict.why

    async def _fill(self, inst: ModelInstance, step: Step, source: ForkSource | None,
                    notes: list[str]) -> tuple[Reference | None, dict[str, float]]:
        """Fill the weight pages one way; returns what they must verify against and the phase timings."""
        if step == Step.COLD_LOAD:
            if inst.engine is None:
                return None, {"load_ms": await asyncio.to_thread(inst.build)}  # the engine's own canary is fresh
            return inst.reference, {"load_ms": await asyncio.to_thread(inst.load_checkpoint)}
        if step == Step.WAKE:
            map_ms = await asyncio.to_thread(inst.ensure_awake)
            copy = await asyncio.to_thread(inst.restore_from_host)
            notes.append(f"host -> device {_size(copy.num_bytes)} in {copy.copy_ms:.1f} ms ({copy.gbps:.2f} GB/s)")
            return inst.reference, {"map_ms": map_ms, "copy_ms": copy.copy_ms}
        assert source is not None
        phase: dict[str, float] = {}
        if inst.engine is None:  # fresh weight pages, nothing read from disk: the pull fills them
            phase["build_ms"] = await asyncio.to_thread(inst.build, False)
        else:
            phase["prepare_ms"] = await asyncio.to_thread(inst.prepare_fresh_region)
        try:
            pulled = await asyncio.to_thread(pull_weights, inst.pages, inst.owner, source, self.transfer)
        except Exception as exc:
            exc.timings = phase  # type: ignore[attr-defined]
            raise
        phase["pull_ms"] = pulled.pull_ms
        origin = f"the host copy of {source.instance_id}" if source.kind == "host_copy" else source.instance_id
        notes.append(f"pulled {_size(pulled.num_bytes)} from {origin} in {pulled.pull_ms:.1f} ms "
                     f"({pulled.gbps:.2f} GB/s, {pulled.num_pieces} pieces)")
        return Reference.of_segments(source.segments), phase

    # ---- failures reported by the shell ---------------------------------------------------------------------------
    async def engine_failed(self, inst: ModelInstance, why: str) -> None:
        """The engine raised while stepping: the instance is FAILED (a later command cleans it up)."""
        await self._fail(inst, why, None)


_VIA: dict[Step, Via] = {Step.COLD_LOAD: "cold_load", Step.WAKE: "warm_copy", Step.FORK: "fork"}


def _via(step: Step, cmd: LifecycleCommand) -> Via:
    """How the weights came: a fork from a peer's host copy is a remote warm pull."""
    if step == Step.FORK and cmd.fork_source is not None and cmd.fork_source.kind == "host_copy":
        return "remote_warm"
    return _VIA[step]


def _size(num_bytes: int) -> str:
    return f"{num_bytes / (1 << 20):.1f} MiB"

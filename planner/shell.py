"""What the planner services share: the clock, worker liveness from heartbeats, the PLANS stream (each event
chained to the one before: planner/audit_chain.py), plan ids."""
from __future__ import annotations

import asyncio
import secrets
import time
import weakref
from dataclasses import dataclass, field

from nats.js.errors import APIError, NotFoundError
from pydantic import BaseModel

from contracts import WorkerHeartbeat, subjects
from contracts.plans import AuditEvent, audit_digest
from runtime import tracing
from runtime.bus import Bus
from runtime.jetstream import ensure_stream

from .core.cluster_view import worker_order
from .metrics import observe_event


def now_ms() -> float:
    """Wall-clock Unix ms: the one clock of every service."""
    return time.time() * 1000.0


class WorkerLiveness:
    """Which workers beat recently (by our receipt time), and their last heartbeats."""

    def __init__(self, timeout_ms: float) -> None:
        self.timeout_ms = timeout_ms
        self._seen_ms: dict[str, float] = {}
        self._heartbeats: dict[str, WorkerHeartbeat] = {}

    def on_heartbeat(self, hb: WorkerHeartbeat, at_ms: float) -> None:
        self._seen_ms[hb.worker_id] = at_ms
        self._heartbeats[hb.worker_id] = hb

    def alive(self, at_ms: float) -> list[str]:
        """Live workers, in natural order."""
        return sorted((w for w, t in self._seen_ms.items() if at_ms - t <= self.timeout_ms), key=worker_order)

    def heartbeats(self, at_ms: float) -> list[WorkerHeartbeat]:
        """The last heartbeat of every live worker."""
        return [self._heartbeats[w] for w in self.alive(at_ms)]


async def ensure_plans_stream(bus: Bus, max_age_s: float, num_replicas: int = 1) -> None:
    """PLANS, replicated as the cluster says (an R1 stream loses the audit trail with its node) and append-only:
    nobody may delete or purge an audit event, not even a service whose NATS user is allowed to update the stream."""
    await ensure_stream(bus.js, subjects.PLANS_STREAM, [subjects.PLAN_WILDCARD], max_age_s=max_age_s,
                        num_replicas=num_replicas, is_append_only=True)


def plan_id_prefix(kind: str, instance: str) -> str:
    """`<kind>-<instance>-<run>`: the run (start time, UTC to the second, and a random byte) keeps plan ids unique
    when a planner restarts and counts from 1 again (`janus audit --plan` showed two plans under one id)."""
    return f"{kind}-{instance}-{time.strftime('%y%m%d%H%M%S', time.gmtime())}{secrets.token_hex(1)}"


WRONG_LAST_SEQUENCE = 10071  # JetStream's error code: the Nats-Expected-Last-Subject-Sequence did not match
MAX_NUM_CHAIN_TRIES = 20


@dataclass
class _ChainTip:
    """The last event this process knows PLANS to hold on one subject: its stream sequence number and digest (seq
    None: ask the stream)."""

    seq: int | None = None
    digest: str = ""


@dataclass
class _Chains:
    tips: dict[str, _ChainTip] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one append at a time per process


_CHAINS: "weakref.WeakKeyDictionary[Bus, _Chains]" = weakref.WeakKeyDictionary()


async def _load_tip(js, subject: str, tip: _ChainTip) -> None:
    try:
        last = await js.get_last_msg(subjects.PLANS_STREAM, subject)
    except NotFoundError:  # none yet (or aged out: the chain starts again, the first event kept is taken on trust)
        tip.seq, tip.digest = 0, ""
        return
    tip.seq, tip.digest = last.seq, audit_digest(subject, last.data or b"")


async def publish_event(bus: Bus, subject: str, message: AuditEvent) -> None:
    """Into the PLANS stream, acknowledged (an audit event that is not stored is not an audit event), carrying the
    digest of the event before it on the same subject (one chain per subject: each has one writer, the steady
    planner, the elastic scaler, the reconciler, so appends never wait on another service). The server stores it
    only if that event is still the subject's last (Nats-Expected-Last-Subject-Sequence): two copies of a service
    appending at once cannot fork a chain; the loser re-reads the tip and tries again (its plain NATS subscribers
    may then see the event twice: they take plans idempotently, by plan id)."""
    chains = _CHAINS.setdefault(bus, _Chains())
    async with chains.lock:
        tip = chains.tips.setdefault(subject, _ChainTip())
        for _ in range(MAX_NUM_CHAIN_TRIES):
            if tip.seq is None:
                await _load_tip(bus.js, subject, tip)
            data = message.model_copy(update={"prev_event_sha256": tip.digest}).model_dump_json().encode()
            headers = tracing.inject_headers({}) | {"Nats-Expected-Last-Subject-Sequence": str(tip.seq)}
            try:
                ack = await bus.js.publish(subject, data, headers=headers)
            except APIError as exc:
                tip.seq = None  # another copy appended (or the stream was re-created): re-read the tip
                if exc.err_code == WRONG_LAST_SEQUENCE:
                    continue
                raise
            except BaseException:
                tip.seq = None  # stored or not, we cannot tell: re-read the tip next time
                raise
            tip.seq, tip.digest = ack.seq, audit_digest(subject, data)
            observe_event(message)
            return
    raise RuntimeError(f"could not append to {subjects.PLANS_STREAM} in {MAX_NUM_CHAIN_TRIES} tries (contention)")


async def last_plan(bus: Bus, subject: str, payload_type: type[BaseModel]) -> BaseModel | None:
    """The latest event on `subject` in PLANS (a restarted service picks up where the last one left)."""
    try:
        raw = await bus.js.get_last_msg(subjects.PLANS_STREAM, subject)
    except Exception:  # noqa: BLE001 - no such message (or no stream yet): nothing to recover
        return None
    try:
        return payload_type.model_validate_json(raw.data)
    except ValueError:
        return None

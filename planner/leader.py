"""Leader election on a NATS KV lease, the thin NATS part (the decisions: planner/core/lease.py).

One key per role in the `leases` bucket, whose entries expire `ttl_s` after their last write. A copy takes the lease
by creating the key (refused while it exists), keeps it by updating it with the revision it last wrote (refused once
someone else holds it), and lets it go on a graceful stop by deleting it (a standby then need not wait for the TTL).
The epoch of a term is the revision that won it: plans and lifecycle commands carry it, and workers refuse a command
older than the newest epoch they have seen (worker/core/fencing.py)."""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Awaitable, Callable

from nats.errors import Error as NatsError
from nats.js.errors import KeyWrongLastSequenceError

from contracts import subjects
from runtime.bus import Bus
from runtime.jetstream import ensure_kv
from runtime.service import cancel_and_wait

from .core.lease import Lease, LeasePolicy

log = logging.getLogger("janus.planner.leader")

WRITE_TIMEOUT_S = 0.5  # a lease write slower than this counts as unanswered (the lease is only 1.5 s long)


class Leadership:
    """Campaign for `role` as `holder`. `is_leader()` says whether this copy may act now, `epoch` the term it acts
    in; `on_change(is_leader)` is awaited when that flips (as the campaign notices it: gate every action on
    `is_leader()` itself)."""

    def __init__(self, bus: Bus, role: str, holder: str, *, policy: LeasePolicy = LeasePolicy(),
                 num_replicas: int = 1, on_change: Callable[[bool], Awaitable[None]] | None = None) -> None:
        self.bus = bus
        self.role = role
        self.holder = holder
        self.lease = Lease(policy)
        self.num_replicas = num_replicas
        self.on_change = on_change
        self._kv = None
        self._task: asyncio.Task | None = None
        self._was_leader = False

    @property
    def epoch(self) -> int:
        return self.lease.epoch

    def is_leader(self) -> bool:
        return self.lease.may_act(time.monotonic())

    async def start(self) -> None:
        self._kv = await ensure_kv(self.bus.js, subjects.LEASES_BUCKET, ttl_s=self.lease.policy.ttl_s,
                                   num_replicas=self.num_replicas)
        self._task = asyncio.create_task(self._campaign(), name=f"lease {self.role}")

    async def stop(self) -> None:
        """Stop campaigning; a leader deletes its key so that a standby takes over at its next poll."""
        await cancel_and_wait(self._task, what=f"lease {self.role}")
        if self.lease.holds and self._kv is not None:
            with contextlib.suppress(Exception):  # not deleted: it expires after the TTL anyway
                await asyncio.wait_for(self._kv.delete(self.role, last=self.lease.revision), WRITE_TIMEOUT_S)
        self.lease.on_lost()

    async def _campaign(self) -> None:
        value = json.dumps({"holder": self.holder}).encode()
        while True:
            await self._write_once(value)
            is_leader = self.is_leader()
            if is_leader != self._was_leader:
                self._was_leader = is_leader
                log.warning("%s %s: %s (epoch %d)", self.role, self.holder,
                            "leading" if is_leader else "standing by", self.epoch)
                if self.on_change is not None:
                    try:
                        await self.on_change(is_leader)
                    except Exception:  # noqa: BLE001 - the campaign must go on, or the lease is lost for good
                        log.exception("%s: on_change failed", self.role)
            await asyncio.sleep(self.lease.delay_s())

    async def _write_once(self, value: bytes) -> None:
        assert self._kv is not None
        step = self.lease.next_step()
        sent_at_s = time.monotonic()
        try:
            if step == "acquire":
                revision = await asyncio.wait_for(self._kv.create(self.role, value), WRITE_TIMEOUT_S)
                self.lease.on_won(sent_at_s, revision)
            else:
                revision = await asyncio.wait_for(self._kv.update(self.role, value, last=self.lease.revision),
                                                  WRITE_TIMEOUT_S)
                self.lease.on_refreshed(sent_at_s, revision)
        except KeyWrongLastSequenceError:
            if step == "refresh":  # taken by another copy after ours expired, or our last write landed unanswered
                self.lease.on_lost()
            await self._reclaim_own(value)
        except (NatsError, asyncio.TimeoutError, OSError) as exc:
            log.debug("%s: lease %s got no answer: %r", self.role, step, exc)
            self.lease.on_unreachable(time.monotonic())

    async def _reclaim_own(self, value: bytes) -> None:
        """The key exists: if it is ours (a write of ours that landed after we stopped waiting for its answer, as
        when this process stalled past WRITE_TIMEOUT_S), take it back at once with an update conditional on its
        revision, instead of standing by until our own entry expires. Another holder's key is left alone."""
        assert self._kv is not None
        sent_at_s = time.monotonic()
        try:
            entry = await asyncio.wait_for(self._kv.get(self.role), WRITE_TIMEOUT_S)
            if entry.value is None or json.loads(entry.value).get("holder") != self.holder:
                return
            revision = await asyncio.wait_for(self._kv.update(self.role, value, last=entry.revision),
                                              WRITE_TIMEOUT_S)
        except (NatsError, asyncio.TimeoutError, OSError, ValueError) as exc:  # gone, changed, or unanswered
            log.debug("%s: reclaiming our own lease failed: %r", self.role, exc)
            return
        self.lease.on_won(sent_at_s, revision)


class Elected:
    """A planner service of which several copies run and only the leader acts: its role is its service name, its
    holder its instance. The service calls `campaign` in start, `end_campaign` in stop, gates every action on
    `is_leader()`, and implements `_on_leadership(is_leader)`."""

    leadership: Leadership | None = None

    def is_leader(self) -> bool:
        return self.leadership is not None and self.leadership.is_leader()

    async def campaign(self) -> None:
        self.leadership = Leadership(self.bus, self.name, self.instance, on_change=self._on_leadership,
                                     num_replicas=self.cluster.jetstream_replicas)
        await self.leadership.start()

    async def end_campaign(self) -> None:
        if self.leadership is not None:
            await self.leadership.stop()

    async def _on_leadership(self, is_leader: bool) -> None:
        raise NotImplementedError


def leadership_detail(leadership: Leadership | None) -> dict[str, str]:
    """What a planner's health reply says about its term."""
    if leadership is None:
        return {"leader": "no", "epoch": "0"}
    return {"leader": "yes" if leadership.is_leader() else "no", "epoch": str(leadership.epoch)}

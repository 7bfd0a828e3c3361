"""Warm copies offered to other workers: a WARM instance's pinned host copy, registered with this worker's transfer
engine, so that a worker on another host can pull the model from it over the network instead of reading the
checkpoint from disk (a remote warm pull; docs/lifecycle.md).

The heartbeat advertises each offer (`InstanceStatus.host_copy`) while its instance is WARM; the reconciler's
cluster view turns it into a `ForkSource` of kind "host_copy" when the model has no live replica. An offer is
withdrawn (unregistered) before its buffer is rewritten or freed, so a late pull fails cleanly and its target
falls back to a cold load.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any, Callable

from contracts import HostCopy, WeightSegment

from .host_copy import HostWeights
from .instance import ModelInstance

log = logging.getLogger("janus.worker.lifecycle")

# A withdrawn copy's memory outlives its offer by this long: a peer's read already under way when the copy was
# unregistered must not land on memory handed back to the system (a large buffer is unmapped when freed). A pull
# is given up after the command deadline (60 s by default), so a read is over by then.
RETIRE_GRACE_S = 60.0


class HostCopyOffers:
    """The host copies this worker offers, by instance id. `transfer` is the worker's MooncakeTransfer (None: no
    transfer engine here, nothing is offered)."""

    def __init__(self, transfer: Any | None, *, clock: Callable[[], float] = time.monotonic,
                 retire_grace_s: float = RETIRE_GRACE_S) -> None:
        self.transfer = transfer
        self._clock = clock
        self._retire_grace_s = retire_grace_s
        # instance id -> (registered address, what peers see, the buffer)
        self._offers: dict[str, tuple[int, HostCopy, HostWeights]] = {}
        self._retired: deque[tuple[float, HostWeights]] = deque()  # withdrawn buffers kept alive until the grace

    def offer(self, inst: ModelInstance) -> HostCopy | None:
        """Register the instance's host copy and describe it for the heartbeat: its byte ranges with the reference
        checksums (what the pulling worker verifies against). None when there is nothing verifiable to offer."""
        self.withdraw(inst.instance_id)
        transfer, host, reference = self.transfer, inst.host, inst.reference
        if transfer is None or host is None or reference is None or not reference.has_checksums:
            return None
        base = transfer.base_address
        if base is None or sum(reference.lengths) != host.num_bytes:
            return None
        try:
            transfer.register(host.data_ptr, host.num_bytes)
        except Exception as exc:  # noqa: BLE001 - an offer is an optimisation; the instance is warm regardless
            log.warning("%s: host copy not offered to peers: %s", inst.instance_id, exc)
            return None
        segments, position = [], 0
        for num_bytes, checksum in zip(reference.lengths, reference.checksums):
            segments.append(WeightSegment(global_offset_bytes=position, num_bytes=num_bytes, checksum=checksum))
            position += num_bytes
        copy = HostCopy(base_offset_bytes=host.data_ptr - base, segments=tuple(segments))
        self._offers[inst.instance_id] = (host.data_ptr, copy, host)
        return copy

    def withdraw(self, instance_id: str) -> None:
        """Stop offering the instance's host copy (before it is rewritten or freed); its memory is kept for the
        grace period in case a read is under way."""
        now = self._purge()
        offer = self._offers.pop(instance_id, None)
        if offer is None:
            return
        if self.transfer is not None:
            self.transfer.unregister(offer[0])
        self._retired.append((now, offer[2]))

    def _purge(self) -> float:
        """Let go of withdrawn buffers past their grace; returns the time now."""
        now = self._clock()
        while self._retired and now - self._retired[0][0] >= self._retire_grace_s:
            self._retired.popleft()
        return now

    @property
    def num_retired(self) -> int:
        """Withdrawn copies whose memory is still held."""
        return len(self._retired)

    def offered(self) -> dict[str, HostCopy]:
        """What the heartbeat advertises: instance id -> its host copy. (Each heartbeat also lets go of withdrawn
        buffers past their grace.)"""
        self._purge()
        return {instance_id: copy for instance_id, (_, copy, _) in self._offers.items()}

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
from typing import Any

from contracts import HostCopy, WeightSegment

from .instance import ModelInstance

log = logging.getLogger("janus.worker.lifecycle")


class HostCopyOffers:
    """The host copies this worker offers, by instance id. `transfer` is the worker's MooncakeTransfer (None: no
    transfer engine here, nothing is offered)."""

    def __init__(self, transfer: Any | None) -> None:
        self.transfer = transfer
        self._offers: dict[str, tuple[int, HostCopy]] = {}  # instance id -> (registered address, what peers see)

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
        self._offers[inst.instance_id] = (host.data_ptr, copy)
        return copy

    def withdraw(self, instance_id: str) -> None:
        """Stop offering the instance's host copy (before it is rewritten or freed)."""
        offer = self._offers.pop(instance_id, None)
        if offer is not None and self.transfer is not None:
            self.transfer.unregister(offer[0])

    def offered(self) -> dict[str, HostCopy]:
        """What the heartbeat advertises: instance id -> its host copy."""
        return {instance_id: copy for instance_id, (_, copy) in self._offers.items()}

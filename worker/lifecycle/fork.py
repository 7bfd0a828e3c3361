"""Fork: fill a prepared weight region with a live replica's weight pages, read by global offset through the
transfer engine. The source does nothing: its transfer engine serves the reads on its own threads while its engine
keeps stepping. The source may also be a WARM instance's registered host copy on another worker (a remote warm
pull): the same reads, at the copy's offset from that worker's transfer base.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from contracts import ForkSource

from .segments import pair_segments


class ForkError(RuntimeError):
    """The pull could not be done (source gone, layouts differ, transfer failed): the caller falls back."""


@dataclass(frozen=True)
class PullReport:
    num_bytes: int
    num_pieces: int
    pull_ms: float

    @property
    def gbps(self) -> float:
        return self.num_bytes / (self.pull_ms * 1e6) if self.pull_ms > 0 else float("inf")


def pull_weights(pages: Any, owner: str, source: ForkSource, transfer: Any | None) -> PullReport:
    """Copy the source's weight segments onto the owner's weight pages (both in the order of the weight stream).
    `pages` is this worker's page pool; `transfer` its MooncakeTransfer (None: only a source on this worker)."""
    if not source.segments:
        raise ForkError(f"the fork source {source.instance_id} lists no weight segments")
    local = pages.weight_segments(owner)
    remote = [(source.base_offset_bytes + s.global_offset_bytes, s.num_bytes) for s in source.segments]
    try:
        pieces = pair_segments(local, remote)
    except ValueError as exc:
        raise ForkError(str(exc)) from None
    started = time.perf_counter()
    is_local = transfer is None or source.transfer_session == transfer.session
    if is_local and source.kind == "host_copy":
        raise ForkError(f"the host copy of {source.instance_id} is on this worker: wake that instance instead")
    if is_local:
        if transfer is None and source.transfer_session:
            raise ForkError(f"no transfer engine here to reach {source.transfer_session}")
        for lo, ro, n in pieces:  # a replica on this very device: a device-to-device copy in the pool
            pages.global_view(lo, n).copy_(pages.global_view(ro, n))
    else:
        base = pages.global_region.base_address
        try:
            transfer.read(source.transfer_session, [base + lo for lo, _, _ in pieces], [ro for _, ro, _ in pieces],
                          [n for _, _, n in pieces])
        except Exception as exc:  # noqa: BLE001 - any transfer failure means: fall back
            raise ForkError(f"pull from {source.transfer_session} failed: {exc}") from None
    return PullReport(sum(n for _, _, n in pieces), len(pieces), (time.perf_counter() - started) * 1e3)

"""Model lifecycle on a worker: states, commands (reconciler -> worker), and transition events."""
from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field

from .base import ErrorInfo, Message


class ModelState(StrEnum):
    """Steady states (COLD, WARM, ACTIVE) and the transitions between them. The transition table itself lives in
    one module of the worker core."""

    COLD = "cold"  # only the model's description; weights on disk
    LOADING = "loading"  # disk -> host or device
    WARM = "warm"  # weights in pinned host memory, runtime metadata kept
    WAKING = "waking"  # host -> device copy into fresh pages
    FORKING = "forking"  # device -> device pull from a live replica
    VERIFYING = "verifying"  # checksums and a canary step before ready
    ACTIVE = "active"  # weights in device pages, serving
    DRAINING = "draining"  # no new admissions; finishing what is in flight
    FAILED = "failed"


class InstanceRole(StrEnum):
    COLOCATED = "colocated"  # prefill and decode on one instance (steady pool)
    PREFILL = "prefill"
    DECODE = "decode"


class Pool(StrEnum):
    STEADY = "steady"
    ELASTIC = "elastic"


class LifecycleAction(StrEnum):
    ACTIVATE = "activate"  # to ACTIVE by the fastest way the worker has (warm copy, else cold load)
    FORK_FROM = "fork_from"  # to ACTIVE by pulling a live replica's weight pages
    WARM = "warm"  # to WARM (drains first when active)
    COLD = "cold"  # to COLD (drains first when active)
    DRAIN = "drain"  # stop admitting and finish in-flight work, stay resident


class WeightSegment(Message):
    """A contiguous run of a model's weight pages in the worker's global virtual region."""

    global_offset_bytes: int = Field(ge=0)
    num_bytes: int = Field(gt=0)
    checksum: str = ""


class HostCopy(Message):
    """A WARM instance's weights in its worker's pinned host memory, registered with the worker's transfer engine so
    that a peer can pull them (a warm copy on another host)."""

    base_offset_bytes: int = Field(description="where the copy starts, from the worker's transfer base (the "
                                               "global region's address): signed, host memory may lie below it")
    segments: tuple[WeightSegment, ...] = Field(description="byte ranges of the copy, offsets from its start, in "
                                                            "weight-stream order, each with its checksum")


class ForkSource(Message):
    """Where a fork pulls the weights from: a live replica's device pages (kind "replica"), or a WARM instance's
    registered host copy on another worker (kind "host_copy", a remote warm pull)."""

    worker_id: str
    instance_id: str
    transfer_session: str = Field(description="the source's Mooncake session name (host:port)")
    segments: tuple[WeightSegment, ...]
    kind: Literal["replica", "host_copy"] = "replica"
    base_offset_bytes: int = Field(default=0, description="added to every segment's offset (a host copy's place "
                                                          "relative to the transfer base; 0 for a replica)")


class LifecycleCommand(Message):
    """Request/reply on janus.worker.<worker>.cmd. Idempotent by `command_id`: a repeat gets the same answer."""

    command_id: str = Field(min_length=1)
    worker_id: str
    model: str
    instance_id: str
    action: LifecycleAction
    role: InstanceRole = InstanceRole.COLOCATED
    pool: Pool = Pool.STEADY
    fork_source: ForkSource | None = None
    peer_worker_ids: tuple[str, ...] = Field(default=(), description="the other devices of a tensor-parallel "
                                             "group: this worker leads the instance across them")
    plan_id: str = ""
    issued_unix_ms: float
    # fencing: the reconciler leader's term and who it is; a worker refuses a command older than the newest epoch it
    # has seen (ErrorCode.STALE_EPOCH), so a reconciler that lost its lease cannot act (docs/operations.md)
    epoch: int = Field(default=0, ge=0, description="the reconciler leader's term (planner/leader.py)")
    issued_by: str = Field(default="", description="the reconciler instance that sent it")
    deadline_ms: float = Field(default=60_000, gt=0, description="the worker gives up after this long")


class LifecycleReply(Message):
    command_id: str
    instance_id: str
    ok: bool
    state: ModelState
    detail: str = ""
    timings_ms: dict[str, float] = Field(default_factory=dict)
    error: ErrorInfo | None = None


class LifecycleEvent(Message):
    """One state transition, with how long it took and how (published on janus.event.lifecycle)."""

    worker_id: str
    model: str
    instance_id: str
    from_state: ModelState
    to_state: ModelState
    reason: str = ""
    via: Literal["", "warm_copy", "cold_load", "fork", "remote_warm", "drain", "release"] = ""
    duration_ms: float = Field(default=0.0, ge=0)
    timings_ms: dict[str, float] = Field(default_factory=dict)
    unix_ms: float
    command_id: str = ""

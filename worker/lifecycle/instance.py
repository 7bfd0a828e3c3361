"""One model instance on a worker: its lifecycle state, its engine, its warm host copy, and the device operations
that move its weights. The operations block (they copy bytes and call the page pool); the controller runs them in
a thread, always with the engine parked (not stepping), and does the state transitions around them.

The engine's views never move: the page pool (worker/xtensor) keeps an owner's virtual ranges across sleep and wake,
so Warm -> Active maps fresh pages under the same tensors and copies the bytes in; nothing is rebound.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from contracts import InstanceRole, KVTarget, ModelState, Pool, WeightSegment

from ..core.lifecycle import InstanceLifecycle
from ..core.streaming import RequestTrack
from .checksums import segment_checksums
from .host_copy import CopyReport, HostWeights
from .verify import Reference, checksums_over, has_weights

# (model dir, owner, load_weights) -> engine whose weight region is in the pool: filled from the checkpoint, or
# (load_weights=False) left for the caller to fill by a pull or a host copy, with no disk read
EngineBuilder = Callable[[Path, str, bool], Any]


@dataclass
class Reservation:
    """P/D, decode side: KV blocks this instance set aside for a request another instance prefills."""

    request_id: str
    block_ids: tuple[int, ...]
    num_prompt_tokens: int
    target: KVTarget
    created_monotonic_s: float


@dataclass
class ModelInstance:
    worker_id: str
    model: str
    instance_id: str
    role: InstanceRole
    pool_kind: Pool
    model_dir: Path
    pages: Any  # the worker's page pool (worker.xtensor.XTensor)
    build_engine: EngineBuilder
    copy_options: dict = field(default_factory=dict)
    lifecycle: InstanceLifecycle = field(init=False)
    engine: Any = None
    host: HostWeights | None = None
    segments: tuple[WeightSegment, ...] = ()  # verified weight segments with checksums, while ACTIVE
    reference: Reference | None = None  # checksums of the last verified weights (what a warm restore must match)
    in_flight: dict[str, RequestTrack] = field(default_factory=dict)
    reservations: dict[str, Reservation] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one lifecycle operation at a time
    # set by an activation that arrives while a removal drains this instance: the drain stops and the instance
    # admits again (the reconciler resumes a draining instance that is wanted again)
    resume_requested: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.lifecycle = InstanceLifecycle(self.worker_id, self.model, self.instance_id)

    @property
    def state(self) -> ModelState:
        return self.lifecycle.state

    @property
    def is_ready(self) -> bool:
        """Verified and serving: the only state in which the registry says ready and requests are admitted."""
        return self.state == ModelState.ACTIVE and self.engine is not None

    @property
    def owner(self) -> str:
        return self.instance_id  # the instance's name in the page pool

    @property
    def has_host_copy(self) -> bool:
        return self.host is not None

    @property
    def weight_num_bytes(self) -> int:
        return self.engine.weight_buffer.numel() if has_weights(self.engine) else 0

    def _is_pool_owner(self) -> bool:
        return self.owner in self.pages.owners()

    # ---- device operations (blocking; engine parked) ------------------------------------------------------------
    def build(self, load_weights: bool = True) -> float:
        """Cold -> device: a new engine with fresh weight pages, which it fills from the checkpoint, or (load_weights
        False: a fork target, a load into host memory) leaves for the caller to fill, without reading the disk.
        Returns ms."""
        started = time.perf_counter()
        self.engine = self.build_engine(self.model_dir, self.owner, load_weights)
        return _ms_since(started)

    def load_checkpoint(self) -> float:
        """Cold load into the existing engine's current weight pages (after a failed fork or restore)."""
        from worker.engine.weights import load_checkpoint

        started = time.perf_counter()
        self.ensure_awake()
        if has_weights(self.engine):
            load_checkpoint(self.model_dir, self.engine.weight_layout, self.engine.weight_buffer)
            if self.engine.reference_canary is None:  # built without weights: the disk is the truth
                self.engine.record_reference_canary()
        return _ms_since(started)

    def load_into_host(self) -> dict[str, float]:
        """Cold -> Warm: read the checkpoint straight into the (pinned) host buffer, and checksum it: the reference
        a later wake must match. The engine's device weight pages are never written. Returns ms per phase."""
        from worker.engine.weights import load_checkpoint

        if not has_weights(self.engine):
            return {}
        started = time.perf_counter()
        if self.host is None or self.host.num_bytes != self.weight_num_bytes:
            self.host = HostWeights.allocate(self.weight_num_bytes, pin=self.engine.device.type == "cuda")
        load_checkpoint(self.model_dir, self.engine.weight_layout, self.host.buffer)
        load_ms = _ms_since(started)
        started = time.perf_counter()
        lengths = [n for _, n in self.pages.weight_segments(self.owner)] or [self.host.num_bytes]
        self.reference = Reference(tuple(lengths), tuple(segment_checksums(self.host.buffer, lengths)))
        return {"load_ms": load_ms, "checksum_ms": _ms_since(started)}

    def ensure_awake(self) -> float:
        """Fresh pages under the views of an owner whose pages were released (Warm). Returns ms."""
        started = time.perf_counter()
        if has_weights(self.engine) and self.pages.is_asleep(self.owner):
            self.pages.wake(self.owner)
        return _ms_since(started)

    def prepare_fresh_region(self) -> float:
        """A fork target's weight region: freshly allocated pages (contents undefined) under the engine's view."""
        started = time.perf_counter()
        if not has_weights(self.engine):
            return 0.0
        if self.pages.is_asleep(self.owner):
            self.pages.wake(self.owner)
        else:
            num_bytes = self.engine.weight_buffer.numel()
            self.pages.release_weights(self.owner)
            buffer = self.pages.allocate_weights(self.owner, num_bytes, str(self.engine.device))
            self.engine.bind_weights(buffer)
        return _ms_since(started)

    def snapshot_to_host(self) -> CopyReport:
        """Device -> pinned host (kept across wakes: a second Active -> Warm of the same weights is free)."""
        if not has_weights(self.engine):
            return CopyReport(0, 0.0)
        if self.host is None or self.host.num_bytes != self.weight_num_bytes:
            self.host = HostWeights.allocate(self.weight_num_bytes, pin=self.engine.device.type == "cuda")
        return self.host.snapshot_from(self.engine.weight_buffer, **self.copy_options)

    def restore_from_host(self) -> CopyReport:
        if self.host is None:
            raise RuntimeError(f"{self.instance_id} has no host copy to restore from")
        return self.host.restore_into(self.engine.weight_buffer, **self.copy_options)

    def release_device_pages(self) -> float:
        """Warm: weight and KV pages go back to the pool; views, engine metadata and the host copy stay."""
        started = time.perf_counter()
        if has_weights(self.engine) and not self.pages.is_asleep(self.owner):
            drop_prefix_cache = getattr(self.engine, "drop_prefix_cache", None)
            if drop_prefix_cache is not None:  # the KV pages' contents are lost: no cached prefix survives
                drop_prefix_cache()
            self.pages.sleep(self.owner)
        self.segments = ()
        return _ms_since(started)

    def release_everything(self) -> float:
        """Cold: the engine, its views and pages, and the host copy are gone."""
        started = time.perf_counter()
        self.engine = None
        self.host = None
        self.segments = ()
        self.reference = None
        if self._is_pool_owner():
            self.pages.remove_owner(self.owner)
        return _ms_since(started)

    def record_segments(self) -> tuple[WeightSegment, ...]:
        """The verified weights' page runs with their checksums: what the heartbeat offers to fork from, and the
        reference a later warm restore must match."""
        if not has_weights(self.engine):
            self.segments, self.reference = (), None
            return ()
        runs = self.pages.weight_segments(self.owner)
        sums = checksums_over(self.engine, [n for _, n in runs])
        self.segments = tuple(WeightSegment(global_offset_bytes=o, num_bytes=n, checksum=c)
                              for (o, n), c in zip(runs, sums))
        self.reference = Reference.of_segments(self.segments)
        return self.segments


def _ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1e3

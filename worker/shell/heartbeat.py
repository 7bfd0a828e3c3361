"""What a worker's heartbeat says: its device, the page pool's counters per model, each instance's state, load,
weight segments with checksums (while active) or the host copy offered to peers (while warm), and its transfer
session. Built from plain readings; no I/O."""
from __future__ import annotations

import platform
from typing import Any, Iterable, Mapping

from contracts import DeviceInfo, HostCopy, InstanceStatus, ModelState, PageCounters, WorkerHeartbeat

from ..lifecycle.instance import ModelInstance


def read_stats(instances: dict[str, ModelInstance]) -> dict[str, Any]:
    """Each engine's stats by instance id, read once: stats() takes the engine's lock (bookkeeping only: safe while
    parked)."""
    return {iid: inst.engine.stats() for iid, inst in list(instances.items()) if inst.engine is not None}


def instance_status(inst: ModelInstance, host_copy: HostCopy | None = None, st: Any = None) -> InstanceStatus:
    """`st`: the engine's stats (read_stats); None for an instance without an engine."""
    return InstanceStatus(
        instance_id=inst.instance_id, model=inst.model, role=inst.role, pool=inst.pool_kind, state=inst.state,
        num_waiting=getattr(st, "num_waiting", 0), num_running=getattr(st, "num_running", 0),
        num_kv_blocks_used=max(0, getattr(st, "num_kv_blocks_used", 0)),
        num_kv_blocks_free=getattr(st, "num_kv_blocks_free", 0),
        ttft_ms_p50=getattr(st, "ttft_ms_p50", None), tpot_ms_p50=getattr(st, "tpot_ms_p50", None),
        prefill_tokens_per_s=getattr(st, "prefill_tokens_per_s", None),
        decode_tokens_per_s=getattr(st, "decode_tokens_per_s", None),
        # offered to fork from only while verified and serving
        weight_segments=inst.segments if inst.state == ModelState.ACTIVE else (),
        # and a warm copy, for a peer to pull, while the instance is only warm
        host_copy=host_copy if inst.state == ModelState.WARM else None)


def page_counters_by_model(counters: PageCounters, instances: dict[str, ModelInstance]) -> PageCounters:
    """The pool counts pages per owner (an instance id); the heartbeat counts them per model."""
    by_model: dict[str, dict[str, int]] = {}
    for owner, kinds in counters.pages_by_model.items():
        inst = instances.get(owner)
        merged = by_model.setdefault(inst.model if inst is not None else owner, {})
        for kind, count in kinds.items():
            merged[kind] = merged.get(kind, 0) + count
    return counters.model_copy(update={"pages_by_model": by_model})


def device_info(pages: Any) -> DeviceInfo:
    kind = str(pages.device).split(":")[0]
    name = platform.processor() or platform.machine()
    if kind == "cuda":
        import torch

        name = torch.cuda.get_device_name(pages.device)
    return DeviceInfo(kind=kind, name=name, hbm_bytes=pages.num_pages * pages.page_size_bytes,
                      device=str(pages.device))


def build_heartbeat(worker_id: str, seq: int, now_unix_ms: float, pages: Any, instances: dict[str, ModelInstance],
                    transfer_session: str, is_draining: bool,
                    host_copies: Mapping[str, HostCopy] | None = None,
                    stats: Mapping[str, Any] | None = None) -> WorkerHeartbeat:
    """`host_copies`: the host copies offered to peers, by instance id (HostCopyOffers). `stats`: the engines' stats
    by instance id (read_stats), when the caller needs them too; read here otherwise."""
    offered = host_copies or {}
    stats = read_stats(instances) if stats is None else stats
    statuses: Iterable[InstanceStatus] = (instance_status(i, offered.get(i.instance_id), stats.get(i.instance_id))
                                          for i in list(instances.values()))
    return WorkerHeartbeat(worker_id=worker_id, seq=seq, sent_unix_ms=now_unix_ms, device=device_info(pages),
                           pages=page_counters_by_model(pages.counters(), instances), instances=tuple(statuses),
                           transfer_session=transfer_session, is_draining=is_draining)

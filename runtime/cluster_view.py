"""What the cluster says about itself, gathered from the bus: registry records, worker heartbeats, model load
windows, lifecycle events and recent plans. `janus status` and the gateway's status page read it.

`snapshot()` is a pure function of what was gathered, so it is tested without a bus.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from dataclasses import dataclass, field

from contracts import (
    ElasticPlan,
    InstanceRecord,
    LifecycleEvent,
    ModelLoadWindow,
    PlanAction,
    SteadyPlan,
    WorkerHeartbeat,
    subjects,
)

MAX_NUM_RECENT = 20


@dataclass
class ClusterView:
    records: dict[str, InstanceRecord] = field(default_factory=dict)
    heartbeats: dict[str, WorkerHeartbeat] = field(default_factory=dict)
    loads: dict[str, ModelLoadWindow] = field(default_factory=dict)
    plans: deque = field(default_factory=lambda: deque(maxlen=MAX_NUM_RECENT))
    lifecycle: deque = field(default_factory=lambda: deque(maxlen=MAX_NUM_RECENT))
    _watcher: object = None
    _subs: list = field(default_factory=list)

    # --- gathering ---
    async def attach(self, bus, *, history: bool = True) -> None:
        """Subscribe to telemetry, lifecycle events and plans, and watch the registry."""

        async def on_hb(hb: WorkerHeartbeat, env) -> None:
            self.heartbeats[hb.worker_id] = hb

        async def on_load(w: ModelLoadWindow, env) -> None:
            self.loads[w.model] = w

        async def on_event(ev: LifecycleEvent, env) -> None:
            self.lifecycle.append(ev)

        async def on_plan(plan, env) -> None:
            self.plans.append(plan)

        self._subs += [
            await bus.subscribe(subjects.WORKER_TELEMETRY_WILDCARD, WorkerHeartbeat, on_hb, traced=False),
            await bus.subscribe(subjects.MODEL_TELEMETRY_WILDCARD, ModelLoadWindow, on_load, traced=False),
            await bus.subscribe(subjects.LIFECYCLE_EVENT, LifecycleEvent, on_event, traced=False),
            await bus.subscribe(subjects.PLAN_STEADY, SteadyPlan, on_plan, traced=False),
            await bus.subscribe(subjects.PLAN_ELASTIC, ElasticPlan, on_plan, traced=False),
            await bus.subscribe(subjects.PLAN_ACTION, PlanAction, on_plan, traced=False),
        ]
        self._watch_task = asyncio.create_task(self._watch(bus.js))
        if history:
            await self._load_last_plans(bus)

    async def _watch(self, js) -> None:
        # The readers' NATS users (gateway, operator) may not create the bucket: wait for a worker or the dispatcher
        # to, in the background, so that a view attached first (or to an empty cluster) still starts.
        from runtime.jetstream import open_kv, watch_all

        kv = await open_kv(js, subjects.INSTANCES_BUCKET)
        self._watcher = await watch_all(kv)
        async for entry in self._watcher:
            if entry is None:
                continue
            if entry.operation in ("DEL", "PURGE") or not entry.value:
                self.records.pop(entry.key, None)
                continue
            with contextlib.suppress(ValueError):
                self.records[entry.key] = InstanceRecord.model_validate_json(entry.value)

    async def _load_last_plans(self, bus) -> None:
        """The latest plan of each kind from the PLANS stream, so a fresh view is not empty for 30 s."""
        for subject, tp in ((subjects.PLAN_STEADY, SteadyPlan), (subjects.PLAN_ELASTIC, ElasticPlan)):
            with contextlib.suppress(Exception):
                msg = await bus.js.get_last_msg(subjects.PLANS_STREAM, subject)
                self.plans.append(tp.model_validate_json(msg.data))

    async def detach(self) -> None:
        task = getattr(self, "_watch_task", None)
        if task is not None:  # first, so that no watcher starts after the one stopped below
            task.cancel()
            await asyncio.wait({task})
        if self._watcher is not None:
            with contextlib.suppress(Exception):
                await self._watcher.stop()
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self._subs.clear()

    # --- reading ---
    def snapshot(self, now_unix_ms: float | None = None) -> dict:
        return build_snapshot(self.records.values(), self.heartbeats.values(), self.loads.values(), list(self.plans),
                              list(self.lifecycle), time.time() * 1e3 if now_unix_ms is None else now_unix_ms)


def build_snapshot(records, heartbeats, loads, plans, lifecycle, now_unix_ms: float) -> dict:
    """Devices, instances, models and plans as plain data (what `janus status --json` prints)."""
    devices = []
    statuses = {}
    for hb in sorted(heartbeats, key=lambda h: h.worker_id):
        pages = hb.pages
        devices.append({
            "worker_id": hb.worker_id, "device": hb.device.kind, "device_name": hb.device.name,
            "age_s": round(max(0.0, now_unix_ms - hb.sent_unix_ms) / 1e3, 2),
            "pages_total": pages.num_pages_total, "pages_free": pages.num_pages_free,
            "page_size_bytes": pages.page_size_bytes, "fragmentation": pages.fragmentation,
            "pages_by_model": pages.pages_by_model, "is_draining": hb.is_draining,
        })
        for st in hb.instances:
            statuses[st.instance_id] = st
    instances = []
    for rec in sorted(records, key=lambda r: (r.model, r.worker_id, r.instance_id)):
        st = statuses.get(rec.instance_id)
        instances.append({
            "instance_id": rec.instance_id, "model": rec.model, "worker_id": rec.worker_id,
            "role": rec.role.value, "pool": rec.pool.value, "state": (st.state if st else rec.state).value,
            "is_ready": rec.is_ready, "num_waiting": st.num_waiting if st else 0,
            "num_running": st.num_running if st else 0,
            "ttft_ms_p50": st.ttft_ms_p50 if st else None, "tpot_ms_p50": st.tpot_ms_p50 if st else None,
        })
    models: dict[str, dict] = {}
    for inst in instances:
        m = models.setdefault(inst["model"], {"model": inst["model"], "replicas": {"steady": 0, "elastic": 0},
                                              "ready": 0})
        m["replicas"][inst["pool"]] += 1
        m["ready"] += int(inst["is_ready"])
    for w in loads:
        m = models.setdefault(w.model, {"model": w.model, "replicas": {"steady": 0, "elastic": 0}, "ready": 0})
        m.update({"request_rate_rps": round(w.request_rate_rps, 3), "queue_depth": w.queue_depth,
                  "ttft_attainment": w.ttft_attainment, "num_rejected": w.num_rejected})
    recent = []
    for p in plans[-MAX_NUM_RECENT:]:
        kind = {"SteadyPlan": "steady", "ElasticPlan": "elastic", "PlanAction": "action"}[type(p).__name__]
        item = {"kind": kind, "plan_id": p.plan_id, "unix_ms": getattr(p, "created_unix_ms", None)
                or getattr(p, "unix_ms", None), "reason": getattr(p, "reason", "")}
        if kind == "steady":
            item["bins"] = {b.worker_id: list(b.models) for b in p.bins}
            item["elastic_models"] = list(p.elastic_models)
        elif kind == "elastic":
            item["targets"] = {t.model: {"prefill": t.num_prefill, "decode": t.num_decode} for t in p.targets}
            item["budget_devices"] = p.budget_devices
        else:
            item.update({"action": p.action.value, "model": p.model, "worker_id": p.worker_id, "status": p.status})
        recent.append(item)
    events = [{"model": e.model, "worker_id": e.worker_id, "instance_id": e.instance_id, "from": e.from_state.value,
               "to": e.to_state.value, "duration_ms": round(e.duration_ms, 1), "unix_ms": e.unix_ms}
              for e in lifecycle[-MAX_NUM_RECENT:]]
    return {"generated_unix_ms": now_unix_ms, "devices": devices, "instances": instances,
            "models": sorted(models.values(), key=lambda m: m["model"]), "plans": recent,
            "lifecycle_events": events}

"""Desired state: the instances the current steady and elastic plans call for, each on a device.

Steady plans name their devices. Elastic plans give counts; the placer puts them on the devices the steady pool
leaves, sticky (an instance stays where it is while it is still wanted) and preferring a device that holds the model
warm (a fast wake), then an empty one."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from contracts import ElasticPlan, InstanceRole, Pool, SteadyPlan


@dataclass(frozen=True)
class Slot:
    """One desired instance."""

    instance_id: str
    model: str
    worker_id: str
    role: InstanceRole
    pool: Pool
    plan_id: str


def instance_id_for(model: str, worker_id: str, role: InstanceRole) -> str:
    """Deterministic: the same model in the same role on the same device is the same instance, so a re-plan that
    puts it back finds the worker's warm copy under the same id."""
    return f"{model}@{worker_id}/{role.value}"


def steady_slots(plan: SteadyPlan | None) -> dict[str, Slot]:
    if plan is None:
        return {}
    out = {}
    for b in plan.bins:
        for model in b.models:
            iid = instance_id_for(model, b.worker_id, InstanceRole.COLOCATED)
            out[iid] = Slot(iid, model, b.worker_id, InstanceRole.COLOCATED, Pool.STEADY, plan.plan_id)
    return out


def elastic_role_counts(plan: ElasticPlan | None) -> dict[tuple[str, InstanceRole], int]:
    """(model, role) -> number of instances. num_decode == 0 means colocated instances (see planner.core.elastic)."""
    if plan is None:
        return {}
    out: dict[tuple[str, InstanceRole], int] = {}
    for t in plan.targets:
        if t.num_decode == 0:
            if t.num_prefill:
                out[(t.model, InstanceRole.COLOCATED)] = t.num_prefill
        else:
            out[(t.model, InstanceRole.PREFILL)] = t.num_prefill
            out[(t.model, InstanceRole.DECODE)] = t.num_decode
    return out


class ElasticPlacer:
    """Remembers where it put each elastic instance, so successive plans move as little as possible."""

    def __init__(self) -> None:
        self._slots: dict[str, Slot] = {}

    def place(
        self,
        plan: ElasticPlan | None,
        free_workers: Iterable[str],
        resident: Mapping[str, tuple[str, str, InstanceRole]],
        warm_models: Mapping[str, set[str]],
        avoid: set[tuple[str, str]],
    ) -> tuple[dict[str, Slot], dict[str, int]]:
        """Slots for `plan` on `free_workers` (alive, not steady). `resident`: instance id -> (worker, model,
        role) of instances already on devices; `avoid`: (model, worker) pairs that failed recently. Returns the
        slots and, per model, how many instances found no device."""
        free = list(dict.fromkeys(free_workers))
        free_set = set(free)
        order = {w: i for i, w in enumerate(free)}
        counts = elastic_role_counts(plan)
        plan_id = plan.plan_id if plan else ""
        taken: set[str] = set()
        slots: dict[str, Slot] = {}
        unplaced: dict[str, int] = {}
        # Keep first: what the placer chose before, then what already runs (e.g. after a reconciler restart).
        previous = {iid: (s.worker_id, s.model, s.role) for iid, s in self._slots.items()}
        candidates = {**resident, **previous}
        for (model, role), count in sorted(counts.items()):
            keep = [
                (iid, w) for iid, (w, m, r) in sorted(candidates.items())
                if m == model and r == role and w in free_set and (model, w) not in avoid and w not in taken
            ]
            for iid, w in keep[:count]:
                slots[iid] = Slot(iid, model, w, role, Pool.ELASTIC, plan_id)
                taken.add(w)
        # Then fill shortfalls: a device with the model warm, then an empty one, then any other free one.
        busy = {w for (w, _, _) in resident.values()}
        for (model, role), count in sorted(counts.items()):
            have = sum(1 for s in slots.values() if s.model == model and s.role == role)
            ranked = sorted(
                (w for w in free if w not in taken and (model, w) not in avoid),
                key=lambda w: (model not in warm_models.get(w, set()), w in busy, order[w]),
            )
            for w in ranked[: count - have]:
                iid = instance_id_for(model, w, role)
                slots[iid] = Slot(iid, model, w, role, Pool.ELASTIC, plan_id)
                taken.add(w)
                have += 1
            if have < count:
                unplaced[model] = unplaced.get(model, 0) + count - have
        self._slots = slots
        return slots, unplaced

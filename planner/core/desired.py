"""Desired state: the instances the current steady and elastic plans call for, each on a device (or a
tensor-parallel group of devices).

Steady plans name their devices. Elastic plans give counts; the placer puts them on the devices the steady pool
leaves, in this order of preference for each model and role:

1. keep: an instance that is there already (or that the placer placed before and is still coming up) stays while
   it is still wanted, ready and busy ones first;
2. resume: a draining instance of the model in that role is admitted again (its weights never left) before
   anything new is placed, the least busy first (`ReconcilerPolicy.resumes_draining`);
3. place: a free device, preferring one that holds the model warm (a fast wake). A device an instance still
   occupies (loading, serving or draining) is not free: its drain finishes first.

When devices run short, the models most starved go first: a model with no instance at all, then the model furthest
below its count as a share of it, then the busiest (by token rate). In a saturated fleet the devices that free up
then go to a small model left with one instance before a big one a few short (a 14B model once sat at one instance
for over a minute at 25 req/s when they went to the busiest, docs/bench/sim.md run 7).

A disaggregated model serves only with both roles; with `pairs_roles` (ReconcilerPolicy.pairs_disaggregated_roles,
off by default) it is never given one alone: with room for one instance and neither role running, a colocated
stand-in goes there (kept, as a colocated first instance is, until a prefill and a decode instance are ready); with
more room, its first instance of one role leaves a device for the other (docs/bench/sim.md run 45)."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

from contracts import ElasticPlan, InstanceRole, ModelState, Pool, SteadyPlan

from .cluster_view import SeenInstance


class Slot(NamedTuple):
    """One desired instance (a tuple: a large fleet's placement makes hundreds on every tick)."""

    instance_id: str
    model: str
    worker_id: str
    role: InstanceRole
    pool: Pool
    plan_id: str
    peer_worker_ids: tuple[str, ...] = ()  # a tensor-parallel group's other devices

    @property
    def worker_ids(self) -> tuple[str, ...]:
        return (self.worker_id, *self.peer_worker_ids)


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


Key = tuple[str, InstanceRole]


class ElasticPlacer:
    """Remembers where it put each elastic instance, so successive plans move as little as possible."""

    def __init__(self, resumes_draining: bool = True, pairs_roles: bool = False) -> None:
        self.resumes_draining = resumes_draining
        self.pairs_roles = pairs_roles  # ReconcilerPolicy.pairs_disaggregated_roles
        self._slots: dict[str, Slot] = {}

    def place(
        self,
        plan: ElasticPlan | None,
        free_workers: Iterable[str],
        instances: Mapping[str, SeenInstance],
        ready: set[str],
        occupied: set[str],
        warm_models: Mapping[str, set[str]],
        avoid: set[tuple[str, str]],
    ) -> tuple[dict[str, Slot], dict[str, int]]:
        """Slots for `plan` on `free_workers` (alive, not in the steady plan, in order of preference).
        `instances`: the elastic instances on live workers that occupy their devices (serving, loading, draining);
        `ready`: the instances whose record says ready; `occupied`: every worker some instance occupies, of either
        pool; `warm_models`: worker -> models it holds warm; `avoid`: (model, worker) pairs that failed recently.
        Returns the slots and, per model, how many instances found no device."""
        free = list(dict.fromkeys(free_workers))
        free_set = set(free)
        counts = elastic_role_counts(plan)
        plan_id = plan.plan_id if plan else ""
        tp = {t.model: t.num_devices_per_instance for t in plan.targets} if plan else {}
        priority = {w.model: w.features.token_rate_tps for w in plan.loads} if plan else {}
        taken: set[str] = set()
        slots: dict[str, Slot] = {}
        have: dict[Key, int] = {key: 0 for key in counts}

        def usable(model: str, workers: tuple[str, ...]) -> bool:
            return all(w in free_set and w not in taken and (model, w) not in avoid for w in workers)

        def add(iid: str, model: str, role: InstanceRole, workers: tuple[str, ...]) -> None:
            slots[iid] = Slot(iid, model, workers[0], role, Pool.ELASTIC, plan_id, workers[1:])
            taken.update(workers)
            have[(model, role)] = have.get((model, role), 0) + 1

        # 1. keep: what runs (not draining), ready and busy first, then what the placer chose before and is not
        # seen yet (iid, sort key, workers)
        by_key: dict[Key, list[tuple[str, tuple, tuple[str, ...]]]] = {}
        draining: dict[Key, list[tuple[str, tuple, tuple[str, ...]]]] = {}
        for iid, seen in instances.items():
            st = seen.status
            key = (st.model, st.role)
            if key not in counts:
                continue
            load = st.num_waiting + st.num_running
            if st.state == ModelState.DRAINING:
                draining.setdefault(key, []).append((iid, (load, iid), seen.worker_ids))
            else:
                by_key.setdefault(key, []).append((iid, (iid not in ready, -load, iid), seen.worker_ids))
        for iid, s in self._slots.items():
            if iid not in instances and (s.model, s.role) in counts:
                by_key.setdefault((s.model, s.role), []).append((iid, (True, 0, iid), s.worker_ids))
        def take(candidates: dict[Key, list[tuple[str, tuple, tuple[str, ...]]]]) -> None:
            for key in sorted(candidates):
                for iid, _, workers in sorted(candidates[key], key=lambda c: c[1]):
                    if have[key] >= counts[key]:
                        break
                    if usable(key[0], workers):
                        add(iid, key[0], key[1], workers)

        take(by_key)
        # 2. resume: draining instances of a model and role still short, the least busy first (the most room for
        # the new work the count rose for; the busier ones go on draining)
        if self.resumes_draining:
            take(draining)
        # 2b. a disaggregated model serves a request only with both roles: until it has a ready prefill and a ready
        # decode instance, a colocated instance of it (its first plan's, or a stand-in placed below) stays
        split = {m for (m, role), n in counts.items() if role == InstanceRole.DECODE and n > 0
                 and counts.get((m, InstanceRole.PREFILL), 0) > 0} if self.pairs_roles else set()
        unpaired: set[str] = set()
        if split:  # off by default: no scan of the fleet's instances on the tick's path
            ready_roles = {(s.model, s.role) for iid, s in slots.items() if iid in ready}
            unpaired = {m for m in split
                        if not {(m, InstanceRole.PREFILL), (m, InstanceRole.DECODE)} <= ready_roles}
        if unpaired:
            self._keep_stand_ins(unpaired, instances, usable, add)
        # 3. place on free devices, the most starved model first
        has_instance = {s.model for s in slots.values()}

        def starved_first(key: Key) -> tuple:
            return (key[0] in has_instance, have[key] / counts[key] if counts[key] else 1.0,
                    -priority.get(key[0], 0.0), key)

        available = [w for w in free if w not in occupied and w not in taken]
        unplaced: dict[str, int] = {}

        def other_role_missing(model: str, role: InstanceRole) -> bool:
            """The model is disaggregated and has no instance of the role besides `role` yet."""
            if model not in split or role == InstanceRole.COLOCATED:
                return False
            other = InstanceRole.PREFILL if role == InstanceRole.DECODE else InstanceRole.DECODE
            return have.get((model, other), 0) == 0

        for key in sorted(counts, key=starved_first):
            model, role = key
            size = max(1, tp.get(model, 1))
            if other_role_missing(model, role) and have[key] == 0 and len(available) < 2 * size:
                # Room for one instance at most and the model has neither role: alone, either serves nothing. A
                # colocated stand-in serves until both roles run (kept by 2b).
                group = _pick_group(available, model, size, warm_models, avoid) if model in unpaired else None
                if group is not None:
                    for w in group:
                        available.remove(w)
                    add(instance_id_for(model, group[0], InstanceRole.COLOCATED), model, InstanceRole.COLOCATED,
                        group)
                    unpaired.discard(model)
                unplaced[model] = unplaced.get(model, 0) + counts[key]
                continue
            while have[key] < counts[key]:
                # one group left for the model's other role while it has none (its key comes later)
                reserve = size if have[key] > 0 and other_role_missing(model, role) else 0
                group = (_pick_group(available, model, size, warm_models, avoid)
                         if len(available) - reserve >= size else None)
                if group is None:
                    unplaced[model] = unplaced.get(model, 0) + counts[key] - have[key]
                    break
                for w in group:
                    available.remove(w)
                add(instance_id_for(model, group[0], role), model, role, group)
        self._slots = slots
        return slots, unplaced

    def _keep_stand_ins(self, unpaired: set[str], instances: Mapping[str, SeenInstance],
                        usable: Callable[[str, tuple[str, ...]], bool],
                        add: Callable[[str, str, InstanceRole, tuple[str, ...]], None]) -> None:
        """One colocated instance per model in `unpaired` (it has no ready prefill and decode pair) stays: a running
        one first, then a draining one (resumed), then one placed before and not seen yet. Takes each model it
        keeps out of `unpaired`."""
        stand_ins = [((st.state == ModelState.DRAINING, iid), iid, st.model, seen.worker_ids)
                     for iid, seen in instances.items() if (st := seen.status).role == InstanceRole.COLOCATED
                     and st.model in unpaired and (self.resumes_draining or st.state != ModelState.DRAINING)]
        stand_ins += [((True, iid), iid, s.model, s.worker_ids) for iid, s in self._slots.items()
                      if iid not in instances and s.role == InstanceRole.COLOCATED and s.model in unpaired]
        for _, iid, model, workers in sorted(stand_ins):
            if model in unpaired and usable(model, workers):
                add(iid, model, InstanceRole.COLOCATED, workers)
                unpaired.discard(model)


def _pick_group(available: list[str], model: str, size: int, warm_models: Mapping[str, set[str]],
                avoid: set[tuple[str, str]]) -> tuple[str, ...] | None:
    """`size` free devices for one instance: all of them warm with the model if enough are (a warm copy wakes it),
    else the first ones in order (which keeps a group's devices together)."""
    if len(available) < size:
        return None
    candidates = [w for w in available if (model, w) not in avoid] if avoid else available
    if len(candidates) < size:
        return None
    warm = [w for w in candidates if model in warm_models.get(w, ())]
    if len(warm) >= size:
        return tuple(warm[:size])
    return tuple(candidates[:size])

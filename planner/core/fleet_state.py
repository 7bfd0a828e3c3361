"""What the planners read off the fleet each tick, from the instances the workers' heartbeats report (as
(worker, status) pairs): the devices the steady pool leaves to the elastic pool (its budget), the requests each
model has running or waiting (the keep-alive), and the order in which the steady planner prefers devices. The
live planner services and the simulator both call these on what they have."""
from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from contracts import InstanceRole, InstanceStatus, ModelState, Pool, SteadyPlan, WorkerHeartbeat

from .cluster_view import OCCUPYING_STATES, worker_order

Reported = tuple[str, InstanceStatus]  # (worker that reports it, its status)


def reported(heartbeats: Iterable[WorkerHeartbeat]) -> list[Reported]:
    return [(hb.worker_id, st) for hb in heartbeats for st in hb.instances]


def _occupied(instances: Iterable[Reported], pool: Pool) -> set[str]:
    return {w for wid, st in instances if st.pool == pool and st.state in OCCUPYING_STATES
            for w in (wid, *st.peer_worker_ids)}


def elastic_budget_devices(alive_workers: Iterable[str], steady_plan: SteadyPlan | None,
                           instances: Iterable[Reported]) -> int:
    """Live workers, less those the steady plan names and those a steady instance still occupies while it moves out
    (make before break keeps it serving until its replacement is ready, then it drains)."""
    steady = {b.worker_id for b in steady_plan.bins} if steady_plan else set()
    return len(set(alive_workers) - steady - _occupied(instances, Pool.STEADY))


def in_flight_by_model(instances: Iterable[Reported]) -> dict[str, int]:
    """Per model, the requests running or waiting at its instances."""
    out: dict[str, int] = {}
    for _, st in instances:
        if st.num_waiting or st.num_running:
            out[st.model] = out.get(st.model, 0) + st.num_waiting + st.num_running
    return out


class DecodeKV(NamedTuple):
    """A model's serving decode instances, summed over their heartbeats: how many, the KV blocks their sequences
    hold and have free, and the sequences running and waiting (their KV arrived, not yet admitted)."""

    num_instances: int
    num_kv_blocks_used: int
    num_kv_blocks_free: int
    num_running: int
    num_waiting: int


def decode_kv_by_model(instances: Iterable[Reported]) -> dict[str, DecodeKV]:
    """Per model with serving (ACTIVE) decode instances, their KV and sequences (`DecodeKV`). A draining instance is
    left out: the count it holds is already given up."""
    out: dict[str, DecodeKV] = {}
    for _, st in instances:
        if st.role != InstanceRole.DECODE or st.state != ModelState.ACTIVE:
            continue
        old = out.get(st.model, DecodeKV(0, 0, 0, 0, 0))
        out[st.model] = DecodeKV(old.num_instances + 1, old.num_kv_blocks_used + st.num_kv_blocks_used,
                                 old.num_kv_blocks_free + st.num_kv_blocks_free, old.num_running + st.num_running,
                                 old.num_waiting + st.num_waiting)
    return out


def elastic_models_of(steady_plan: SteadyPlan | None, models: Iterable[str]) -> list[str]:
    """The models the elastic scaler sizes: every model the steady plan does not place, those it isolated up front
    and those it wanted but found no device for (better served by the elastic pool than by nobody). Without a steady
    plan, every model."""
    placed = set(steady_plan.steady_models) if steady_plan else set()
    return [m for m in models if m not in placed]


def steady_worker_order(alive_workers: Iterable[str], last_plan: SteadyPlan | None,
                        instances: Iterable[Reported]) -> list[str]:
    """The live workers in the order the steady planner should prefer them: those its last plan used (staying put
    moves nothing), then free ones, then those an elastic instance occupies (taking one drains it)."""
    own = {b.worker_id for b in last_plan.bins} if last_plan else set()
    elastic = _occupied(instances, Pool.ELASTIC)
    return sorted(alive_workers, key=lambda w: (w not in own, w in elastic, worker_order(w)))

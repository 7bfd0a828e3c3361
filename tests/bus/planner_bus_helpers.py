"""What the planner tests that run real services on a real nats-server share: fast planner settings, scripted
heartbeats and load windows, and a table oracle served on the oracle subjects (the oracle and the workers are the
planner unit tests' stand-ins, tests/unit/planner/planner_test_*.py)."""
from __future__ import annotations

import asyncio
import time

from contracts import CapacityQuery, ElasticityQuery, ElasticPlan, SteadyPlan, subjects


def fast_planner(heartbeat_timeout_ms: float, retry_backoff_ms: float) -> dict:
    """Planner settings that act within a test's seconds (steady every 1 s, elastic every 0.2 s)."""
    return {
        "steady": {"period_s": 1.0},
        "elastic": {"period_s": 0.2, "target_attainment": 0.95, "min_num_disaggregated": 100, "max_num_replicas": 3},
        "reconciler": {"heartbeat_timeout_ms": heartbeat_timeout_ms, "retry_backoff_ms": retry_backoff_ms},
        "startup_delay_s": 0.5,
        "reconcile_period_s": 0.1,
        "elastic_republish_s": 30.0,
    }


async def beat_and_load(bus, workers, worker_ids, windows, period_s: float) -> None:
    """Every `period_s` until cancelled: a heartbeat of each scripted worker (planner_test_workers) and the load
    windows `windows(now_ms)` returns ({model: ModelLoadWindow})."""
    while True:
        now = time.time() * 1000
        for w in worker_ids:
            await bus.publish(subjects.worker_telemetry(w), workers.heartbeat(w, now))
        for model, load_window in windows(now).items():
            await bus.publish(subjects.model_telemetry(model), load_window)
        await asyncio.sleep(period_s)


async def fresh_plans_stream(bus) -> None:
    """Each test reads its own plans: a reconciler or scaler recovers the latest plans from PLANS at start, and
    those of an earlier test on this nats-server are not this cluster's."""
    from planner.core.policy import PlannerPolicy
    from planner.shell import ensure_plans_stream

    try:
        await bus.js.delete_stream(subjects.PLANS_STREAM)
    except Exception:  # noqa: BLE001 - not there yet
        pass
    await ensure_plans_stream(bus, PlannerPolicy().plans_max_age_s)  # as the planners create it


async def every_model_elastic(bus, models: tuple[str, ...], plan_id: str) -> list[ElasticPlan]:
    """Plays the steady planner (one plan handing `models` to the elastic pool, no steady device); returns the list
    the elastic plans published from now on are appended to."""
    from planner.shell import publish_event

    plans: list[ElasticPlan] = []

    async def keep(plan: ElasticPlan, env) -> None:
        plans.append(plan)

    await bus.subscribe(subjects.PLAN_ELASTIC, ElasticPlan, keep, traced=False)
    await publish_event(bus, subjects.PLAN_STEADY, SteadyPlan(
        plan_id=plan_id, created_unix_ms=time.time() * 1000.0, trigger="startup", steady_models=(),
        elastic_models=models, bins=(), reason="test: every model elastic"))
    return plans


async def serve_oracle(bus, oracle) -> None:
    """Answer the oracle subjects from `oracle` (a planner_test_oracles.TableOracle)."""
    async def on_capacity(q: CapacityQuery, env):
        return oracle.capacity(q)

    async def on_elasticity(q: ElasticityQuery, env):
        return oracle.elasticity(q)

    await bus.serve(subjects.ORACLE_CAPACITY, CapacityQuery, on_capacity, queue=subjects.ORACLE_QUEUE)
    await bus.serve(subjects.ORACLE_ELASTICITY, ElasticityQuery, on_elasticity, queue=subjects.ORACLE_QUEUE)


async def assert_jump_in_audit(nats_url: str, state_dir, plan_id: str, new: set[str]) -> list[dict]:
    """`janus audit --all --json` holds, in stream order, the jump's elastic plan, then for each instance it added
    an issued and later a succeeded fork_from action. Returns the events, for further checks."""
    import io
    import json
    from argparse import Namespace

    from planner.audit import audit

    out = io.StringIO()
    args = Namespace(nats=nats_url, state_dir=str(state_dir), since=None, all=True, follow=False, json=True,
                     kind=None, plan=None, limit=None)
    assert await audit(args, out=out) == 0
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(seqs)
    i_plan = next(i for i, e in enumerate(events) if e["kind"] == "elastic" and e["event"]["plan_id"] == plan_id)
    jump_actions = [(i, e["event"]) for i, e in enumerate(events)
                    if e["kind"] == "action" and e["event"]["plan_id"] == plan_id]
    issued = {a["instance_id"]: i for i, a in jump_actions if a["status"] == "issued"}
    succeeded = {a["instance_id"]: i for i, a in jump_actions if a["status"] == "succeeded"}
    assert set(issued) == set(succeeded) == new
    assert all(i_plan < issued[iid] < succeeded[iid] for iid in new)
    assert all(a["action"] == "fork_from" for _, a in jump_actions), "scale-out forks from the live replica"
    assert any(e["kind"] == "steady" for e in events[:i_plan])
    return events

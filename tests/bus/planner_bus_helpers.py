"""What the planner tests that run real services on a real nats-server share: fast planner settings, scripted
heartbeats and load windows, and a table oracle served on the oracle subjects (the oracle and the workers are the
planner unit tests' stand-ins, tests/unit/planner/planner_test_*.py)."""
from __future__ import annotations

import asyncio
import time

from contracts import CapacityQuery, ElasticityQuery, subjects


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

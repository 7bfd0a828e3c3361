"""What the planner tests that run real services on a real nats-server share: fast planner settings, a polling
wait, and a table oracle served on the oracle subjects."""
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


async def wait_for(predicate, timeout_s: float = 90.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not met within {timeout_s} s")
        await asyncio.sleep(0.05)


async def serve_oracle(bus, oracle) -> None:
    """Answer the oracle subjects from `oracle` (a planner_test_oracles.TableOracle)."""
    async def on_capacity(q: CapacityQuery, env):
        return oracle.capacity(q)

    async def on_elasticity(q: ElasticityQuery, env):
        return oracle.elasticity(q)

    await bus.serve(subjects.ORACLE_CAPACITY, CapacityQuery, on_capacity, queue=subjects.ORACLE_QUEUE)
    await bus.serve(subjects.ORACLE_ELASTICITY, ElasticityQuery, on_elasticity, queue=subjects.ORACLE_QUEUE)

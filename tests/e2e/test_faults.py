"""Fault injection with real processes and a real nats-server: kill -9 a worker, a dispatcher, the NATS server, a
node of a three-node NATS cluster. Each run reports requests sent, completed, failed with a reason, and lost; lost
must be 0, and what completed must be whole."""
from __future__ import annotations

import asyncio
import time

import pytest

from .faults import LONG, cluster_config, kill9, load, report, start

pytestmark = pytest.mark.slow


async def _wait_first_tokens(task_started_s: float = 1.5) -> None:
    await asyncio.sleep(task_started_s)


async def test_worker_killed_mid_stream(tmp_path, demo_models_dir):
    cluster = await start(tmp_path, cluster_config(demo_models_dir))
    try:
        running = asyncio.create_task(load(cluster.gateway_url, 16))
        await _wait_first_tokens()
        kill9(cluster, "worker-0")
        outcomes = await running
        summary = report("worker killed mid-stream", outcomes)
        assert summary["lost"] == 0
        assert set(summary["failure_codes"]) <= {"instance_failed"}
        assert all(o.num_tokens == LONG["max_tokens"] for o in outcomes if o.status == "completed")
        assert summary["completed"] >= 1  # the survivor's requests (and the re-dispatched ones) finish
        # afterwards the dead worker is out of rotation: everything completes on the survivor
        after = report("after the kill", await load(cluster.gateway_url, 6, {**LONG, "max_tokens": 20}))
        assert after["completed"] == 6
    finally:
        cluster.stop()


async def test_dispatcher_killed_with_requests_queued(tmp_path, demo_models_dir):
    config = cluster_config(demo_models_dir, replicas={"dispatcher": 2}, workers={"count": 1, "max_num_seqs": 2})
    cluster = await start(tmp_path, config)
    try:
        running = asyncio.create_task(load(cluster.gateway_url, 16, {**LONG, "max_tokens": 60}))
        await asyncio.sleep(1.0)
        kill9(cluster, "dispatcher-0")
        outcomes = await running
        summary = report("dispatcher killed", outcomes)
        assert summary["lost"] == 0 and summary["failed"] == 0
        assert all(o.num_tokens == 60 for o in outcomes)
    finally:
        cluster.stop()


async def test_nats_server_restarted_under_load(tmp_path, demo_models_dir):
    cluster = await start(tmp_path, cluster_config(demo_models_dir))
    try:
        running = asyncio.create_task(load(cluster.gateway_url, 12, {**LONG, "max_tokens": 300}, stagger_s=0.1))
        await asyncio.sleep(1.5)
        cluster.nats.restart()
        # submitted while every service is still reconnecting: the gateway waits for a dispatcher to answer
        during = report("submitted during the reconnect",
                        await load(cluster.gateway_url, 4, {**LONG, "max_tokens": 20}))
        outcomes = await running
        summary = report("nats-server restarted", outcomes)
        # lost messages are recovered from the workers' resend logs: every stream completes, whole
        assert summary["lost"] == 0 and summary["completed"] == summary["sent"]
        assert all(o.num_tokens == 300 for o in outcomes)
        assert during["completed"] == 4
        after = report("after the restart", await load(cluster.gateway_url, 6, {**LONG, "max_tokens": 20}))
        assert after["completed"] == 6
    finally:
        cluster.stop()


async def test_three_node_nats_cluster_loses_a_node(tmp_path, demo_models_dir):
    config = cluster_config(demo_models_dir, jetstream_replicas=3)
    cluster = await start(tmp_path, config, num_nats_nodes=3)
    try:
        running = asyncio.create_task(load(cluster.gateway_url, 12, {**LONG, "max_tokens": 150}, stagger_s=0.1))
        await asyncio.sleep(1.5)
        cluster.nats_nodes[0].kill()
        outcomes = await running
        summary = report("one of three NATS nodes killed", outcomes)
        assert summary["lost"] == 0 and summary["completed"] == summary["sent"]
        assert all(o.num_tokens == 150 for o in outcomes)
        after = report("after the node loss", await load(cluster.gateway_url, 6, {**LONG, "max_tokens": 20}))
        assert after["completed"] == 6
    finally:
        cluster.stop()


async def test_planners_killed_and_restarted_resume_from_the_plan_stream(tmp_path, demo_models_dir):
    from nats.js.errors import NotFoundError

    from contracts import HealthReply, SteadyPlan, subjects
    from contracts.plans import audit_digest
    from planner.shell import last_plan

    config = cluster_config(demo_models_dir, planner={"steady": {"period_s": 2.0}, "startup_delay_s": 0.5})
    cluster = await start(tmp_path, config)
    bus = await cluster.operator_bus()
    try:
        async def latest_steady() -> SteadyPlan | None:
            return await last_plan(bus, subjects.PLAN_STEADY, SteadyPlan)

        async def steady_chain_from(seq: int, data: bytes) -> list[str]:
            """The ids of the steady plan stored at `seq` and of every one after it, each checked to name the
            digest of the one before (a restarted planner carries the chain on from the stream, not from scratch)."""
            ids, digest = [SteadyPlan.model_validate_json(data).plan_id], audit_digest(subjects.PLAN_STEADY, data)
            while True:
                try:
                    raw = await bus.js.get_msg(subjects.PLANS_STREAM, seq + 1, subject=subjects.PLAN_STEADY, next=True)
                except NotFoundError:
                    return ids
                plan = SteadyPlan.model_validate_json(raw.data)
                assert plan.prev_event_sha256 == digest, f"{plan.plan_id} does not follow on from {ids[-1]}"
                ids.append(plan.plan_id)
                seq, digest = raw.seq, audit_digest(subjects.PLAN_STEADY, raw.data)

        for _ in range(300):
            if await latest_steady() is not None:
                break
            await asyncio.sleep(0.1)
        running = asyncio.create_task(load(cluster.gateway_url, 8, {**LONG, "max_tokens": 80}, stagger_s=0.1))
        await asyncio.sleep(1.0)
        planners = {"steady-planner-0", "elastic-scaler-0", "reconciler-0"}
        for name in planners:
            kill9(cluster, name)
        at_kill = await bus.js.get_last_msg(subjects.PLANS_STREAM, subjects.PLAN_STEADY)
        assert set(cluster.restart_crashed()) == planners
        await cluster.wait_healthy(120)
        # The new reconciler leads once the killed copy's lease has expired (planner/leader.py: 1.5 s) and carries on
        # the last steady plan in PLANS when it takes office. The restarted steady planner may have appended one by
        # then (it inherits the plan at the kill and plans at once once past its start-up delay): which of the two
        # the reconciler finds is a race between two fresh processes; either is the chain's tip when it looked.
        deadline = time.monotonic() + 15
        while True:
            health = await bus.request(subjects.health("reconciler", "reconciler-0"), None, HealthReply, timeout_s=5)
            resumed = [p for p in health.detail["resumed"].split(",") if p.startswith("steady-")]
            chain = await steady_chain_from(at_kill.seq, at_kill.data)
            if (resumed and resumed[0] in chain) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        assert resumed and resumed[0] in chain, f"the new reconciler carries the last plan on: {resumed} {chain}"
        summary = report("planners killed and restarted", await running)
        # the data path does not depend on the planners: every stream completes, whole
        assert summary["lost"] == 0 and summary["completed"] == summary["sent"]
        # the restarted steady planner plans again, and the reconciler follows without failures
        for _ in range(200):
            plan = await latest_steady()
            if plan is not None and plan.plan_id != chain[0]:
                break
            await asyncio.sleep(0.1)
        assert plan.plan_id != chain[0]
        # ... carrying the chain on from the plan at the kill (it inherited that plan; every link checked)
        assert plan.plan_id in await steady_chain_from(at_kill.seq, at_kill.data)
        health = await bus.request(subjects.health("reconciler", "reconciler-0"), None, HealthReply, timeout_s=5)
        assert health.detail["failed_actions"] == "0" and health.detail["unaudited"] == "0"
        after = report("after the planners' restart", await load(cluster.gateway_url, 4, {**LONG, "max_tokens": 20}))
        assert after["completed"] == 4
    finally:
        await bus.close()
        cluster.stop()

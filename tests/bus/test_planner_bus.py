"""Through a real nats-server: a load jump on one model produces an elastic plan, the reconciler's commands, workers
becoming ready and the dispatcher routing to the new instances, with plans and commands in the audit stream in order.

Real here: nats-server with JetStream, the steady planner, elastic scaler and reconciler services, the dispatcher
service, `janus audit`. Stand-ins: the oracle answers with a closed-form function served on the oracle subjects (the
same TableOracle the unit tests use), and the workers are scripted (planner_test_workers): the worker service does
not take lifecycle commands yet, so these answer them, heartbeat, and write the registry as a worker would."""
from __future__ import annotations

import asyncio
import time

import pytest

from contracts import (
    GenerateRequest,
    LifecycleCommand,
    ModelState,
    RunAssignment,
    SamplingParams,
    SubmitAck,
    subjects,
)
from runtime.jetstream import ensure_kv
from runtime.service import run_service
from runtime.settings import ClusterConfig, JanusSettings
from tests.bus.cluster import stop_services
from tests.bus.planner_bus_helpers import assert_jump_in_audit, beat_and_load, fast_planner, serve_oracle
from tests.polling import wait_for
from tests.unit.planner.planner_test_oracles import TableOracle, window
from tests.unit.planner.planner_test_workers import ScriptedWorkers

pytestmark = pytest.mark.slow

WORKERS = ["pw0", "pw1", "pw2", "pw3"]
PLANNER = fast_planner(heartbeat_timeout_ms=3000, retry_backoff_ms=200)


async def test_load_jump_reaches_the_dispatcher_through_plans_and_commands(nats_url, bus_factory, tmp_path):
    from dispatcher.service import DispatcherService
    from planner.elastic_service import ElasticScalerService
    from planner.reconciler_service import ReconcilerService
    from planner.steady_service import SteadyPlannerService

    bus = await bus_factory("planner-test")
    js = bus.js
    try:  # a fresh audit stream for this test
        await js.delete_stream(subjects.PLANS_STREAM)
    except Exception:  # noqa: BLE001 - not there yet
        pass
    kv = await ensure_kv(js, subjects.INSTANCES_BUCKET)

    # -- the oracle: a closed-form function on the oracle subjects --
    oracle = TableOracle(needs={"hot": (0.6, 0.3, 0.3), "calm": (0.2, 0.2, 0.2)}, per_replica_tps=1000.0)

    await serve_oracle(bus, oracle)

    # -- scripted workers: commands, heartbeats, registry, and what the dispatcher sends them --
    workers = ScriptedWorkers(WORKERS)
    routed: list[RunAssignment] = []

    def make_cmd_handler():
        async def on_cmd(cmd: LifecycleCommand, env):
            reply = workers.apply(cmd, time.time() * 1000)
            record = workers.record(cmd.instance_id, time.time() * 1000)
            if reply.state == ModelState.ACTIVE:
                await kv.put(subjects.instance_key(cmd.instance_id), record.model_dump_json().encode())
            else:
                await kv.delete(subjects.instance_key(cmd.instance_id))
            return reply
        return on_cmd

    async def on_run(run: RunAssignment, env):
        routed.append(run)

    for w in WORKERS:
        await bus.serve(subjects.worker_cmd(w), LifecycleCommand, make_cmd_handler())
        await bus.subscribe(subjects.worker_run(w), RunAssignment, on_run)

    load = {"hot": 1.0, "calm": 0.5}

    def windows(now: float) -> dict:
        return {model: window(model, rate, now, window_s=2.0) for model, rate in load.items()}

    # -- the real services --
    cluster = ClusterConfig.model_validate({"models": [{"name": "hot"}, {"name": "calm"}], "planner": PLANNER})

    def settings(instance: str) -> JanusSettings:
        return JanusSettings(nats_url=nats_url, instance=instance, state_dir=tmp_path)

    services = {
        "steady": SteadyPlannerService(settings("t-steady"), cluster),
        "elastic": ElasticScalerService(settings("t-elastic"), cluster),
        "reconciler": ReconcilerService(settings("t-reconciler"), cluster),
        "dispatcher": DispatcherService(settings("t-dispatcher"), cluster),
    }
    tasks = [asyncio.create_task(beat_and_load(bus, workers, WORKERS, windows, 0.2))]
    tasks += [asyncio.create_task(run_service(s, install_signals=False)) for s in services.values()]
    steady, elastic, reconciler = services["steady"], services["elastic"], services["reconciler"]
    try:
        def ready_instances(model: str) -> set[str]:
            return {iid for insts in workers.instances.values() for iid, st in insts.items()
                    if st.model == model and st.state == ModelState.ACTIVE}

        # Before the jump: calm is packed into the steady pool, hot is elastic with one instance.
        await wait_for(lambda: steady.last_plan is not None, what="a steady plan")
        assert steady.last_plan.elastic_models == ("hot",) and steady.last_plan.steady_models == ("calm",)
        await wait_for(lambda: len(ready_instances("hot")) == 1 and len(ready_instances("calm")) == 1,
                       what="one hot and one calm instance ready")
        before = ready_instances("hot")

        # The jump: ten times the load on hot.
        load["hot"] = 10.0
        jump = await wait_for(lambda: elastic.last_published if elastic.last_published and next(
            t for t in elastic.last_published.targets if t.model == "hot").num_prefill == 3 else None,
            what="an elastic plan with three hot instances")
        await wait_for(lambda: len(ready_instances("hot")) == 3, what="three hot instances ready")
        new = ready_instances("hot") - before
        await wait_for(lambda: reconciler.core.is_done(jump.plan_id), what="the jump plan done")
        dispatcher = services["dispatcher"]
        await wait_for(lambda: sum(1 for r in dispatcher._records.values()
                                   if r.model == "hot" and r.is_ready) == 3, what="the dispatcher sees 3")

        # The dispatcher routes to the new instances.
        now = time.time() * 1000
        for i in range(9):
            req = GenerateRequest(request_id=f"jump-{i}", model="hot", prompt_token_ids=tuple(range(1, 200)),
                                  sampling=SamplingParams(max_tokens=8), arrival_unix_ms=now,
                                  ttft_deadline_unix_ms=now + 30_000, tpot_slo_ms=100.0,
                                  reply_subject=subjects.reply("test", f"jump-{i}"))
            ack = await bus.request(subjects.req("hot"), req, SubmitAck, timeout_s=5.0)
            assert ack.status == "queued"
        await wait_for(lambda: len(routed) >= 3, what="requests routed")
        assert {r.instance_id for r in routed} & new, "some requests go to the instances the jump added"

        # The audit stream has it all, in order: the jump's plan, its commands, their success.
        await assert_jump_in_audit(nats_url, tmp_path, jump.plan_id, new)
    finally:
        tasks[0].cancel()
        await stop_services(services, tasks)

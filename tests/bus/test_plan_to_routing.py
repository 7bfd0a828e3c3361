"""A load jump on one model, end to end through a real nats-server and real workers: an elastic plan, the
reconciler's commands, workers forking the live replica (real engines, real Mooncake) and becoming ready, the
dispatcher routing to the new instances, and all of it in the audit stream in order.

Stand-in: the oracle answers with a closed-form function on the oracle subjects (deterministic, so the jump's plan
is known); everything else is the real service."""
from __future__ import annotations

import asyncio
import time

import pytest

from contracts import (
    GenerateRequest,
    RunAssignment,
    SamplingParams,
    SubmitAck,
    subjects,
)
from runtime.service import run_service
from runtime.settings import ClusterConfig, JanusSettings
from tests.bus.cluster import stop_services
from tests.bus.planner_bus_helpers import assert_jump_in_audit, fast_planner, serve_oracle
from tests.polling import wait_for
from tests.scrape import samples, scrape
from tests.unit.planner.planner_test_oracles import TableOracle, window

pytestmark = pytest.mark.slow

WORKERS = ["rw0", "rw1", "rw2", "rw3"]
PLANNER = fast_planner(heartbeat_timeout_ms=5000, retry_backoff_ms=300)


async def test_load_jump_forks_real_workers_and_the_dispatcher_routes_to_them(nats_url, bus_factory, tmp_path,
                                                                            demo_models_dir):
    from dispatcher.service import DispatcherService
    from planner.elastic_service import ElasticScalerService
    from planner.reconciler_service import ReconcilerService
    from planner.steady_service import SteadyPlannerService
    from worker.shell.service import WorkerService

    bus = await bus_factory("routing-test")
    try:  # a fresh audit stream for this test
        await bus.js.delete_stream(subjects.PLANS_STREAM)
    except Exception:  # noqa: BLE001 - not there yet
        pass

    oracle = TableOracle(needs={"hot": (0.6, 0.3, 0.3), "calm": (0.2, 0.2, 0.2)}, per_replica_tps=1000.0)

    await serve_oracle(bus, oracle)

    routed: list[RunAssignment] = []

    async def on_run(run: RunAssignment, env):
        routed.append(run)

    for w in WORKERS:
        await bus.subscribe(subjects.worker_run(w), RunAssignment, on_run)

    load = {"hot": 1.0, "calm": 0.5}

    async def publish_load():  # what the dispatcher's load windows would say
        while True:
            now = time.time() * 1000
            for model, rate in load.items():
                await bus.publish(subjects.model_telemetry(model), window(model, rate, now, window_s=2.0))
            await asyncio.sleep(0.2)

    tiny = str(demo_models_dir / "demo-tiny")
    cluster = ClusterConfig.model_validate({
        "models": [{"name": "hot", "path": tiny, "ttft_slo_ms": 30000}, {"name": "calm", "path": tiny}],
        "workers": {"count": len(WORKERS), "placement": {w: [] for w in WORKERS}, "pool_bytes": 128 << 20},
        "planner": PLANNER})

    def settings(instance: str) -> JanusSettings:
        return JanusSettings(nats_url=nats_url, instance=instance, state_dir=tmp_path)

    workers = {w: WorkerService(settings(w), cluster, worker_id=w) for w in WORKERS}
    services = {
        **workers,
        "steady": SteadyPlannerService(settings("r-steady"), cluster),
        "elastic": ElasticScalerService(settings("r-elastic"), cluster),
        "reconciler": ReconcilerService(settings("r-reconciler"), cluster),
        "dispatcher": DispatcherService(settings("r-dispatcher"), cluster),
    }
    tasks = [asyncio.create_task(publish_load())]
    tasks += [asyncio.create_task(run_service(s, install_signals=False)) for s in services.values()]
    steady, elastic, reconciler = services["steady"], services["elastic"], services["reconciler"]
    dispatcher = services["dispatcher"]

    def ready(model: str) -> set[str]:
        return {r.instance_id for r in dispatcher._records.values() if r.model == model and r.is_ready}

    try:
        await wait_for(lambda: steady.last_plan is not None, what="a steady plan")
        assert steady.last_plan.elastic_models == ("hot",) and steady.last_plan.steady_models == ("calm",)
        await wait_for(lambda: len(ready("hot")) == 1 and len(ready("calm")) == 1,
                       what="one hot and one calm instance ready on real workers")
        before = ready("hot")

        load["hot"] = 10.0  # the jump
        jump = await wait_for(lambda: elastic.last_published if elastic.last_published and next(
            t for t in elastic.last_published.targets if t.model == "hot").num_prefill == 3 else None,
            what="an elastic plan with three hot instances")
        await wait_for(lambda: len(ready("hot")) == 3, what="three hot instances ready")
        new = ready("hot") - before
        await wait_for(lambda: reconciler.core.is_done(jump.plan_id), what="the jump plan done")

        # Nine identical prompts at once, each decoding long enough to be in flight while the others arrive: they
        # queue together, and LST-IMH sends those that would wait behind the prompt's holder to the instances the
        # jump added (the same with the decode gap at 1,000). Sent one by one with 4-token answers, each could finish
        # before the next arrived (a finished request leaves the decode backlog at once), and the holder, free again
        # and holding the prompt, rightly took all nine: 2 runs in 6 failed that way beside three busy loops.
        now = time.time() * 1000

        async def submit(i: int) -> SubmitAck:
            req = GenerateRequest(request_id=f"jump-{i}", model="hot", prompt_token_ids=tuple(range(1, 200)),
                                  sampling=SamplingParams(max_tokens=32, ignore_eos=True), arrival_unix_ms=now,
                                  ttft_deadline_unix_ms=now + 30_000, tpot_slo_ms=1000.0,
                                  reply_subject=subjects.reply("test", f"jump-{i}"))
            return await bus.request(subjects.req("hot"), req, SubmitAck, timeout_s=5.0)

        acks = await asyncio.gather(*(submit(i) for i in range(9)))
        assert all(ack.status == "queued" for ack in acks), acks
        await wait_for(lambda: len({r.request.request_id for r in routed}) >= 9, what="requests routed")
        assert {r.instance_id for r in routed} & new, "some requests go to the instances the jump added"

        events = await assert_jump_in_audit(nats_url, tmp_path, jump.plan_id, new)
        succeeded = [i for i, e in enumerate(events) if e["kind"] == "action" and e["event"]["plan_id"] == jump.plan_id
                     and e["event"]["status"] == "succeeded"]
        done = [i for i, e in enumerate(events) if e["kind"] == "status" and e["event"]["plan_id"] == jump.plan_id
                and e["event"]["status"] == "done"]
        assert done and done[0] > max(succeeded), "the plan is done only after its instances are ready"
        # the forks were real: each new instance holds verified weight segments whose checksums equal its source's
        forked = [inst for w in workers.values() for inst in w.residents.values() if inst.instance_id in new]
        (source,) = [inst for w in workers.values() for inst in w.residents.values() if inst.instance_id in before]
        assert len(forked) == 2
        for inst in forked:
            assert inst.segments and [s.checksum for s in inst.segments] == [s.checksum for s in source.segments]

        # what Prometheus scrapes tells the same story
        target = next(w for w in workers.values() if any(i.instance_id in new for i in w.residents.values()))
        me = {"worker": target.worker_id}

        async def weights_paged() -> str | None:  # the page gauges follow heartbeats: one sent after the fork
            text = await scrape(target.metrics_url)
            return text if sum(samples(text, "janus_worker_pages", model="hot", kind="weights", **me)) > 0 else None

        text = await wait_for(weights_paged, timeout_s=30, what=f"the forked weights in {target.worker_id}'s pages")
        assert sum(samples(text, "janus_worker_lifecycle_transitions_total", model="hot", to_state="active",
                           **me)) >= 1
        fork_s = sum(samples(text, "janus_worker_lifecycle_transition_seconds_sum", via="fork", **me))
        assert sum(samples(text, "janus_worker_lifecycle_transition_seconds_count", via="fork", **me)) >= 1
        assert 0 < fork_s < 60
        planner = await scrape(reconciler.metrics_url)
        assert sum(samples(planner, "janus_planner_actions_total", action="fork_from", status="succeeded")) >= 2
        assert sum(samples(planner, "janus_planner_plans_total", planner="elastic")) >= 1
        assert sum(samples(planner, "janus_planner_plans_total", planner="steady")) >= 1
        assert 0 < sum(samples(planner, "janus_planner_decision_seconds", planner="elastic")) < 10
    finally:
        tasks[0].cancel()
        await stop_services(services, tasks)

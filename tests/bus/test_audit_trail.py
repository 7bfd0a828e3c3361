"""The PLANS audit trail on a real nats-server: services appending at once keep one hash chain, `janus audit
--verify` passes on it and finds an event removed or forged through a privileged path, and plan ids stay unique when
a planner restarts."""
from __future__ import annotations

import asyncio
import io

import pytest

from contracts import PlanStatus, SteadyPlan, subjects
from planner.audit import audit, build_parser
from planner.shell import ensure_plans_stream, publish_event
from runtime.bus import Bus
from runtime.nats_server import EmbeddedNats


@pytest.fixture
def server(tmp_path):
    """A server of this test's own (no users: the stream's configuration is all that protects PLANS)."""
    nats = EmbeddedNats(tmp_path / "nats").start()
    yield nats
    nats.stop()


async def _audit(url: str, *args: str) -> tuple[int, str]:
    out = io.StringIO()
    rc = await audit(build_parser().parse_args(["--nats", url, *args]), out=out)
    return rc, out.getvalue()


def _status(i: int) -> PlanStatus:
    return PlanStatus(plan_id=f"p{i}", kind="elastic", status="done", unix_ms=float(i))


def _steady(i: int) -> SteadyPlan:
    return SteadyPlan(plan_id=f"s{i}", created_unix_ms=float(i), trigger="periodic", steady_models=(),
                      elastic_models=(), bins=())


async def test_services_appending_at_once_keep_one_chain(server):
    buses = [await Bus.connect(server.url, f"appender-{i}") for i in range(3)]  # steady, elastic, reconciler
    try:
        for bus in buses:
            await ensure_plans_stream(bus, 3600.0)

        async def append(bus, first: int) -> None:
            for i in range(first, first + 10):
                await publish_event(bus, subjects.PLAN_STATUS, _status(i))

        await asyncio.gather(*(append(bus, 100 * k) for k, bus in enumerate(buses)))
    finally:
        for bus in buses:
            await bus.close()
    rc, out = await _audit(server.url, "--verify")
    assert rc == 0 and "intact: 30 event(s), seq 1..30" in out, out


async def test_verify_finds_a_removed_and_a_forged_event(server):
    from nats.js.api import StreamConfig
    from nats.js.errors import APIError

    bus = await Bus.connect(server.url, "admin")
    try:
        # the privileged path: PLANS as created before it refused deletes (or by an administrator)
        await bus.js.add_stream(StreamConfig(name=subjects.PLANS_STREAM, subjects=[subjects.PLAN_WILDCARD]))
        for i in range(5):
            await publish_event(bus, subjects.PLAN_STATUS, _status(i))
        rc, out = await _audit(server.url, "--verify")
        assert rc == 0 and "intact: 5 event(s)" in out, out

        await bus.js.delete_msg(subjects.PLANS_STREAM, 3)  # erase one event
        rc, out = await _audit(server.url, "--verify")
        assert rc == 1 and "seq 3..3: missing" in out and "seq 4: does not follow seq 2" in out, out

        forged = _status(99).model_copy(update={"prev_event_sha256": "0" * 64})
        await bus.js.publish(subjects.PLAN_STATUS, forged.model_dump_json().encode())  # appended around the chain
        rc, out = await _audit(server.url, "--verify")
        assert rc == 1 and "seq 6: does not follow seq 5" in out, out

        # a planner that starts makes the stream append-only: no further event can be removed
        await ensure_plans_stream(bus, 3600.0)
        with pytest.raises(APIError, match="not permitted"):
            await bus.js.delete_msg(subjects.PLANS_STREAM, 4)
    finally:
        await bus.close()


async def test_plan_ids_stay_unique_across_a_planner_restart(server, tmp_path):
    """The elastic scaler restarted under the same instance name counts its plans from 1 again: each run's ids
    differ, and `janus audit --plan` finds one plan under the first run's id."""
    from planner.elastic_service import ElasticScalerService
    from runtime.service import run_service
    from runtime.settings import ClusterConfig, JanusSettings
    from tests.bus.planner_bus_helpers import fast_planner

    bus = await Bus.connect(server.url, "test")
    await ensure_plans_stream(bus, 3600.0)
    # the scaler plans once it knows a steady plan (none of these models is elastic: no oracle needed)
    await publish_event(bus, subjects.PLAN_STEADY, SteadyPlan(plan_id="s", created_unix_ms=1.0, trigger="startup",
                                                              steady_models=("m",), elastic_models=(), bins=()))
    await bus.close()
    cluster = ClusterConfig.model_validate({"models": [{"name": "m"}],
                                            "planner": fast_planner(heartbeat_timeout_ms=3000, retry_backoff_ms=200)})
    first_ids = []
    for _ in range(2):  # start, publish, stop; start again
        svc = ElasticScalerService(JanusSettings(nats_url=server.url, instance="x", state_dir=tmp_path), cluster)
        task = asyncio.create_task(run_service(svc, install_signals=False))
        for _ in range(200):
            if svc.last_published is not None or task.done():
                break
            await asyncio.sleep(0.05)
        svc.stopped.set()
        await asyncio.wait_for(task, 30)
        assert svc.last_published is not None, "the scaler published no plan"
        first_ids.append(svc.last_published.plan_id)
    assert first_ids[0] != first_ids[1], first_ids
    assert all(i.startswith("elastic-x-") and i.endswith("-000001") for i in first_ids), first_ids
    rc, out = await _audit(server.url, "--all", "--json", "--plan", first_ids[0])
    assert rc == 0 and len(out.splitlines()) == 1, out
    rc, out = await _audit(server.url, "--verify")
    assert rc == 0, out


async def test_a_three_node_cluster_losing_the_plans_leader_keeps_every_event(tmp_path):
    """PLANS takes the cluster's replicas: with the node leading it killed, `janus audit` (the operator, on the other
    nodes) still shows every event, the chain intact, and the planners append on after the election."""
    import json
    import time

    from ops.launcher import nats_cluster
    from runtime.security import generate_credentials, write_nats_config

    creds = generate_credentials()
    conf = write_nats_config(tmp_path / "nats.conf", creds)
    nodes = [node.start() for node in nats_cluster(tmp_path, 3, ["-c", str(conf)])]
    url = ",".join(node.url for node in nodes)
    state = tmp_path / "state"
    state.mkdir()
    (state / "credentials.json").write_text(json.dumps(creds))
    planner = None
    try:
        planner = await Bus.connect(url, "steady-planner", user="steady-planner", password=creds["steady-planner"])
        await ensure_plans_stream(planner, 3600.0, num_replicas=3)  # waits for the cluster's meta leader
        for i in range(10):
            await publish_event(planner, subjects.PLAN_STEADY, _steady(i))
        info = await planner.js.stream_info(subjects.PLANS_STREAM)
        assert info.config.num_replicas == 3
        leader = next(node for node in nodes if node.name == info.cluster.leader)
        leader.kill()
        killed_s = time.monotonic()
        await planner.close()  # it reconnects elsewhere: a new connection to the two left shows that plainly
        rest = ",".join(node.url for node in nodes if node is not leader)
        planner = await Bus.connect(rest, "steady-planner", user="steady-planner", password=creds["steady-planner"])
        while True:  # the remaining two elect a new leader; meanwhile the stream does not answer
            try:
                rc, out = await _audit(rest, "--state-dir", str(state), "--all", "--json")
                if rc == 0 and len(out.splitlines()) == 10:
                    break
            except Exception:  # noqa: BLE001 - no answer during the election
                pass
            assert time.monotonic() - killed_s < 30, "janus audit did not answer within 30 s of losing a node"
            await asyncio.sleep(0.5)
        print(f"janus audit showed all 10 events {time.monotonic() - killed_s:.1f} s after the PLANS leader died")
        for i in range(10, 13):  # the planner appends on, the chain continued
            await publish_event(planner, subjects.PLAN_STEADY, _steady(i))
        rc, out = await _audit(rest, "--state-dir", str(state), "--verify")
        assert rc == 0 and "intact: 13 event(s)" in out, out
    finally:
        if planner is not None:
            await planner.close()
        for node in nodes:
            node.stop()

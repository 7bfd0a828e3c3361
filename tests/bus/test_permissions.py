"""Each service's NATS credentials work where its job is, and are refused where it must not go."""
from __future__ import annotations

import asyncio

import nats
import pytest

from runtime.nats_server import EmbeddedNats
from runtime.security import SERVICE_PERMISSIONS, generate_credentials, write_nats_config
from tests.polling import wait_for

# How long an observer is given, once the server has what it must not pass on (a refusal reported, or a flush), to
# show that something got through anyway: nothing should ever come, and nothing marks that nothing will, so a short
# window. It catches a copy that reaches the observer's callback a little later (routed, or copied by a stream); a
# loaded machine can only make it miss one, never fail a right server.
NOTHING_ARRIVES_S = 0.2

# (service, subject it must NOT publish to)
FORBIDDEN_PUBLISH = [
    ("worker", "janus.plan.steady"),
    ("worker", "janus.plan.elastic"),
    ("worker", "janus.worker.other.cmd"),
    ("worker", "janus.req.demo"),
    ("gateway", "janus.worker.w1.cmd"),
    ("gateway", "janus.worker.w1.run"),
    ("gateway", "janus.worker.w1.move"),  # only the dispatcher moves decodes off a draining instance
    ("gateway", "janus.plan.steady"),
    ("gateway", "janus.event.outcome"),  # a forged outcome would skew the attainment the planners act on
    ("dispatcher", "janus.worker.w1.cmd"),
    ("oracle", "janus.plan.steady"),
    ("steady-planner", "janus.worker.w1.cmd"),
    ("elastic-scaler", "janus.plan.steady"),
    ("operator", "janus.worker.w1.cmd"),
    ("operator", "janus.req.demo"),
    ("operator", "janus.worker.w1.move"),
]
ALLOWED_PUBLISH = [
    ("gateway", "janus.req.demo"),
    ("dispatcher", "janus.worker.w1.run"),
    ("dispatcher", "janus.worker.w1.move"),
    ("reconciler", "janus.worker.w1.cmd"),
    ("reconciler", "janus.plan.action"),
    ("reconciler", "janus.plan.status"),
    ("steady-planner", "janus.plan.steady"),
    ("elastic-scaler", "janus.plan.elastic"),
    ("worker", "janus.telemetry.worker.w1"),
    ("worker", "janus.event.outcome"),
]
FORBIDDEN_SUBSCRIBE = [
    ("gateway", "janus.worker.w1.cmd"),
    ("worker", "janus.req.*"),
    ("oracle", "janus.reply.>"),
]


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    d = tmp_path_factory.mktemp("secured")
    creds = generate_credentials()
    conf = write_nats_config(d / "nats.conf", creds)
    server = EmbeddedNats(d / "nats", extra_args=["-c", str(conf)]).start()
    yield server, creds
    server.stop()


async def _connect(server, creds, user, errors):
    async def on_error(exc):
        errors.append(str(exc))

    return await nats.connect(server.url, user=user, password=creds[user], error_cb=on_error,
                              allow_reconnect=False)


async def _observer(server, creds, subject):
    got: asyncio.Queue = asyncio.Queue()
    nc = await _connect(server, creds, "operator", [])

    async def on_msg(msg):
        await got.put(msg.subject)

    await nc.subscribe(subject, cb=on_msg)
    await nc.flush()
    return nc, got


def _refused(errors: list[str]) -> bool:
    """The server reported a permissions violation to the connection whose error callback fills `errors`."""
    return any("permissions violation" in e.lower() for e in errors)


async def test_a_wrong_password_is_refused(secured):
    server, creds = secured
    with pytest.raises(Exception):
        await nats.connect(server.url, user="worker", password="wrong", allow_reconnect=False,
                           max_reconnect_attempts=0, connect_timeout=2)


@pytest.mark.parametrize("user,subject", FORBIDDEN_PUBLISH)
async def test_forbidden_publishes_are_refused(secured, user, subject):
    server, creds = secured
    observer, got = await _observer(server, creds, subject)
    errors: list[str] = []
    nc = await _connect(server, creds, user, errors)
    await nc.publish(subject, b"{}")
    await nc.flush()
    await wait_for(lambda: _refused(errors), timeout_s=5, what=f"the server reporting {user}'s publish refused")
    await asyncio.sleep(NOTHING_ARRIVES_S)
    assert got.empty(), f"{user} reached {subject}"
    await nc.close()
    await observer.close()


@pytest.mark.parametrize("user,subject", ALLOWED_PUBLISH)
async def test_allowed_publishes_arrive(secured, user, subject):
    server, creds = secured
    observer, got = await _observer(server, creds, subject)
    errors: list[str] = []
    nc = await _connect(server, creds, user, errors)
    await nc.publish(subject, b"{}")
    await nc.flush()
    assert await asyncio.wait_for(got.get(), 2) == subject
    assert not errors
    await nc.close()
    await observer.close()


@pytest.mark.parametrize("user,subject", FORBIDDEN_SUBSCRIBE)
async def test_forbidden_subscriptions_are_refused(secured, user, subject):
    server, creds = secured
    errors: list[str] = []
    nc = await _connect(server, creds, user, errors)
    async def ignore(msg):
        pass

    await nc.subscribe(subject, cb=ignore)
    await nc.flush()
    await wait_for(lambda: _refused(errors), timeout_s=5, what=f"the server reporting {user}'s subscription refused")
    await nc.close()


def test_every_service_has_a_user():
    from ops.services import SERVICES

    assert set(SERVICES) <= set(SERVICE_PERMISSIONS)


# where each service's code sends from (the service user that process runs as)
SERVICE_SOURCES = {
    "gateway": ["gateway"],
    "dispatcher": ["dispatcher/service.py"],
    "worker": ["worker"],
    "oracle": ["oracle/service.py"],
    "steady-planner": ["planner/steady_service.py"],
    "elastic-scaler": ["planner/elastic_service.py"],
    "reconciler": ["planner/reconciler_service.py"],
}
_SEND = r"\b(?:publish|request|publish_event|_audit)\((?:[\w.]+, )?subjects\.(\w+)"
_RECEIVE = r"\b(?:subscribe|serve)\((?:[\w.]+, )?subjects\.(\w+)"


def _subjects_sent_from(paths: list[str], pattern: str = _SEND) -> set[str]:
    """The concrete subject each `subjects.X` a service publishes or requests on (or, with _RECEIVE, subscribes
    to) stands for (token functions get a placeholder token)."""
    import inspect
    import re
    from pathlib import Path

    from contracts import subjects

    root = Path(__file__).resolve().parents[2]
    files = [f for p in paths for f in ((root / p).rglob("*.py") if (root / p).is_dir() else [root / p])]
    out = set()
    for f in files:
        for name in re.findall(pattern, f.read_text()):
            attr = getattr(subjects, name)
            out.add(attr(*["x"] * len(inspect.signature(attr).parameters)) if callable(attr) else attr)
    return out


def _nats_match(pattern: str, subject: str) -> bool:
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or (token != "*" and token != s[i]):
            return False
    return len(p) == len(s)


@pytest.mark.parametrize("service", sorted(SERVICE_SOURCES))
def test_every_subject_a_service_sends_on_is_permitted_to_it(service):
    sent = _subjects_sent_from(SERVICE_SOURCES[service])
    allowed = SERVICE_PERMISSIONS[service].publish
    refused = sorted(s for s in sent if not any(_nats_match(p, s) for p in allowed))
    assert not refused, f"{service} sends on {refused}, which its NATS user may not publish to"


@pytest.mark.parametrize("service", sorted(SERVICE_SOURCES))
def test_every_subject_a_service_listens_on_is_permitted_to_it(service):
    listened = _subjects_sent_from(SERVICE_SOURCES[service], _RECEIVE)
    allowed = SERVICE_PERMISSIONS[service].subscribe
    refused = sorted(s for s in listened if not any(_nats_match(p, s) for p in allowed))
    assert not refused, f"{service} subscribes to {refused}, which its NATS user may not subscribe to"


def test_the_subject_scan_finds_what_it_should():
    assert "janus.plan.status" in _subjects_sent_from(SERVICE_SOURCES["reconciler"])
    assert "janus.cancel" in _subjects_sent_from(SERVICE_SOURCES["worker"])
    assert "janus.telemetry.worker.*" in _subjects_sent_from(SERVICE_SOURCES["oracle"], _RECEIVE)
    assert _nats_match("janus.worker.*.cmd", "janus.worker.w1.cmd") and not _nats_match("janus.req.*", "janus.req")
    assert _nats_match("janus.reply.>", "janus.reply.g.r") and not _nats_match("janus.reply.>", "janus.reply")


# --- JetStream: each service reaches only the API subjects of the streams and buckets it needs, by name ---------

JS_TIMEOUT_S = 0.5  # a refused JetStream request gets no answer: the client times out, the server reports why


async def _js_bus(server, creds, user):
    from runtime.bus import Bus

    return await Bus.connect(server.url, user, user=user, password=creds[user])


def _violations(server, user: str) -> list[str]:
    """The server's log lines about `user`'s refused publishes and subscriptions."""
    log = (server.store_dir / "nats-server.log").read_text(errors="replace")
    return [line for line in log.splitlines() if f"user:{user}\"" in line and "Violation" in line]


@pytest.fixture(scope="module")
def js_ready(secured):
    """PLANS (with one chained event) and the `instances` bucket (with one record), as the reconciler sets them up."""
    from contracts import PlanStatus, subjects
    from planner.shell import ensure_plans_stream, publish_event
    from runtime.jetstream import ensure_kv

    server, creds = secured

    async def setup():
        bus = await _js_bus(server, creds, "reconciler")
        await ensure_plans_stream(bus, 3600.0)
        await publish_event(bus, subjects.PLAN_STATUS, PlanStatus(plan_id="p", kind="steady", status="done",
                                                                  unix_ms=1.0))
        kv = await ensure_kv(bus.js, subjects.INSTANCES_BUCKET)
        await kv.put("setup-record", b"{}")
        await bus.close()

    asyncio.run(setup())
    return server, creds


def _republish_to_worker_cmd():
    from nats.js.api import RePublish, StreamConfig

    # the attack of issue 25: a stream that copies what the attacker may publish onto a worker's command subject
    return StreamConfig(name="EVIL", subjects=["janus.req.>", "janus.telemetry.>", "janus.plan.>", "janus.reply.>"],
                        republish=RePublish(src=">", dest="janus.worker.worker-1.cmd"))


# (operation, the API subject it needs): refused for every service user
FORBIDDEN_FOR_ALL = {
    "create a stream republishing to a worker's commands": (
        lambda js: js.add_stream(_republish_to_worker_cmd()), "$JS.API.STREAM.CREATE.EVIL"),
    "delete a PLANS message": (lambda js: js.delete_msg("PLANS", 1), "$JS.API.STREAM.MSG.DELETE.PLANS"),
    "purge PLANS": (lambda js: js.purge_stream("PLANS"), "$JS.API.STREAM.PURGE.PLANS"),
    "delete PLANS": (lambda js: js.delete_stream("PLANS"), "$JS.API.STREAM.DELETE.PLANS"),
    "delete the instances bucket": (lambda js: js.delete_stream("KV_instances"), "$JS.API.STREAM.DELETE.KV_instances"),
    "purge the instances bucket": (lambda js: js.purge_stream("KV_instances"), "$JS.API.STREAM.PURGE.KV_instances"),
    "delete a consumer": (lambda js: js.delete_consumer("PLANS", "any"), "$JS.API.CONSUMER.DELETE.PLANS.any"),
    "list every stream": (lambda js: js.streams_info(), "$JS.API.STREAM.LIST"),
}


def _update_plans(js):
    from nats.js.api import RePublish, StreamConfig

    return js.update_stream(StreamConfig(name="PLANS", subjects=["janus.plan.>"], deny_delete=True, deny_purge=True,
                                         republish=RePublish(src=">", dest="janus.worker.worker-1.cmd")))


def _create_bucket(js):
    from nats.js.api import KeyValueConfig

    return js.create_key_value(KeyValueConfig(bucket="other"))


# refused for the users named (the others need the call: planners configure PLANS, writers create the bucket)
FORBIDDEN_FOR_SOME = {
    "change PLANS": ((_update_plans, "$JS.API.STREAM.UPDATE.PLANS"),
                     ("gateway", "dispatcher", "worker", "oracle", "operator")),
    "create PLANS": ((lambda js: js.add_stream(name="PLANS", subjects=["janus.plan.>"]), "$JS.API.STREAM.CREATE.PLANS"),
                     ("gateway", "dispatcher", "worker", "oracle", "operator")),
    "create a bucket": ((_create_bucket, "$JS.API.STREAM.CREATE.KV_other"), tuple(SERVICE_PERMISSIONS)),
    "create the instances bucket": ((lambda js: js.add_stream(name="KV_instances", subjects=["$KV.instances.>"]),
                                     "$JS.API.STREAM.CREATE.KV_instances"),
                                    ("gateway", "oracle", "steady-planner", "elastic-scaler", "operator")),
    "write the registry": ((lambda js: js.publish("$KV.instances.x", b"{}"), "$KV.instances.x"),
                           ("gateway", "dispatcher", "oracle", "steady-planner", "elastic-scaler", "operator")),
    "append to PLANS": ((lambda js: js.publish("janus.plan.steady", b"{}"), "janus.plan.steady"),
                        ("gateway", "dispatcher", "worker", "oracle", "elastic-scaler", "reconciler", "operator")),
    "take the reconciler's lease": ((lambda js: js.publish("$KV.leases.reconciler", b"{}"), "$KV.leases.reconciler"),
                                    ("gateway", "dispatcher", "worker", "oracle", "steady-planner", "elastic-scaler",
                                     "operator")),
}


def _forbidden_for(user: str) -> dict:
    out = dict(FORBIDDEN_FOR_ALL)
    out.update({what: op for what, (op, users) in FORBIDDEN_FOR_SOME.items() if user in users})
    return out


def test_no_service_gets_the_whole_jetstream_api():
    """Each JetStream API subject a user may publish to names its operation and its stream (no wildcard before the
    stream name), and none of them deletes, purges or lists."""
    for user, perms in SERVICE_PERMISSIONS.items():
        assert ">" not in perms.publish, user
        for subject in perms.publish:
            tokens = subject.split(".")
            if subject.startswith("$JS"):
                named = tokens[:5] if tokens[1:2] == ["API"] else tokens[:3]  # $JS.API.<KIND>.<OP>.<stream> | $JS.x.y
                assert not {"*", ">"} & set(named), (user, subject)
                assert tokens[1] == "API", (user, subject)  # no $JS.ACK / $JS.FC forging: replies go by allow_responses
            for op in ("STREAM.DELETE", "STREAM.PURGE", "STREAM.MSG.DELETE", "CONSUMER.DELETE", "STREAM.NAMES",
                       "STREAM.LIST", "CONSUMER.DURABLE"):
                assert f"$JS.API.{op}" not in subject, (user, subject)


@pytest.mark.parametrize("user", sorted(SERVICE_PERMISSIONS))
async def test_forbidden_jetstream_operations_are_refused(js_ready, user):
    server, creds = js_ready
    errors: list[str] = []
    nc = await _connect(server, creds, user, errors)
    js = nc.jetstream(timeout=JS_TIMEOUT_S)
    observer, got = await _observer(server, creds, "janus.worker.worker-1.cmd")
    ops = _forbidden_for(user)
    outcomes = await asyncio.gather(*(op(js) for op, _ in ops.values()), return_exceptions=True)
    for what, outcome in zip(ops, outcomes):
        assert isinstance(outcome, Exception), f"{user} could {what}"

    def reported(subject: str) -> bool:
        return any(f'publish to "{subject.lower()}"' in e.lower() for e in errors)

    await wait_for(lambda: all(reported(subject) for _, subject in ops.values()), timeout_s=5,
                   what=f"the server reporting each of {user}'s JetStream operations refused")
    # what the attacker may publish, the EVIL stream (not created) would have copied onto the worker's commands
    await nc.publish("janus.req.demo", b"{}")
    await nc.flush()  # the server has it: a stream copying it would do so now
    await asyncio.sleep(NOTHING_ARRIVES_S)
    assert got.empty(), f"{user} reached janus.worker.worker-1.cmd"
    await nc.close()
    await observer.close()


async def test_plans_keeps_every_event(js_ready):
    """Nothing was deleted or purged by the attempts above, and the stream itself refuses it (its configuration)."""
    from nats.js.errors import APIError

    server, creds = js_ready
    bus = await _js_bus(server, creds, "operator")
    info = await bus.js.stream_info("PLANS")
    assert info.state.messages >= 1 and info.state.first_seq == 1
    assert info.config.deny_delete and info.config.deny_purge
    await bus.close()
    plain = EmbeddedNats().start()  # no users at all: only the stream's own configuration stands in the way
    try:
        from planner.shell import ensure_plans_stream, publish_event
        from contracts import PlanStatus, subjects
        from runtime.bus import Bus

        bus = await Bus.connect(plain.url, "anyone")
        await ensure_plans_stream(bus, 3600.0)
        await publish_event(bus, subjects.PLAN_STATUS, PlanStatus(plan_id="p", kind="steady", status="done",
                                                                  unix_ms=1.0))
        with pytest.raises(APIError, match="not permitted"):
            await bus.js.delete_msg("PLANS", 1)
        with pytest.raises(APIError, match="not permitted"):
            await bus.js.purge_stream("PLANS")
        assert (await bus.js.stream_info("PLANS")).state.messages == 1
        await bus.close()
    finally:
        plain.stop()


@pytest.fixture
def fresh_secured(tmp_path):
    """A secured server of its own: the refusals the other tests provoke stay out of its log."""
    creds = generate_credentials()
    conf = write_nats_config(tmp_path / "nats.conf", creds)
    server = EmbeddedNats(tmp_path / "nats", extra_args=["-c", str(conf)]).start()
    yield server, creds
    server.stop()


async def _audit_as_operator(server, creds, state_dir, *args: str) -> tuple[int, str]:
    import io
    import json

    from planner.audit import audit, build_parser

    state_dir.mkdir(exist_ok=True)
    (state_dir / "credentials.json").write_text(json.dumps(creds))
    out = io.StringIO()
    rc = await audit(build_parser().parse_args(["--nats", server.url, "--state-dir", str(state_dir), *args]), out=out)
    return rc, out.getvalue()


async def _watch_until(watcher, key: str) -> set[str]:
    seen: set[str] = set()
    async for entry in watcher:
        if entry is not None:
            seen.add(entry.key)
            if entry.key == key:
                return seen
    return seen


async def test_each_service_does_its_jetstream_work_with_its_own_user(fresh_secured, tmp_path):
    """The JetStream calls each service makes (runtime/jetstream.py, planner/shell.py, the registry watches, the
    status views, janus audit), each with its own NATS user, in the order a cold start may take: none is refused."""
    from types import SimpleNamespace

    from contracts import ElasticPlan, InstanceRecord, PlanAction, SteadyPlan, subjects
    from contracts.lifecycle import InstanceRole, LifecycleAction, ModelState, Pool
    from planner.shell import ensure_plans_stream, last_plan, publish_event
    from runtime.cluster_view import ClusterView
    from runtime.jetstream import ensure_kv, instances_bucket

    server, creds = fresh_secured
    buses = {u: await _js_bus(server, creds, u) for u in SERVICE_PERMISSIONS}
    views = {u: ClusterView() for u in ("gateway", "operator")}
    try:
        for user, view in views.items():  # attached before anyone created the bucket: they wait for it
            await view.attach(buses[user])
        for user in ("steady-planner", "elastic-scaler", "reconciler"):
            await ensure_plans_stream(buses[user], 3600.0)
        steady = SteadyPlan(plan_id="s-1", created_unix_ms=1.0, trigger="startup", steady_models=(),
                            elastic_models=(), bins=())
        await publish_event(buses["steady-planner"], subjects.PLAN_STEADY, steady)
        assert (await last_plan(buses["elastic-scaler"], subjects.PLAN_STEADY, SteadyPlan)).plan_id == "s-1"
        await publish_event(buses["elastic-scaler"], subjects.PLAN_ELASTIC,
                            ElasticPlan(plan_id="e-1", created_unix_ms=2.0, budget_devices=0, num_devices_used=0,
                                        targets=()))
        await publish_event(buses["reconciler"], subjects.PLAN_ACTION,
                            PlanAction(plan_id="e-1", command_id="c", worker_id="w", model="m", instance_id="i",
                                       action=LifecycleAction.ACTIVATE, status="issued", unix_ms=3.0))
        assert (await last_plan(buses["reconciler"], subjects.PLAN_ELASTIC, ElasticPlan)).plan_id == "e-1"
        # the registry: a worker creates and writes it, the dispatcher and the reconciler watch it
        worker_kv = await ensure_kv(buses["worker"].js, subjects.INSTANCES_BUCKET)
        cluster = SimpleNamespace(jetstream_replicas=1)
        watchers = {u: await (await instances_bucket(buses[u].js, cluster)).watchall()
                    for u in ("dispatcher", "reconciler")}
        await worker_kv.put("w-record", b"{}")
        await worker_kv.delete("w-record")
        record = InstanceRecord(instance_id="r-record", model="m", worker_id="w", role=InstanceRole.COLOCATED,
                                pool=Pool.STEADY, state=ModelState.ACTIVE, is_ready=True, updated_unix_ms=4.0)
        reconciler_kv = await instances_bucket(buses["reconciler"].js, cluster)
        await reconciler_kv.put("r-record", record.model_dump_json().encode())
        for user, watcher in watchers.items():
            assert "w-record" in await asyncio.wait_for(_watch_until(watcher, "r-record"), 5), user
            await watcher.stop()
        for user, view in views.items():  # the gateway's status page and `janus status`
            for _ in range(100):
                if "r-record" in view.records:
                    break
                await asyncio.sleep(0.05)
            assert "r-record" in view.records, user
    finally:
        for view in views.values():
            await view.detach()
        for bus in buses.values():
            await bus.close()
    rc, out = await _audit_as_operator(server, creds, tmp_path / "state", "--all", "--json")
    assert rc == 0 and '"plan_id":"e-1"' in out
    rc, out = await _audit_as_operator(server, creds, tmp_path / "state", "--verify")
    assert rc == 0 and "intact: 3 event(s)" in out, out
    refused = {u: _violations(server, u) for u in SERVICE_PERMISSIONS}
    assert not any(refused.values()), refused


async def test_each_planner_campaigns_for_its_own_lease_with_its_own_user(fresh_secured):
    """planner/leader.py with each planner's NATS user: the lease bucket created by the first, each role's lease
    taken and refreshed, nothing refused (and the operator reads the leases)."""
    from planner.leader import Leadership

    server, creds = fresh_secured
    campaigns = []
    for role in ("steady-planner", "elastic-scaler", "reconciler"):
        campaign = Leadership(await _js_bus(server, creds, role), role, f"{role}-0")
        await campaign.start()
        campaigns.append(campaign)
    try:
        await wait_for(lambda: all(c.is_leader() for c in campaigns), timeout_s=10, what="each planner's lease taken")
        # and refreshed a few times: a refresh moves the lease's revision (the bucket's sequence at its last write) on
        revisions: dict[str, set[int]] = {c.role: set() for c in campaigns}

        def refreshed_three_times() -> bool:
            for c in campaigns:
                if c.lease.holds:
                    revisions[c.role].add(c.lease.revision)
            return all(len(revisions[c.role] - {c.epoch}) >= 3 for c in campaigns)

        await wait_for(refreshed_three_times, timeout_s=10, what="each planner's lease refreshed three times")
        assert all(c.is_leader() for c in campaigns)
        operator = await _js_bus(server, creds, "operator")
        kv = await operator.js.key_value("leases")
        assert b"reconciler-0" in (await kv.get("reconciler")).value
        await operator.close()
        for role in ("steady-planner", "elastic-scaler", "reconciler", "operator"):
            assert not _violations(server, role), role
    finally:
        for campaign in campaigns:
            await campaign.stop()
            await campaign.bus.close()

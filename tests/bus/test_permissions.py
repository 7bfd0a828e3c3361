"""Each service's NATS credentials work where its job is, and are refused where it must not go."""
from __future__ import annotations

import asyncio

import nats
import pytest

from runtime.nats_server import EmbeddedNats
from runtime.security import SERVICE_PERMISSIONS, generate_credentials, write_nats_config

# (service, subject it must NOT publish to)
FORBIDDEN_PUBLISH = [
    ("worker", "janus.plan.steady"),
    ("worker", "janus.plan.elastic"),
    ("worker", "janus.worker.other.cmd"),
    ("worker", "janus.req.demo"),
    ("gateway", "janus.worker.w1.cmd"),
    ("gateway", "janus.worker.w1.run"),
    ("gateway", "janus.plan.steady"),
    ("dispatcher", "janus.worker.w1.cmd"),
    ("oracle", "janus.plan.steady"),
    ("steady-planner", "janus.worker.w1.cmd"),
    ("elastic-scaler", "janus.plan.steady"),
    ("operator", "janus.worker.w1.cmd"),
    ("operator", "janus.req.demo"),
]
ALLOWED_PUBLISH = [
    ("gateway", "janus.req.demo"),
    ("dispatcher", "janus.worker.w1.run"),
    ("reconciler", "janus.worker.w1.cmd"),
    ("reconciler", "janus.plan.action"),
    ("reconciler", "janus.plan.status"),
    ("steady-planner", "janus.plan.steady"),
    ("elastic-scaler", "janus.plan.elastic"),
    ("worker", "janus.telemetry.worker.w1"),
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
    await asyncio.sleep(0.2)
    assert got.empty(), f"{user} reached {subject}"
    assert any("permissions violation" in e.lower() for e in errors), errors
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
    await asyncio.sleep(0.2)
    assert any("permissions violation" in e.lower() for e in errors), errors
    await nc.close()


def test_every_service_has_a_user():
    from runtime.services import SERVICES

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

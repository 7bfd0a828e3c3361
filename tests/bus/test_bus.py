"""The typed bus over a real nats-server."""
from __future__ import annotations

import asyncio

import pytest

from contracts import CancelRequest, ErrorCode, HealthReply, SubmitAck
from runtime.bus import Bus, BusError


async def test_publish_subscribe_delivers_typed_payloads(bus_factory):
    a, b = await bus_factory("a"), await bus_factory("b")
    got: asyncio.Queue = asyncio.Queue()

    async def on_cancel(msg: CancelRequest, env) -> None:
        await got.put((msg, env.subject))

    await b.subscribe("test.pubsub", CancelRequest, on_cancel)
    await b.nc.flush()
    await a.publish("test.pubsub", CancelRequest(request_id="r1", reason="because"))
    msg, subject = await asyncio.wait_for(got.get(), 2)
    assert msg == CancelRequest(request_id="r1", reason="because")
    assert subject == "test.pubsub"


async def test_request_reply_and_typed_errors(bus_factory):
    server, client = await bus_factory("server"), await bus_factory("client")

    async def handle(req: CancelRequest, env) -> SubmitAck:
        if req.request_id == "bad":
            raise BusError.of(ErrorCode.OVERLOADED, "too busy", retryable=True)
        return SubmitAck(request_id=req.request_id, status="queued", queue_depth=3)

    await server.serve("test.rr", CancelRequest, handle)
    await server.nc.flush()
    ack = await client.request("test.rr", CancelRequest(request_id="ok"), SubmitAck)
    assert ack.status == "queued" and ack.queue_depth == 3
    with pytest.raises(BusError) as err:
        await client.request("test.rr", CancelRequest(request_id="bad"), SubmitAck)
    assert err.value.error.code == ErrorCode.OVERLOADED and err.value.error.retryable


async def test_no_responders_and_timeouts_are_typed(bus_factory):
    bus = await bus_factory()
    with pytest.raises(BusError) as err:
        await bus.request("test.nobody", CancelRequest(request_id="x"), SubmitAck, timeout_s=1)
    assert err.value.error.code == ErrorCode.UNAVAILABLE

    async def slow(req, env):
        await asyncio.sleep(1)
        return SubmitAck(request_id="x", status="queued")

    await bus.serve("test.slow", CancelRequest, slow)
    with pytest.raises(BusError) as err:
        await bus.request("test.slow", CancelRequest(request_id="x"), SubmitAck, timeout_s=0.1)
    assert err.value.error.code == ErrorCode.TIMEOUT


async def test_malformed_and_oversized_messages_are_refused_and_serving_goes_on(bus_factory):
    server, client = await bus_factory("server"), await bus_factory("client")

    async def handle(req: CancelRequest, env) -> SubmitAck:
        return SubmitAck(request_id=req.request_id, status="queued")

    await server.serve("test.strict", CancelRequest, handle, max_message_bytes=200)
    await server.nc.flush()
    for bad in (b"{not json", b'{"request_id": 5}', b'{"request_id": "a", "surprise": 1}'):
        with pytest.raises(BusError) as err:
            await client.request("test.strict", bad, SubmitAck)
        assert err.value.error.code == ErrorCode.MALFORMED_MESSAGE
    with pytest.raises(BusError) as err:
        await client.request("test.strict", CancelRequest(request_id="x" * 300), SubmitAck)
    assert err.value.error.code == ErrorCode.PAYLOAD_TOO_LARGE
    ok = await client.request("test.strict", CancelRequest(request_id="fine"), SubmitAck)
    assert ok.request_id == "fine"
    assert server.num_malformed == 4


async def test_payload_over_server_limit_is_typed_before_sending(bus_factory):
    bus = await bus_factory()
    with pytest.raises(BusError) as err:
        await bus.publish("test.big", b"x" * (bus.nc.max_payload + 1))
    assert err.value.error.code == ErrorCode.PAYLOAD_TOO_LARGE


async def test_handler_exception_becomes_internal_error(bus_factory):
    server, client = await bus_factory("server"), await bus_factory("client")

    async def broken(req, env):
        raise ValueError("boom")

    await server.serve("test.broken", CancelRequest, broken)
    with pytest.raises(BusError) as err:
        await client.request("test.broken", CancelRequest(request_id="x"), SubmitAck)
    assert err.value.error.code == ErrorCode.INTERNAL and "boom" in err.value.error.message


async def test_trace_context_crosses_the_bus(bus_factory, span_exporter):
    from runtime.tracing import tracer

    a, b = await bus_factory("sender"), await bus_factory("receiver")
    seen: asyncio.Queue = asyncio.Queue()

    async def on_msg(msg, env):
        from opentelemetry import trace

        await seen.put(trace.get_current_span().get_span_context().trace_id)

    await b.subscribe("test.trace", CancelRequest, on_msg)
    await b.nc.flush()
    with tracer("test").start_as_current_span("origin") as span:
        await a.publish("test.trace", CancelRequest(request_id="t"))
        origin_trace = span.get_span_context().trace_id
    assert await asyncio.wait_for(seen.get(), 2) == origin_trace


async def test_bus_reconnects_after_server_restart(tmp_path):
    from runtime.nats_server import EmbeddedNats

    server = EmbeddedNats(tmp_path / "nats").start()
    try:
        sub_bus = await Bus.connect(server.url, "sub")
        pub_bus = await Bus.connect(server.url, "pub")
        got: asyncio.Queue = asyncio.Queue()

        async def on_msg(msg, env):
            await got.put(msg.request_id)

        await sub_bus.subscribe("test.reconnect", CancelRequest, on_msg)
        await sub_bus.nc.flush()
        server.restart()
        for _ in range(100):  # both clients find the restarted server on the same port
            if sub_bus.num_reconnects and pub_bus.num_reconnects:
                break
            await asyncio.sleep(0.1)
        assert sub_bus.num_reconnects == 1 and pub_bus.num_reconnects == 1
        await sub_bus.nc.flush()
        await pub_bus.publish("test.reconnect", CancelRequest(request_id="after-restart"))
        assert await asyncio.wait_for(got.get(), 5) == "after-restart"
        await sub_bus.close()
        await pub_bus.close()
    finally:
        server.stop()


async def test_health_of_a_running_service(nats_url, bus_factory):
    from runtime.service import Service, run_service
    from runtime.settings import ClusterConfig, JanusSettings

    class Idle(Service):
        name = "idle"

        async def start(self, bus):
            pass

    svc = Idle(JanusSettings(nats_url=nats_url, instance="idle-1"), ClusterConfig())
    task = asyncio.create_task(run_service(svc, install_signals=False))
    client = await bus_factory()
    from contracts import subjects

    for _ in range(50):
        try:
            reply = await client.request(subjects.health("idle", "idle-1"), None, HealthReply, timeout_s=0.2)
            break
        except BusError:
            await asyncio.sleep(0.05)
    assert reply.service == "idle" and reply.status == "ok"
    svc.stopped.set()
    await asyncio.wait_for(task, 5)


async def test_a_bucket_made_with_another_ttl_gets_the_ttl_asked(bus_factory):
    """A lease policy changed since the `leases` bucket was made: its entries must expire after the new TTL, or a
    dead leader's lease outlives the policy (planner/leader.py)."""
    from runtime.jetstream import ensure_kv

    bus = await bus_factory("ttl-test")
    bucket = "ttl_test"
    try:
        await bus.js.delete_key_value(bucket)
    except Exception:  # noqa: BLE001 - not there yet
        pass
    await ensure_kv(bus.js, bucket, ttl_s=10.0)
    assert (await (await bus.js.key_value(bucket)).status()).ttl == pytest.approx(10.0)
    await ensure_kv(bus.js, bucket, ttl_s=4.0)
    assert (await (await bus.js.key_value(bucket)).status()).ttl == pytest.approx(4.0)
    kv = await ensure_kv(bus.js, bucket, ttl_s=4.0)  # as asked already: left alone
    await kv.put("k", b"v")
    assert (await kv.get("k")).value == b"v"

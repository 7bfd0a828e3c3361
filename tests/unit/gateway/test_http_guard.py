"""The gateway's HTTP guard: the body limit holds while reading (chunked bodies too), the API key is checked before
any body byte is read, a body that stalls gets 408, and (on a real uvicorn server and real sockets) headers that
never finish lose the connection and connections past the cap get 503 at once."""
from __future__ import annotations

import asyncio
import contextlib
import json
import time

import pytest
import uvicorn

from gateway.http_guard import BodyGuard, guarded_h11
from tests.polling import wait_for

CHUNK = b"x" * 65536


class _App:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.later: list[dict] = []

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        message = await receive()
        self.bodies.append(message["body"])
        if scope["path"] == "/wait-disconnect":
            self.later.append(await receive())
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})


def _scope(headers: dict[str, str] | None = None, method: str = "POST", path: str = "/v1/completions") -> dict:
    return {"type": "http", "method": method, "path": path,
            "headers": [(k.encode(), v.encode()) for k, v in (headers or {}).items()]}


class _Client:
    """An ASGI client side: chunks to receive, what was sent back."""

    def __init__(self, chunks, *, then_disconnect: bool = True) -> None:
        self._chunks = iter(chunks)
        self.num_received = 0
        self.sent: list[dict] = []
        self._then_disconnect = then_disconnect

    async def receive(self) -> dict:
        self.num_received += 1
        try:
            body, more = next(self._chunks)
        except StopIteration:
            if not self._then_disconnect:
                await asyncio.sleep(3600)
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": body, "more_body": more}

    async def send(self, message: dict) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int:
        return self.sent[0]["status"]

    def error(self) -> dict:
        return json.loads(self.sent[1]["body"])["error"]


def _guard(app, *, limit: int = 1 << 20, timeout_s: float = 5.0, authorized: bool = True) -> BodyGuard:
    return BodyGuard(app, max_request_bytes=limit, body_timeout_s=timeout_s, authorize=lambda scope: authorized)


def _chunked(num_bytes: int):
    num_chunks = num_bytes // len(CHUNK)
    return ((CHUNK, k < num_chunks - 1) for k in range(num_chunks))


async def test_a_chunked_body_over_the_limit_is_refused_while_reading():
    app = _App()
    client = _Client(_chunked(10 << 20))  # 10 MB, no Content-Length
    await _guard(app, limit=1 << 20)(_scope(), client.receive, client.send)
    assert client.status == 413 and client.error()["code"] == "payload_too_large"
    assert app.bodies == []
    # it stopped reading just past 1 MiB: 16 chunks of 64 KiB fit, the 17th is one too many
    assert client.num_received == 17
    assert dict(client.sent[0]["headers"])[b"connection"] == b"close"


async def test_a_declared_length_over_the_limit_is_refused_before_reading():
    client = _Client(_chunked(2 << 20))
    await _guard(_App(), limit=1 << 20)(_scope({"content-length": str(2 << 20)}), client.receive, client.send)
    assert client.status == 413 and client.num_received == 0


async def test_without_a_valid_key_nothing_of_the_body_is_read():
    client = _Client(_chunked(1 << 20))
    await _guard(_App(), authorized=False)(_scope(), client.receive, client.send)
    assert client.status == 401 and client.error()["type"] == "authentication_error"
    assert client.num_received == 0


async def test_a_stalled_body_gets_408():
    client = _Client([(b"{", True)], then_disconnect=False)
    started = time.monotonic()
    await _guard(_App(), timeout_s=0.2)(_scope(), client.receive, client.send)
    assert client.status == 408 and time.monotonic() - started < 2.0


async def test_the_body_is_replayed_whole_and_a_later_disconnect_passes_through():
    app = _App()
    client = _Client([(b'{"a":', True), (b' 1}', False)])
    await _guard(app)(_scope(path="/wait-disconnect"), client.receive, client.send)
    assert app.bodies == [b'{"a": 1}'] and app.later == [{"type": "http.disconnect"}]
    assert client.status == 200


async def test_requests_without_a_body_pass_untouched():
    app = _App()
    client = _Client([(b"", False)])
    await _guard(app, authorized=False)(_scope(method="GET", path="/health"), client.receive, client.send)
    assert client.status == 200


@contextlib.asynccontextmanager
async def _server(*, header_timeout_s: float, max_connections: int):
    config = uvicorn.Config(_App(), host="127.0.0.1", port=0, log_level="error", lifespan="off",
                            http=guarded_h11(header_timeout_s=header_timeout_s, max_connections=max_connections))
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield server, server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        await task


async def _closed_within(reader: asyncio.StreamReader, timeout_s: float) -> bytes:
    return await asyncio.wait_for(reader.read(), timeout=timeout_s)  # read() returns at EOF


async def test_headers_that_never_finish_lose_the_connection():
    async with _server(header_timeout_s=0.3, max_connections=100) as (_, port):
        idle_r, idle_w = await asyncio.open_connection("127.0.0.1", port)  # sends nothing at all
        half_r, half_w = await asyncio.open_connection("127.0.0.1", port)
        half_w.write(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n")  # and never the blank line
        await half_w.drain()
        started = time.monotonic()
        assert await _closed_within(idle_r, 2.0) == b""
        assert await _closed_within(half_r, 2.0) == b""
        assert time.monotonic() - started < 1.5
        # a request sent in time is served, and the next one on the same connection is timed again
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        await w.drain()
        assert (await asyncio.wait_for(r.readuntil(b"ok"), 2.0)).startswith(b"HTTP/1.1 200")
        w.write(b"GET / HTTP/1.1\r\n")
        await w.drain()
        assert await _closed_within(r, 2.0) == b""
        for writer in (idle_w, half_w, w):
            writer.close()


async def test_connections_past_the_cap_get_503_at_once():
    async with _server(header_timeout_s=10.0, max_connections=3) as (server, port):
        connections = server.server_state.connections
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        await wait_for(lambda: len(connections) == 3, timeout_s=5, what="the server holding the three connections")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        answer = await _closed_within(reader, 2.0)
        assert answer.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in answer.lower()
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "overloaded"
        writer.close()
        for _, w in held:
            w.close()
        await wait_for(lambda: not connections, timeout_s=5, what="the server dropping the closed connections")
        # the held ones gone, a new connection is served again
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        await w.drain()
        assert (await asyncio.wait_for(r.readuntil(b"ok"), 2.0)).startswith(b"HTTP/1.1 200")
        w.close()


@pytest.fixture(autouse=True)
def _quiet_uvicorn(caplog):
    caplog.set_level("ERROR", logger="uvicorn")


async def test_a_refused_body_still_sending_gets_its_413_not_a_reset():
    guarded = _guard(_App(), limit=1 << 20)
    config = uvicorn.Config(guarded, host="127.0.0.1", port=0, log_level="error", lifespan="off",
                            http=guarded_h11(header_timeout_s=10.0, max_connections=100))
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        for _ in range(5):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n")

            async def feed() -> None:
                for _ in range(160):  # 10 MiB, as fast as the server takes it
                    writer.write(b"%x\r\n%s\r\n" % (len(CHUNK), CHUNK))
                    await writer.drain()

            feeding = asyncio.create_task(feed())
            answer = await asyncio.wait_for(reader.read(), timeout=5.0)  # to EOF: no ConnectionResetError
            feeding.cancel()
            await asyncio.gather(feeding, return_exceptions=True)
            writer.close()
            assert answer.startswith(b"HTTP/1.1 413"), answer[:100]
    finally:
        server.should_exit = True
        await task

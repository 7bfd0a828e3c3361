"""What the gateway does before the app sees a request: connection cap, header timeout, API key, body size and
body timeout. Each refusal costs the gateway no more than the bytes it has already read.

`BodyGuard` is a plain ASGI middleware (not Starlette's BaseHTTPMiddleware, which wraps `receive` and hid client
disconnects from non-streaming handlers). It reads the body itself, counting while it reads, so a chunked body is
refused with 413 as soon as it passes the limit instead of being read whole; it replays the body to the app and
passes every later `receive` (a disconnect) straight through.

`guarded_h11` is uvicorn's h11 protocol with three additions uvicorn lacks: a connection that does not finish its
request headers within `header_timeout_s` is closed (slowloris; uvicorn's keep-alive timer only runs after a first
response), a connection beyond `max_connections` is answered 503 at once and closed, and a connection closed while
the client is still sending its body closes lingering (RFC 9112 section 9.6): the answer is followed by a FIN, what
still comes in is read and dropped for up to LINGER_S, and only then the socket closes. Closing it at once, with
unread bytes in the kernel's buffer, sends a reset that makes most clients lose the 413 they were just sent.
"""
from __future__ import annotations

import asyncio
import json
from typing import Awaitable, Callable

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from contracts import ErrorCode

from .core.errors import error_body, retry_headers, status_of

LINGER_S = 2.0  # at most this long to drain a refused body after the answer (the client stops once it reads it)
# methods whose body the app reads; others pass through untouched
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
Authorize = Callable[[dict], bool]  # scope -> may this request go on (checked before any body byte is read)


class BodyGuard:
    def __init__(self, app, *, max_request_bytes: int, body_timeout_s: float, authorize: Authorize) -> None:
        self.app = app
        self.max_request_bytes = max_request_bytes
        self.body_timeout_s = body_timeout_s
        self.authorize = authorize

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        if not self.authorize(scope):
            await _refuse(send, ErrorCode.UNAUTHORIZED, "a valid API key is required (Authorization: Bearer <key>)")
            return
        length = _header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_request_bytes:
            await _refuse(send, ErrorCode.PAYLOAD_TOO_LARGE,
                          f"the body has {length} bytes; at most {self.max_request_bytes}")
            return
        body = await self._read(receive, send)
        if body is None:
            return
        await self.app(scope, _replay(body, receive), send)

    async def _read(self, receive, send) -> bytes | None:
        """The whole body, or None once a refusal went out (or the client left)."""
        parts: list[bytes] = []
        num_bytes = 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), timeout=self.body_timeout_s)
            except asyncio.TimeoutError:
                await _refuse(send, ErrorCode.TIMEOUT, f"the body did not arrive within {self.body_timeout_s:g} s",
                              status=408)
                return None
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            num_bytes += len(chunk)
            if num_bytes > self.max_request_bytes:
                parts.clear()  # drop what was read before answering: nothing of a refused body stays
                await _refuse(send, ErrorCode.PAYLOAD_TOO_LARGE,
                              f"the body has more than {self.max_request_bytes} bytes (the limit)")
                return None
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)


def _replay(body: bytes, receive) -> Callable[[], Awaitable[dict]]:
    sent = False

    async def replay() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: the client's disconnect, when it comes

    return replay


def _header(scope: dict, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


def _response_bytes(code: ErrorCode, message: str, status: int | None = None) -> tuple[int, list, bytes]:
    status = status or status_of(code)
    body = json.dumps(error_body(code, message)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"connection", b"close")]  # the rest of a refused body is never read: the connection cannot go on
    headers += [(k.lower().encode(), v.encode()) for k, v in retry_headers(status).items()]
    return status, headers, body


async def _refuse(send, code: ErrorCode, message: str, *, status: int | None = None) -> None:
    status, headers, body = _response_bytes(code, message, status)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def guarded_h11(*, header_timeout_s: float, max_connections: int) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a header timeout and a connection cap (see the module docstring)."""

    class GuardedH11Protocol(H11Protocol):
        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(_LingeringTransport(transport, self))
            self._header_timer: asyncio.TimerHandle | None = None
            self._cycle_seen = None
            if len(self.connections) > max_connections:
                status, headers, body = _response_bytes(
                    ErrorCode.OVERLOADED, f"the gateway holds {max_connections} connections (its limit)")
                head = b"HTTP/1.1 %d Service Unavailable\r\n" % status
                head += b"".join(k + b": " + v + b"\r\n" for k, v in headers)
                transport.write(head + b"\r\n" + body)
                transport.close()
                return
            self._arm_header_timer()

        def _arm_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            self._header_timer = self.loop.call_later(header_timeout_s, self._headers_too_slow)

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                self.transport.close()

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not None and self.cycle is not self._cycle_seen:
                self._cycle_seen = self.cycle  # a request's headers are in: the header clock stops
                if self._header_timer is not None:
                    self._header_timer.cancel()
                    self._header_timer = None

        def is_reading_a_body(self) -> bool:
            return self.conn.their_state is h11.SEND_BODY

        def data_received(self, data: bytes) -> None:
            if self.transport.is_lingering:
                return  # the rest of a refused body: dropped
            # idle between requests is the keep-alive timeout's; a next request begun but never finished is ours
            if self._header_timer is None and (self.cycle is None or self.cycle.response_complete):
                self._arm_header_timer()
            super().data_received(data)

        def connection_lost(self, exc) -> None:
            if getattr(self, "_header_timer", None) is not None:
                self._header_timer.cancel()
                self._header_timer = None
            self.transport.stop_lingering()
            super().connection_lost(exc)

    return GuardedH11Protocol


class _LingeringTransport:
    """The socket's transport, as uvicorn's protocol sees it, with a lingering close (see the module docstring)."""

    def __init__(self, transport: asyncio.Transport, protocol) -> None:
        self._transport = transport
        self._protocol = protocol
        self.is_lingering = False
        self._timer: asyncio.TimerHandle | None = None

    def __getattr__(self, name: str):
        return getattr(self._transport, name)

    def is_closing(self) -> bool:
        return self.is_lingering or self._transport.is_closing()

    def close(self) -> None:
        if self.is_lingering or self._transport.is_closing():
            return
        if not self._protocol.is_reading_a_body() or not self._transport.can_write_eof():
            self._transport.close()
            return
        self.is_lingering = True
        self._transport.write_eof()  # after the answer already written: the client reads it, then EOF
        self._transport.resume_reading()  # uvicorn may have paused reading while the app did not read
        self._timer = asyncio.get_running_loop().call_later(LINGER_S, self._transport.close)

    def stop_lingering(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

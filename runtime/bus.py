"""A small typed bus over nats-py: pydantic payloads, typed errors in reply headers, trace context in headers.

    bus = await Bus.connect(url, service="dispatcher")
    await bus.subscribe(subjects.REQ_WILDCARD, GenerateRequest, on_request, queue=subjects.DISPATCH_QUEUE)
    reply = await bus.request(subjects.ORACLE_CAPACITY, query, CapacityReply)

Handlers are coroutines (nats-py requires it) taking (payload, Envelope). An error reply has an empty-looking body
holding an ErrorInfo and the header `Janus-Error`; `request` turns it into BusError. A malformed or oversized
message is answered with a typed error (when it has a reply subject) and never stops the subscription.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Awaitable, Callable, Mapping, TypeVar

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import MaxPayloadError, NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from pydantic import BaseModel, TypeAdapter, ValidationError

from contracts import ErrorCode, ErrorInfo

from . import tracing

log = logging.getLogger("janus.bus")

T = TypeVar("T")
ERROR_HEADER = "Janus-Error"
NO_RESPONDER_RETRY_S = 0.05
FIRST_CONNECT_TIMEOUT_S = 60.0  # a service (or tool) that cannot reach NATS at all says so instead of waiting forever
# A server whose machine went silent (a cut link, a lost host: no reset arrives) is noticed only by unanswered
# pings; nats-py's default (one every 120 s, two missed) left a client stuck on it for 4-6 minutes. Here 4-6 s, then
# it fails over to another node of the cluster (tests/e2e/test_multi_host.py; docs/operations.md, "Several machines").
PING_INTERVAL_S = 2.0
MAX_OUTSTANDING_PINGS = 2
MAX_REMEMBERED_ERRORS = 16
Handler = Callable[[Any, "Envelope"], Awaitable[None]]
ReplyHandler = Callable[[Any, "Envelope"], Awaitable[BaseModel]]


class BusError(Exception):
    """A typed error from the bus or from the service that answered."""

    def __init__(self, error: ErrorInfo) -> None:
        super().__init__(f"{error.code}: {error.message}")
        self.error = error

    @classmethod
    def of(cls, code: ErrorCode, message: str, *, retryable: bool = False, **detail: str) -> "BusError":
        return cls(ErrorInfo(code=code, message=message, retryable=retryable, detail=detail))


@dataclass(frozen=True)
class Envelope:
    subject: str
    reply: str
    headers: Mapping[str, str]
    num_bytes: int


@lru_cache(maxsize=None)
def _adapter(tp: Any) -> TypeAdapter:
    return TypeAdapter(tp)


def encode(payload: BaseModel | bytes | None) -> bytes:
    if payload is None:
        return b""
    if isinstance(payload, bytes):
        return payload
    return payload.model_dump_json().encode()


def decode(tp: Any, data: bytes) -> Any:
    if tp is None:  # the subject carries no payload (health probes)
        return None
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp.model_validate_json(data)
    if isinstance(tp, TypeAdapter):
        return tp.validate_json(data)
    return _adapter(tp).validate_json(data)


def _error_payload(err: ErrorInfo) -> tuple[bytes, dict[str, str]]:
    return err.model_dump_json().encode(), {ERROR_HEADER: err.code.value}


class Bus:
    """One NATS connection of one service. `service` names the spans it makes."""

    def __init__(self, nc: NatsClient, service: str, *, max_payload_bytes: int | None = None) -> None:
        self.nc = nc
        self.service = service
        self._tracer = tracing.tracer(f"janus.{service}")
        self._subs: list[Any] = []
        self.max_payload_bytes = max_payload_bytes
        self.num_malformed = 0
        self.num_reconnects = 0
        self.is_closing = False

    @classmethod
    async def connect(cls, url: str, service: str, *, name: str | None = None, user: str | None = None,
                      password: str | None = None, tls: Any = None, connect_timeout_s: float = 5.0,
                      first_connect_timeout_s: float | None = FIRST_CONNECT_TIMEOUT_S, **options: Any) -> "Bus":
        """Connect with endless reconnects: a restarted nats-server is found again on its own. The first connection
        is tried again and again too (`connect_timeout_s` each), but for `first_connect_timeout_s` at most: past
        that, ConnectionError names the server and the last error (None: keep trying)."""
        holder: list[Bus] = []
        errors: list[Exception] = []

        async def on_error(exc: Exception) -> None:
            errors.append(exc)
            del errors[:-MAX_REMEMBERED_ERRORS]
            if not (holder and holder[0].is_closing):
                log.warning("%s: nats error: %s", service, exc)

        async def on_disconnect() -> None:
            if not (holder and holder[0].is_closing):
                log.warning("%s: disconnected from nats", service)

        async def on_reconnect() -> None:
            log.info("%s: reconnected to nats", service)
            if holder:
                holder[0].num_reconnects += 1

        nc = NatsClient()
        connecting = asyncio.ensure_future(nc.connect(
            servers=url.split(","), name=name or f"janus-{service}", user=user, password=password, tls=tls,
            allow_reconnect=True, max_reconnect_attempts=-1, reconnect_time_wait=0.25,
            connect_timeout=connect_timeout_s, error_cb=on_error, disconnected_cb=on_disconnect,
            reconnected_cb=on_reconnect, **{"ping_interval": PING_INTERVAL_S,
                                            "max_outstanding_pings": MAX_OUTSTANDING_PINGS, **options}))
        try:
            await asyncio.wait({connecting}, timeout=first_connect_timeout_s)
        finally:
            if not connecting.done():  # past the deadline, or we are cancelled (asked to stop)
                await _give_up_connecting(nc, connecting, connect_timeout_s)
        failure = None if connecting.cancelled() else connecting.exception()
        if connecting.cancelled() or failure is not None:  # given up on past the deadline, or refused for good
            await _close_quietly(nc)
            last = most_telling_error(errors) if errors else failure
            within = f" within {first_connect_timeout_s:g} s" if first_connect_timeout_s is not None else ""
            raise ConnectionError(f"{service}: no connection to NATS at {url}{within} (last error: {last})")
        bus = cls(nc, service)
        holder.append(bus)
        return bus

    @property
    def js(self):
        return self.nc.jetstream()

    def _check_size(self, data: bytes, subject: str) -> None:
        limit = self.nc.max_payload if self.nc.is_connected else None
        if limit and len(data) > limit:
            raise BusError.of(ErrorCode.PAYLOAD_TOO_LARGE, f"{len(data)} bytes for {subject} exceed the server's "
                              f"limit of {limit} bytes")

    async def publish(self, subject: str, payload: BaseModel | bytes | None, *,
                      headers: dict[str, str] | None = None, propagate: bool = True) -> None:
        data = encode(payload)
        self._check_size(data, subject)
        hdrs = tracing.inject_headers(dict(headers or {})) if propagate else headers
        await self.nc.publish(subject, data, headers=hdrs or None)

    async def request(self, subject: str, payload: BaseModel | bytes | None, reply_type: Any, *,
                      timeout_s: float = 2.0, headers: dict[str, str] | None = None) -> Any:
        """Send and wait for one typed reply; raises BusError (UNAVAILABLE, TIMEOUT or the replier's error)."""
        data = encode(payload)
        self._check_size(data, subject)
        hdrs = tracing.inject_headers(dict(headers or {}))
        try:
            try:
                msg = await self.nc.request(subject, data, timeout=timeout_s, headers=hdrs or None)
            except NoRespondersError:
                # Asked once more, NO_RESPONDER_RETRY_S later: nats-server now and then answers "no responders"
                # for a subscription it has already confirmed (a flushed SUB on another connection; seen in ~2 % of
                # requests right after the replier subscribed). Safe to send again: a 503 means nobody got it. A
                # service that is really away still fails, 50 ms later.
                await asyncio.sleep(NO_RESPONDER_RETRY_S)
                msg = await self.nc.request(subject, data, timeout=timeout_s, headers=hdrs or None)
        except NoRespondersError:
            raise BusError.of(ErrorCode.UNAVAILABLE, f"no service answers on {subject}", retryable=True) from None
        except (NatsTimeoutError, asyncio.TimeoutError):
            raise BusError.of(ErrorCode.TIMEOUT, f"no reply on {subject} within {timeout_s} s",
                              retryable=True) from None
        except MaxPayloadError as exc:
            raise BusError.of(ErrorCode.PAYLOAD_TOO_LARGE, str(exc)) from None
        if msg.headers and ERROR_HEADER in msg.headers:
            raise BusError(ErrorInfo.model_validate_json(msg.data))
        try:
            return decode(reply_type, msg.data)
        except ValidationError as exc:
            raise BusError.of(ErrorCode.MALFORMED_MESSAGE, f"malformed reply on {subject}: {exc}") from None

    async def respond_error(self, reply: str, error: ErrorInfo) -> None:
        data, hdrs = _error_payload(error)
        await self.nc.publish(reply, data, headers=hdrs)

    async def subscribe(self, subject: str, payload_type: Any, handler: Handler, *, queue: str = "",
                        traced: bool = True, max_message_bytes: int | None = None,
                        pending_msgs_limit: int = 512 * 1024) -> Any:
        """Deliver decoded payloads to `handler(payload, envelope)`. Bad messages are counted, answered with a
        typed error when they carry a reply subject, and never stop the subscription."""

        async def on_msg(msg: Msg) -> None:
            env = Envelope(msg.subject, msg.reply, msg.headers or {}, len(msg.data))
            payload = await self._decode_or_refuse(msg, payload_type, env, max_message_bytes)
            if payload is _REFUSED:
                return
            if not traced:
                await self._call(handler, payload, env, msg)
                return
            ctx = tracing.extract_context(env.headers)
            with self._tracer.start_as_current_span(f"{self.service} {_span_subject(msg.subject)}", context=ctx,
                                                    kind=SpanKind.CONSUMER):
                await self._call(handler, payload, env, msg)

        sub = await self.nc.subscribe(subject, queue=queue, cb=on_msg, pending_msgs_limit=pending_msgs_limit)
        self._subs.append(sub)
        await self._flush_interest()
        return sub

    async def _flush_interest(self) -> None:
        """Return only once the server knows of the subscription, so a request sent next finds it."""
        if self.nc.is_connected:
            try:
                await self.nc.flush(timeout=2)
            except Exception:  # noqa: BLE001 - reconnecting: the subscription is replayed on reconnect
                pass

    async def serve(self, subject: str, request_type: Any, handler: ReplyHandler, *, queue: str = "",
                    max_message_bytes: int | None = None) -> Any:
        """Request/reply: the handler's return value is the reply; a BusError it raises becomes an error reply,
        any other exception an INTERNAL one (logged)."""

        async def on_msg(msg: Msg) -> None:
            env = Envelope(msg.subject, msg.reply, msg.headers or {}, len(msg.data))
            payload = await self._decode_or_refuse(msg, request_type, env, max_message_bytes)
            if payload is _REFUSED:
                return
            ctx = tracing.extract_context(env.headers)
            with self._tracer.start_as_current_span(f"{self.service} {_span_subject(msg.subject)}", context=ctx,
                                                    kind=SpanKind.SERVER) as span:
                try:
                    reply = await handler(payload, env)
                except BusError as exc:
                    span.set_status(Status(StatusCode.ERROR, exc.error.message))
                    if msg.reply:
                        await self.respond_error(msg.reply, exc.error)
                    return
                except Exception as exc:  # noqa: BLE001 - the caller gets a typed error, the log the trace
                    log.exception("%s: handler for %s failed", self.service, msg.subject)
                    span.record_exception(exc)
                    if msg.reply:
                        await self.respond_error(msg.reply, ErrorInfo(code=ErrorCode.INTERNAL, message=str(exc)))
                    return
                if msg.reply:
                    await self.nc.publish(msg.reply, encode(reply), headers=tracing.inject_headers({}) or None)

        sub = await self.nc.subscribe(subject, queue=queue, cb=on_msg)
        self._subs.append(sub)
        await self._flush_interest()
        return sub

    async def _decode_or_refuse(self, msg: Msg, tp: Any, env: Envelope, max_bytes: int | None) -> Any:
        if max_bytes is not None and env.num_bytes > max_bytes:
            err = ErrorInfo(code=ErrorCode.PAYLOAD_TOO_LARGE,
                            message=f"{env.num_bytes} bytes on {msg.subject} exceed {max_bytes}")
        else:
            try:
                return decode(tp, msg.data)
            except ValidationError as exc:
                err = ErrorInfo(code=ErrorCode.MALFORMED_MESSAGE,
                                message=f"malformed message on {msg.subject}: {_short(exc)}")
        self.num_malformed += 1
        log.warning("%s: refused a message on %s: %s", self.service, msg.subject, err.message)
        if msg.reply:
            await self.respond_error(msg.reply, err)
        return _REFUSED

    async def _call(self, handler: Handler, payload: Any, env: Envelope, msg: Msg) -> None:
        try:
            await handler(payload, env)
        except BusError as exc:
            trace.get_current_span().set_status(Status(StatusCode.ERROR, exc.error.message))
            if msg.reply:
                await self.respond_error(msg.reply, exc.error)
        except Exception:  # noqa: BLE001 - one bad message must not end the subscription
            log.exception("%s: handler for %s failed", self.service, msg.subject)
            if msg.reply:
                await self.respond_error(msg.reply, ErrorInfo(code=ErrorCode.INTERNAL, message="handler failed"))

    async def unsubscribe_all(self) -> None:
        subs, self._subs = self._subs, []
        for sub in subs:
            try:
                await sub.unsubscribe()
            except Exception:  # noqa: BLE001 - already gone with a closed connection
                pass

    async def close(self) -> None:
        """Stop taking messages, flush what was published, close."""
        self.is_closing = True
        await self.unsubscribe_all()
        if self.nc.is_connected:
            try:
                await self.nc.drain()
            except Exception:  # noqa: BLE001
                await self.nc.close()
        elif not self.nc.is_closed:
            await self.nc.close()


def most_telling_error(errors: list[Exception]) -> Exception:
    """The error a failed first connection reports: a refused login if any attempt saw one, else the last error.
    nats-server answers a wrong password with -ERR and closes the socket; an attempt can read the reset before the
    -ERR (about 1 in 13 here), and reporting that reset as "no NATS" would send the operator after the wrong fault."""
    refusals = [e for e in errors if is_login_refusal(e)]
    return refusals[-1] if refusals else errors[-1]


def is_login_refusal(error: object) -> bool:
    text = str(error).lower()
    return "authorization" in text or "authentication" in text


async def _give_up_connecting(nc: NatsClient, connecting: asyncio.Future, connect_timeout_s: float) -> None:
    """End nats-py's endless first-connection loop. Cancelling it is not enough: on Python 3.11 its
    asyncio.wait_for(open_connection) can turn the cancellation into the refusal it was handling, and the loop just
    tries again (forever). A finite number of attempts makes it give up by itself, within an attempt or two."""
    nc.options["max_reconnect_attempts"] = 1
    connecting.cancel()
    await asyncio.wait({connecting}, timeout=2 * connect_timeout_s + 1.0)
    if not connecting.done():
        log.error("gave up connecting to NATS, but nats-py goes on trying")
    elif not connecting.cancelled():
        connecting.exception()  # retrieved: the caller reports it
    await _close_quietly(nc)


async def _close_quietly(nc: NatsClient) -> None:
    try:
        await asyncio.wait_for(nc.close(), 5.0)
    except Exception:  # noqa: BLE001 - never connected, or already closed
        pass


class _Refused:
    pass


_REFUSED = _Refused()


def _span_subject(subject: str) -> str:
    """Span names without per-request tokens (keeps cardinality low)."""
    parts = subject.split(".")
    return ".".join(parts[:3])


def _short(exc: ValidationError) -> str:
    errs = exc.errors()[:3]
    return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in errs)

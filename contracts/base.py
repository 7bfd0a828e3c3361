"""The base of every message on the bus: frozen, strict about unknown fields, versioned."""
from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1


class Message(BaseModel):
    """A bus message. Frozen so a handler cannot change what another handler sees; `extra="forbid"` so a
    misspelt field is an error at the sender, not a silent default at the receiver."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = Field(default=SCHEMA_VERSION, ge=1, description="bumped on incompatible changes")


class ErrorCode(StrEnum):
    """Typed errors carried on the bus (reply headers, terminal stream events) and mapped to HTTP at the gateway."""

    INVALID_REQUEST = "invalid_request"
    UNKNOWN_MODEL = "unknown_model"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    MALFORMED_MESSAGE = "malformed_message"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    UNAUTHORIZED = "unauthorized"
    RATE_LIMITED = "rate_limited"
    OVERLOADED = "overloaded"  # rejected early: no ready instance can meet the deadline
    NO_INSTANCE = "no_instance"  # the model has no ready instance at all
    DEADLINE_EXCEEDED = "deadline_exceeded"
    INSTANCE_FAILED = "instance_failed"  # the instance died after the first token was sent
    CANCELLED = "cancelled"
    ILLEGAL_TRANSITION = "illegal_transition"
    TIMEOUT = "timeout"
    UNAVAILABLE = "unavailable"  # no service answered on the subject
    INTERNAL = "internal"
    POISON_REQUEST = "poison_request"  # failed on two instances: not dispatched again (HTTP 500)
    NOT_FOUND = "not_found"  # no such route (HTTP 404; an unknown model is UNKNOWN_MODEL)
    STALE_EPOCH = "stale_epoch"  # a lifecycle command from a reconciler term older than one the worker has seen


class ErrorInfo(Message):
    """A typed error. `retryable` tells the caller whether the same request may succeed elsewhere or later."""

    code: ErrorCode
    message: str
    retryable: bool = False
    detail: dict[str, str] = Field(default_factory=dict)

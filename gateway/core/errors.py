"""Typed errors -> HTTP status and OpenAI error bodies, with Retry-After on every 429 and 503."""
from __future__ import annotations

import math

from contracts import ErrorCode, ErrorInfo

_STATUS: dict[ErrorCode, tuple[int, str]] = {
    ErrorCode.INVALID_REQUEST: (400, "invalid_request_error"),
    ErrorCode.CONTEXT_LENGTH_EXCEEDED: (400, "invalid_request_error"),
    ErrorCode.MALFORMED_MESSAGE: (400, "invalid_request_error"),
    ErrorCode.UNKNOWN_MODEL: (404, "invalid_request_error"),
    ErrorCode.UNAUTHORIZED: (401, "authentication_error"),
    ErrorCode.PAYLOAD_TOO_LARGE: (413, "invalid_request_error"),
    ErrorCode.RATE_LIMITED: (429, "rate_limit_error"),
    ErrorCode.OVERLOADED: (503, "overloaded_error"),
    ErrorCode.NO_INSTANCE: (503, "overloaded_error"),
    ErrorCode.UNAVAILABLE: (503, "service_unavailable_error"),
    ErrorCode.DEADLINE_EXCEEDED: (504, "timeout_error"),
    ErrorCode.TIMEOUT: (504, "timeout_error"),
    ErrorCode.CANCELLED: (499, "cancelled"),
    ErrorCode.INSTANCE_FAILED: (502, "server_error"),
    ErrorCode.ILLEGAL_TRANSITION: (409, "invalid_request_error"),
    ErrorCode.INTERNAL: (500, "server_error"),
    ErrorCode.POISON_REQUEST: (500, "server_error"),
    ErrorCode.NOT_FOUND: (404, "invalid_request_error"),
}

# Retry-After (RFC 9110 section 10.2.3) goes on every 429 and 503: whole seconds, as OpenAI's SDKs and most HTTP
# clients read it. A 503 for a model says one TTFT SLO of that model (retry_after_for_model); a 429 says when the
# tenant's token bucket holds a request again; anything else, or a figure unknown, says DEFAULT_RETRY_AFTER_S.
RETRY_AFTER_STATUSES = frozenset({429, 503})
DEFAULT_RETRY_AFTER_S = 1
MAX_RETRY_AFTER_S = 60


def retry_after_header(seconds: float | None) -> str:
    """Whole seconds, rounded up (a client that retries on time must not be early), within 1..MAX_RETRY_AFTER_S."""
    if seconds is None or not math.isfinite(seconds):
        return str(DEFAULT_RETRY_AFTER_S)
    return str(min(MAX_RETRY_AFTER_S, max(1, math.ceil(seconds - 1e-9))))


def retry_after_for_model(ttft_slo_ms: float) -> float:
    """A 503 for a model (overloaded, no instance, dispatchers unreachable): retry after one TTFT SLO.

    By the time an overloaded request fails, the dispatcher has already held it max_num_relaxations TTFT SLOs past
    its deadline (requeue); the queue it left turns over within about one SLO, so a retry one SLO later meets a
    queue that has moved on rather than the same backlog. A small SLO still gives the 1 s floor, which is also about
    what a NATS reconnect or a dispatcher failover takes."""
    return ttft_slo_ms / 1000.0


class ApiError(Exception):
    """An error to give the client. `param` names the offending request field, as OpenAI does; `retry_after_s`
    is the Retry-After of a 429 or 503 (None: DEFAULT_RETRY_AFTER_S)."""

    def __init__(self, code: ErrorCode, message: str, param: str | None = None, *,
                 retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.retry_after_s = retry_after_s

    @classmethod
    def from_info(cls, err: ErrorInfo) -> "ApiError":
        return cls(err.code, err.message, err.detail.get("param"))

    @property
    def status(self) -> int:
        return status_of(self.code)

    def body(self) -> dict:
        return error_body(self.code, self.message, self.param)

    def headers(self) -> dict[str, str]:
        return retry_headers(self.status, self.retry_after_s)


def status_of(code: ErrorCode) -> int:
    return _STATUS.get(code, (500, "server_error"))[0]


def retry_headers(status: int, retry_after_s: float | None = None) -> dict[str, str]:
    """{"Retry-After": seconds} for a 429 or 503, else nothing."""
    return {"Retry-After": retry_after_header(retry_after_s)} if status in RETRY_AFTER_STATUSES else {}


def _printable(text: str) -> str:
    """Messages quote what the client sent; a lone surrogate in it would make the JSON response itself unencodable."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_body(code: ErrorCode, message: str, param: str | None = None) -> dict:
    kind = _STATUS.get(code, (500, "server_error"))[1]
    return {"error": {"message": _printable(message), "type": kind,
                      "param": None if param is None else _printable(param), "code": code.value}}

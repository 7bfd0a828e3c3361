"""Typed errors -> HTTP status and OpenAI error bodies."""
from __future__ import annotations

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
}


class ApiError(Exception):
    """An error to give the client. `param` names the offending request field, as OpenAI does."""

    def __init__(self, code: ErrorCode, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param

    @classmethod
    def from_info(cls, err: ErrorInfo) -> "ApiError":
        return cls(err.code, err.message, err.detail.get("param"))

    @property
    def status(self) -> int:
        return _STATUS.get(self.code, (500, "server_error"))[0]

    def body(self) -> dict:
        return error_body(self.code, self.message, self.param)


def error_body(code: ErrorCode, message: str, param: str | None = None) -> dict:
    kind = _STATUS.get(code, (500, "server_error"))[1]
    return {"error": {"message": message, "type": kind, "param": param, "code": code.value}}

"""What the dispatcher core decides; the shell (or the simulator) carries it out. Every event method returns a
list of these, in the order they should be acted on. Immutable records; NamedTuple because a burst round builds
hundreds of them and a frozen dataclass costs several times more to construct."""
from __future__ import annotations

from typing import NamedTuple

from contracts import ErrorCode, ErrorInfo, ModelLoadWindow

from .requests import DispatchRequest


class Assign(NamedTuple):
    """Run the request's prefill on `instance_id` (RunAssignment). With a decode instance, the phase is "prefill"
    and the KV cache goes to `decode_instance_id`; without, the instance runs it in full (colocated).

    `ttft_deadline_ms` is the deadline the plan used (relaxed when `is_late`); `expected_done_ms` is the prefill's
    predicted completion on the dispatcher's clock. A late request never counts as on time.
    """

    request_id: str
    model: str
    instance_id: str
    worker_id: str
    predicted_prefill_ms: float
    expected_done_ms: float
    ttft_deadline_ms: float
    is_late: bool
    attempt: int
    request: DispatchRequest
    decode_instance_id: str | None = None
    decode_worker_id: str | None = None


class Reject(NamedTuple):
    """Fail the request now with a typed error (terminal event to its reply subject / a rejected SubmitAck)."""

    request_id: str
    model: str
    code: ErrorCode  # OVERLOADED, NO_INSTANCE, or INSTANCE_FAILED (attempts used up)
    reason: str
    retryable: bool
    request: DispatchRequest

    def error_info(self) -> ErrorInfo:
        return ErrorInfo(code=self.code, message=self.reason, retryable=self.retryable)


class Requeued(NamedTuple):
    """Informational: the request went back to the global queue because `instance_id` died or failed its prefill
    before the first token. The core re-dispatches it; the shell only logs or traces this."""

    request_id: str
    model: str
    instance_id: str
    attempt: int


class Relaxed(NamedTuple):
    """Informational (requeue policy): no instance could meet the deadline, so it was moved out to
    `ttft_deadline_ms`; the request is late from now on and never counts as on time."""

    request_id: str
    model: str
    ttft_deadline_ms: float
    num_relaxations: int


class PublishLoad(NamedTuple):
    """Publish this load window on janus.telemetry.model.<model>."""

    window: ModelLoadWindow


class MoveDecodes(NamedTuple):
    """Ask `worker_id` to move up to `max_requests` running decodes of `instance_id` (draining) to
    `target_instance_id` on `target_worker_id` (contracts.MoveDecodes; the rule: moves.py)."""

    model: str
    instance_id: str
    worker_id: str
    target_instance_id: str
    target_worker_id: str
    max_requests: int


Effect = Assign | Reject | Requeued | Relaxed | PublishLoad | MoveDecodes

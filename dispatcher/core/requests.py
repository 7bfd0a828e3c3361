"""What the dispatcher core needs to know about a request: a plain, validated record built from the contract."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from contracts import GenerateRequest


@dataclass(frozen=True, slots=True)
class DispatchRequest:
    """One request as the core sees it. Times are absolute ms on the dispatcher's one clock (wall-clock Unix ms in
    the service, virtual ms in the simulator).

    expected_output_tokens feeds only the load window's token rate and output-length moments: the gateway's
    max_tokens in the service, the true length in a replay.
    """

    request_id: str
    model: str
    num_prompt_tokens: int
    arrival_ms: float
    ttft_deadline_ms: float
    expected_output_tokens: int = 0
    tpot_slo_ms: float = 0.0  # 0: unknown (a replay without one); what moving decodes keeps targets within
    attempt: int = 0
    is_late: bool = False
    source: object | None = field(default=None, compare=False, repr=False)  # e.g. the GenerateRequest

    def __post_init__(self) -> None:
        if not self.request_id:
            raise ValueError("request_id must not be empty")
        if not self.model:
            raise ValueError(f"request {self.request_id!r}: model must not be empty")
        if self.num_prompt_tokens < 1:
            raise ValueError(f"request {self.request_id!r}: num_prompt_tokens must be >= 1, got {self.num_prompt_tokens}")
        if not (math.isfinite(self.arrival_ms) and math.isfinite(self.ttft_deadline_ms)):
            raise ValueError(f"request {self.request_id!r}: arrival and deadline must be finite ms")
        if self.ttft_deadline_ms < self.arrival_ms:
            raise ValueError(
                f"request {self.request_id!r}: TTFT deadline {self.ttft_deadline_ms} is before arrival "
                f"{self.arrival_ms} (one clock: both absolute ms)"
            )
        if self.expected_output_tokens < 0 or self.attempt < 0:
            raise ValueError(f"request {self.request_id!r}: expected_output_tokens and attempt must be >= 0")

    @property
    def ttft_slo_ms(self) -> float:
        return self.ttft_deadline_ms - self.arrival_ms

    @classmethod
    def from_generate(cls, request: GenerateRequest) -> "DispatchRequest":
        """From the bus contract; the original rides along in `source` for the shell's RunAssignment."""
        return cls(
            request_id=request.request_id,
            model=request.model,
            num_prompt_tokens=request.num_prompt_tokens,
            arrival_ms=request.arrival_unix_ms,
            ttft_deadline_ms=request.ttft_deadline_unix_ms,
            expected_output_tokens=request.sampling.max_tokens,
            tpot_slo_ms=request.tpot_slo_ms,
            attempt=request.attempt,
            is_late=request.is_late,
            source=request,
        )

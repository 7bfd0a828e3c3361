"""A request's mutable dispatch state while the dispatcher holds it."""
from __future__ import annotations

from dataclasses import dataclass

from .requests import DispatchRequest


@dataclass(slots=True)
class Job:
    request: DispatchRequest
    deadline_ms: float  # the deadline plans use: the request's own, or a relaxed one once late
    is_late: bool  # requeued with a relaxed deadline (or arrived so): never counted on time
    num_relaxations: int = 0
    attempt: int = 0
    failed_on: tuple[str, ...] = ()  # instances that failed while holding it (poison.py)
    # Late job: from this time on even a free instance misses its (relaxed) deadline.
    hopeless_at_ms: float = float("inf")
    prefix_keys: tuple[int, ...] = ()  # its prompt's block keys, when routed by prefix (prefix_affinity.py)
    cached: tuple[frozenset, dict] = (frozenset(), {})  # (the index's stamp, instance -> tokens held), last looked up

    @classmethod
    def from_request(cls, request: DispatchRequest) -> "Job":
        return cls(request, request.ttft_deadline_ms, request.is_late, attempt=request.attempt)

    @property
    def request_id(self) -> str:
        return self.request.request_id

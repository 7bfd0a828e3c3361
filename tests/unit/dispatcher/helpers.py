"""Small builders shared by the dispatcher tests."""
from __future__ import annotations

from contracts import InstanceRecord, InstanceRole, ModelState, Pool
from dispatcher.core import Assign, DispatchRequest, Reject

TOKENS_PER_S = 10_000.0  # 10 tokens per ms: a 1,000-token prompt is predicted at 100 ms


def record(
    instance_id: str,
    *,
    model: str = "m",
    is_ready: bool = True,
    state: ModelState | None = None,
    role: InstanceRole = InstanceRole.COLOCATED,
    updated_ms: float = 0.0,
    prefill_tokens_per_s: float | None = None,
    max_num_seqs: int = 64,
) -> InstanceRecord:
    return InstanceRecord(
        instance_id=instance_id,
        model=model,
        worker_id=f"w-{instance_id}",
        role=role,
        pool=Pool.ELASTIC if role != InstanceRole.COLOCATED else Pool.STEADY,
        state=state if state is not None else (ModelState.ACTIVE if is_ready else ModelState.WAKING),
        is_ready=is_ready,
        prefill_tokens_per_s=prefill_tokens_per_s,
        max_num_seqs=max_num_seqs,
        updated_unix_ms=updated_ms,
    )


def request(
    request_id: str, arrival_ms: float, *, tokens: int = 1000, slo_ms: float = 1000.0, model: str = "m",
    output_tokens: int = 0,
) -> DispatchRequest:
    return DispatchRequest(request_id, model, tokens, arrival_ms, arrival_ms + slo_ms,
                           expected_output_tokens=output_tokens)


def assigns(effects) -> list[Assign]:
    return [e for e in effects if isinstance(e, Assign)]


def rejects(effects) -> list[Reject]:
    return [e for e in effects if isinstance(e, Reject)]


def placed(effects) -> dict[str, str]:
    """request id -> instance id of every Assign."""
    return {e.request_id: e.instance_id for e in assigns(effects)}

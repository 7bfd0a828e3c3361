"""Small builders shared by the dispatcher tests."""
from __future__ import annotations

from contracts import DeviceInfo, InstanceRecord, InstanceRole, InstanceStatus, ModelState, PageCounters, Pool
from contracts import WorkerHeartbeat
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


def heartbeat(at_ms: float, backlog: dict[str, int], role: InstanceRole = InstanceRole.DECODE) -> WorkerHeartbeat:
    """A worker heartbeat reporting `backlog[instance]` running sequences on each instance of model "m"."""
    pool = Pool.STEADY if role == InstanceRole.COLOCATED else Pool.ELASTIC
    return WorkerHeartbeat(
        worker_id="w", seq=0, sent_unix_ms=at_ms, device=DeviceInfo(kind="cpu", name="cpu", hbm_bytes=0),
        pages=PageCounters(page_size_bytes=1, num_pages_total=0, num_pages_free=0, fragmentation=0.0),
        instances=tuple(InstanceStatus(instance_id=i, model="m", role=role, pool=pool, state=ModelState.ACTIVE,
                                       num_running=n) for i, n in backlog.items()))


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

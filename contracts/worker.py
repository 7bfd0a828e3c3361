"""Dispatcher -> worker assignments, worker -> dispatcher prefill completions and request outcomes, and the worker
heartbeat."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from .base import Message
from .lifecycle import HostCopy, InstanceRole, ModelState, Pool, WeightSegment
from .requests import GenerateRequest


class KVTarget(Message):
    """Prefill/decode disaggregation: where the prefill instance writes the request's KV blocks (pages the decode
    instance allocated), addressed by global offset in the decode worker's region."""

    decode_worker_id: str
    decode_instance_id: str
    # unresolved (as the dispatcher sends it) until the decode worker reserved blocks and answered with these
    transfer_session: str = ""
    block_offsets_bytes: tuple[int, ...] = ()
    block_num_bytes: int = Field(default=0, ge=0)

    @property
    def is_resolved(self) -> bool:
        return bool(self.transfer_session and self.block_offsets_bytes and self.block_num_bytes)


class MovedStream(Message):
    """A running decode that moves from another instance of the model (docs/lifecycle.md, "Moving a decode"): the
    tokens that instance sampled and streamed, and where the stream stands, so that the new instance continues it
    as if nothing had happened."""

    output_token_ids: tuple[int, ...] = Field(min_length=1)
    next_seq: int = Field(ge=1, description="the stream's next chunk number")
    first_token_unix_ms: float
    num_on_time_tokens: int = Field(ge=0)

    @model_validator(mode="after")
    def _on_time_within_output(self) -> "MovedStream":
        if self.num_on_time_tokens > len(self.output_token_ids):
            raise ValueError("num_on_time_tokens must not exceed the tokens streamed")
        return self


class RunAssignment(Message):
    """janus.worker.<worker>.run: run this request on this instance."""

    request: GenerateRequest
    instance_id: str
    phase: Literal["full", "prefill", "decode"] = "full"
    kv_target: KVTarget | None = None
    # phase "decode" only: a running decode moving here (its reservation, then its hand-over), not a P/D prefill's
    moved: MovedStream | None = None
    predicted_prefill_ms: float = Field(default=0.0, ge=0)
    dispatched_unix_ms: float
    dispatcher_id: str = ""


class PrefillDone(Message):
    """A prefill finished (or failed before its first token): the dispatcher corrects the instance's EPDT.

    P/D: once the decode instance has taken the request over, the prefill worker sends it again with
    `handed_over_to_instance_id` set (a hand-over notice, not a second prefill): from then on that instance streams
    the request, and its death, not the prefill instance's, is what would break the stream."""

    request_id: str
    model: str
    worker_id: str
    instance_id: str
    num_prompt_tokens: int = Field(ge=0)
    prefill_ms: float = Field(ge=0)
    first_token_unix_ms: float
    ok: bool = True
    # with ok=False, why: "handed_back" (the instance was not ready or drained: try elsewhere), "instance_failed"
    # (its engine broke while holding the request: try elsewhere, at most once more: dispatcher/core/poison.py),
    # "request_failed" (the request failed alone there and its error went to the client: nothing more to do)
    failure: Literal["handed_back", "instance_failed", "request_failed"] = "handed_back"
    handed_over_to_instance_id: str = ""


class RequestOutcome(Message):
    """A request finished (stop or length) on this instance: how many of its output tokens were on time, token i
    (1-based) being due by the request's TTFT deadline + (i - 1) * its TPOT SLO. The dispatcher that sent it folds
    this into the model's load window: token-level attainment, the measure the oracle's profiles are labelled with,
    which only the worker that emitted the tokens can count."""

    request_id: str
    model: str
    worker_id: str
    instance_id: str
    num_output_tokens: int = Field(ge=0)
    num_on_time_tokens: int = Field(ge=0)
    finish_reason: Literal["stop", "length"]

    @model_validator(mode="after")
    def _on_time_within_output(self) -> "RequestOutcome":
        if self.num_on_time_tokens > self.num_output_tokens:
            raise ValueError("num_on_time_tokens must not exceed num_output_tokens")
        return self


MAX_NUM_MOVES = 256  # one command's moves: each is a few bus round trips and a KV write


class MoveDecodes(Message):
    """janus.worker.<worker>.move (request/reply): move up to `max_requests` running decodes of `instance_id`, a
    draining decode instance on that worker, to `target_instance_id` on `target_worker_id`, an active one of the
    same model. Each move writes the request's KV into the target's blocks and hands its stream over; one that
    fails goes on decoding where it was. The dispatcher sends it (dispatcher/core/moves.py)."""

    instance_id: str
    target_worker_id: str
    target_instance_id: str
    max_requests: int = Field(ge=1, le=MAX_NUM_MOVES)


class MoveDecodesAck(Message):
    """The requests whose move started (their engine takes them out at its next step)."""

    request_ids: tuple[str, ...] = ()


MAX_NUM_HOLDS_IDS = 256  # one query's ids: ~20 KB at most, well inside a NATS message


class HoldsQuery(Message):
    """janus.worker.<worker>.holds (request/reply): which of these requests, assigned to the worker a while ago and
    never reported by a PrefillDone, it still holds. NATS core is at-most-once: a bus failover can drop the
    RunAssignment, or the hand-back that returns a request to the dispatcher, and then only the gateway's timeout
    would ever end it."""

    request_ids: tuple[str, ...] = Field(max_length=MAX_NUM_HOLDS_IDS)


class HoldsReply(Message):
    """Of the query's ids: held with nothing streamed yet (waiting), and streamed or finished (started: their
    PrefillDone was lost). The rest the worker never received, or handed back."""

    waiting_ids: tuple[str, ...] = ()
    started_ids: tuple[str, ...] = ()


class InstanceStatus(Message):
    """One model instance on a worker, as the heartbeat reports it."""

    instance_id: str
    model: str
    role: InstanceRole
    pool: Pool
    state: ModelState
    num_waiting: int = Field(default=0, ge=0)
    num_running: int = Field(default=0, ge=0)
    num_kv_blocks_used: int = Field(default=0, ge=0)
    num_kv_blocks_free: int = Field(default=0, ge=0)
    ttft_ms_p50: float | None = None
    tpot_ms_p50: float | None = None
    prefill_tokens_per_s: float | None = Field(default=None, description="measured; feeds the dispatcher's EPDT")
    decode_tokens_per_s: float | None = None
    weight_segments: tuple[WeightSegment, ...] = ()
    host_copy: HostCopy | None = Field(default=None, description="while WARM: the host copy peers may pull")
    peer_worker_ids: tuple[str, ...] = Field(default=(), description="a tensor-parallel instance's other devices "
                                             "(the lead worker reports it; those devices hold it too)")


class PageCounters(Message):
    page_size_bytes: int = Field(gt=0)
    num_pages_total: int = Field(ge=0)
    num_pages_free: int = Field(ge=0)
    fragmentation: float = Field(ge=0.0, le=1.0, description="free pages outside the largest free run / free pages")
    pages_by_model: dict[str, dict[str, int]] = Field(default_factory=dict, description="model -> kind -> pages")


class DeviceInfo(Message):
    kind: Literal["cpu", "cuda", "npu"]
    name: str
    hbm_bytes: int = Field(ge=0)
    device: str = Field(default="", description="the device the worker opened, e.g. cuda:3 (one per worker)")


class WorkerHeartbeat(Message):
    """janus.telemetry.worker.<worker>, every 0.5 s."""

    worker_id: str
    seq: int = Field(ge=0)
    sent_unix_ms: float
    device: DeviceInfo
    pages: PageCounters
    instances: tuple[InstanceStatus, ...] = ()
    transfer_session: str = Field(default="", description="Mooncake session name of this worker")
    is_draining: bool = False

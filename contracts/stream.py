"""What a worker sends to the gateway's reply subject: token chunks, then exactly one terminal event."""
from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field, TypeAdapter

from .base import ErrorInfo, Message


class TokenChunk(Message):
    kind: Literal["tokens"] = "tokens"
    request_id: str
    seq: int = Field(ge=0, description="chunk number: the gateway drops duplicates and detects gaps")
    token_ids: tuple[int, ...]
    text: str = Field(description="the text these tokens add, detokenised incrementally")
    logprobs: tuple[float, ...] | None = None
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] | None = Field(
        default=None, description="per token: its most likely alternatives as (token id, logprob)")
    emitted_unix_ms: float
    worker_id: str = Field(default="", description="who streamed it: where to ask for a resend (P/D changes it)")
    index: int = Field(default=0, ge=0, description="the choice these tokens belong to (n > 1)")
    finish_reason: Literal["stop", "length"] | None = Field(
        default=None, description="this choice ended here while others go on; the last one ends with RequestDone")


class RequestDone(Message):
    kind: Literal["done"] = "done"
    request_id: str
    seq: int = Field(ge=0)
    finish_reason: Literal["stop", "length"]
    num_prompt_tokens: int = Field(ge=0)
    num_output_tokens: int = Field(ge=0)
    first_token_unix_ms: float | None = None
    worker_id: str = ""
    instance_id: str = ""
    num_cached_tokens: int = Field(default=0, ge=0, description="prompt tokens found in the engine's prefix cache, "
                                   "not computed (the usage's prompt_tokens_details.cached_tokens)")


class RequestFailed(Message):
    kind: Literal["error"] = "error"
    request_id: str
    seq: int = Field(ge=0)
    error: ErrorInfo
    num_output_tokens: int = Field(default=0, ge=0, description="tokens the client already got")


StreamEvent = Annotated[Union[TokenChunk, RequestDone, RequestFailed], Field(discriminator="kind")]
STREAM_EVENT = TypeAdapter(StreamEvent)


class ResendRequest(Message):
    """janus.worker.<worker>.resend (request/reply): the gateway lost events of a stream (NATS core is at-most-once,
    and a bus failover can drop a message in flight) and asks the worker that streamed them again."""

    request_id: str
    from_seq: int = Field(ge=0)


class ResendReply(Message):
    request_id: str
    is_known: bool = Field(description="false: the worker never had it or has forgotten it (the stream is lost)")
    events: tuple[StreamEvent, ...] = Field(default=(), description="every event from from_seq on, in order")

"""A request's journey: gateway -> dispatcher (GenerateRequest), the dispatcher's acknowledgement, cancellation."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from .base import ErrorInfo, Message

# Limits on what reaches an engine. The gateway refuses anything outside them with a 400 naming the field, and the
# engine checks them again when a request is added (a request that skipped the gateway fails alone, never the
# engine). Stop strings as OpenAI (4); their length and the stop token ids are capped so that matching stays cheap
# per token (a 200 KB stop string was re-scanned on every token).
MAX_STOP_STRINGS = 4
MAX_STOP_STRING_CHARS = 256
MAX_STOP_TOKEN_IDS = 64
SEED_LIMIT = 1 << 64  # torch.Generator.manual_seed takes 0 <= seed < 2**64 (negative seeds are not accepted here)
MAX_TOP_K = (1 << 31) - 1  # int32, as top-k runs on device tensors
MAX_TOP_LOGPROBS = 20  # alternatives per token (OpenAI's chat limit; vLLM's default max_logprobs is 20 too)
MAX_LOGIT_BIAS = 1024  # entries of logit_bias: scattered into the logits every step
MAX_LOGIT_BIAS_VALUE = 100.0  # OpenAI's range, [-100, 100]
MAX_N = 16  # choices per request: each is a sequence in the engine sharing the prompt's KV blocks


MAX_JSON_SCHEMA_CHARS = 64 * 1024  # a response_format schema: compiled against the whole vocabulary per schema


class GuidedDecoding(Message):
    """Structured output (docs/api.md): the output is constrained to JSON (`json_object`: any object) or to a JSON
    schema, by a grammar compiled against the model's tokenizer. `json_schema` is the schema as canonical JSON text
    (sorted keys, no spaces): the engine compiles each distinct text once."""

    kind: Literal["json_object", "json_schema"]
    json_schema: str = Field(default="", max_length=MAX_JSON_SCHEMA_CHARS)

    @model_validator(mode="after")
    def _schema_for_kind(self) -> "GuidedDecoding":
        if (self.kind == "json_schema") != bool(self.json_schema):
            raise ValueError("json_schema is given exactly when kind is json_schema")
        return self


class SamplingParams(Message):
    """How to pick tokens. Defaults match the OpenAI API."""

    max_tokens: int = Field(ge=1, description="tokens to generate at most")
    temperature: float = Field(default=1.0, ge=0.0, le=2.0, description="0 means greedy")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0, description="0 means off")
    seed: int | None = None
    stop: tuple[str, ...] = Field(default=(), max_length=MAX_STOP_STRINGS)
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: bool = False
    top_logprobs: int = Field(default=0, ge=0, le=MAX_TOP_LOGPROBS, description="alternatives per token")
    n: int = Field(default=1, ge=1, le=MAX_N, description="choices sampled from one prompt computation")
    # penalties and biases (docs/api.md): OpenAI's over the output, vLLM's repetition penalty over prompt + output
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=10.0, description="1 means off")
    logit_bias: tuple[tuple[int, float], ...] = Field(default=(), max_length=MAX_LOGIT_BIAS,
                                                      description="(token id, bias added to its logit)")
    min_p: float = Field(default=0.0, ge=0.0, le=1.0, description="drop tokens below min_p * the top probability")
    min_tokens: int = Field(default=0, ge=0, description="stop tokens and EOS are masked until this many outputs")
    guided: GuidedDecoding | None = Field(default=None, description="constrain the output to a grammar")

    @model_validator(mode="after")
    def _no_empty_stop(self) -> "SamplingParams":
        if any(s == "" for s in self.stop):
            raise ValueError("stop strings must not be empty")
        if any(abs(bias) > MAX_LOGIT_BIAS_VALUE for _, bias in self.logit_bias):
            raise ValueError(f"logit_bias values must lie in [-{MAX_LOGIT_BIAS_VALUE:g}, {MAX_LOGIT_BIAS_VALUE:g}]")
        if self.min_tokens > self.max_tokens:
            raise ValueError("min_tokens must not exceed max_tokens")
        return self

    @property
    def has_penalties(self) -> bool:
        return (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0)


class GenerateRequest(Message):
    """One generation request, tokenised at the gateway. All times are wall-clock Unix milliseconds: one clock for
    every service (the public code mixed relative and absolute times, so it never rejected anything)."""

    request_id: str = Field(min_length=1, max_length=128)
    model: str = Field(min_length=1)
    tenant: str = "default"
    prompt_token_ids: tuple[int, ...] = Field(min_length=1)
    sampling: SamplingParams
    arrival_unix_ms: float = Field(description="a_j: when the gateway accepted the request")
    ttft_deadline_unix_ms: float = Field(description="d_j = a_j + TTFT SLO")
    tpot_slo_ms: float = Field(gt=0)
    reply_subject: str = Field(min_length=1, description="where token chunks and the terminal event go")
    attempt: int = Field(default=0, ge=0, description="re-dispatches after an instance died before the first token")
    is_late: bool = Field(default=False, description="requeued with a relaxed deadline: never counted on time")
    traceparent: str = Field(default="", description="W3C trace context of the request, kept across queues")

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


class SubmitAck(Message):
    """The dispatcher's answer to a submission: queued, or refused with a typed error (nothing is silently dropped)."""

    request_id: str
    status: Literal["queued", "rejected"]
    error: ErrorInfo | None = None
    queue_depth: int = 0
    dispatcher_id: str = Field(default="", description="who holds it: if that dispatcher dies before the first "
                               "token, the gateway submits again")


class CancelRequest(Message):
    """The client went away or gave up: whoever holds the request stops work on it."""

    request_id: str
    reason: str = "client disconnected"

"""The OpenAI request bodies the gateway accepts. A field the gateway does not know is accepted and ignored, as vLLM
does (clients such as guidellm always send some of vLLM's extensions), and named in the response's
`x-janus-ignored-fields` header and the gateway's log, so a typo is visible without failing the request. A known
field out of its range (docs/api.md lists them) is refused with a 400 naming it in `param`. Inside a message, fields
stay strict: a message the gateway cannot read in full (tool calls) is refused rather than half-read."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from contracts.requests import (
    MAX_LOGIT_BIAS,
    MAX_LOGIT_BIAS_VALUE,
    MAX_N,
    MAX_STOP_STRING_CHARS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    MAX_TOP_K,
    MAX_TOP_LOGPROBS,
    SEED_LIMIT,
)


def _utf8(text: str) -> str:
    """JSON may carry a lone surrogate ("\\ud800"), which no UTF-8 tokenizer or response can hold: refuse it here
    (a 400 naming the field) rather than fail deep inside tokenisation."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"invalid text: {exc.reason} at position {exc.start}") from None
    return text


Text = Annotated[str, AfterValidator(_utf8)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Tolerant(BaseModel):
    """A request body, or its stream_options: unknown fields are kept aside (`model_extra`) and ignored."""

    model_config = ConfigDict(extra="allow")

    def ignored_fields(self, prefix: str = "") -> list[str]:
        names = [prefix + name for name in (self.model_extra or {})]
        for name, value in self:
            if isinstance(value, _Tolerant):
                names += value.ignored_fields(f"{prefix}{name}.")
        return sorted(names)


class StreamOptions(_Tolerant):
    include_usage: bool = False
    continuous_usage_stats: bool = Field(default=False, description="vLLM: usage in every chunk")


class JsonSchemaFormat(_Body):
    name: str = Field(default="response", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema", description="a JSON schema (draft 2020-12)")
    strict: bool | None = Field(default=None, description="OpenAI's strict rules apply to the schema")


class ResponseFormat(_Body):
    """Structured outputs: `json_object` (any JSON object) or `json_schema`, enforced by a grammar (docs/api.md)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_for_type(self) -> "ResponseFormat":
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema is given exactly when type is json_schema")
        if self.json_schema is not None and self.json_schema.schema_ is None:
            raise ValueError("json_schema.schema is required")
        return self


class _Common(_Tolerant):
    model: Text = Field(min_length=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=MAX_N, description="choices, sampled from one prompt computation")
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Text | list[Text] | None = None
    seed: int | None = Field(default=None, ge=0, lt=SEED_LIMIT, description="0 <= seed < 2**64")
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = Field(default=None, description="token id -> bias in [-100, 100]")
    user: Text | None = Field(default=None, max_length=256)
    # extensions (vLLM-style)
    top_k: int | None = Field(default=None, ge=-1, le=MAX_TOP_K, description="0 or -1: off")
    ignore_eos: bool = False
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=10.0, description="1 means off")
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    min_tokens: int = Field(default=0, ge=0, description="checked against max_tokens at admission")
    stop_token_ids: list[int] | None = Field(default=None, max_length=MAX_STOP_TOKEN_IDS,
                                             description="each in [0, vocabulary size); checked at admission")
    response_format: ResponseFormat | None = None

    @field_validator("logit_bias")
    @classmethod
    def _biases(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if not v:
            return v
        if len(v) > MAX_LOGIT_BIAS:
            raise ValueError(f"at most {MAX_LOGIT_BIAS} entries")
        for key, bias in v.items():
            if not (key.strip().isascii() and key.strip().isdigit()):
                raise ValueError(f"keys are token ids, got {key!r}")
            if not -MAX_LOGIT_BIAS_VALUE <= bias <= MAX_LOGIT_BIAS_VALUE:
                raise ValueError(f"biases lie in [-{MAX_LOGIT_BIAS_VALUE:g}, {MAX_LOGIT_BIAS_VALUE:g}], got {bias}")
        return v

    def logit_bias_pairs(self) -> tuple[tuple[int, float], ...]:
        return tuple(sorted((int(k), float(b)) for k, b in (self.logit_bias or {}).items()))

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop sequences")
        if any(s == "" for s in stops):
            raise ValueError("stop sequences must not be empty")
        if any(len(s) > MAX_STOP_STRING_CHARS for s in stops):
            raise ValueError(f"a stop sequence has at most {MAX_STOP_STRING_CHARS} characters")
        return v

    def stop_list(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())


class CompletionBody(_Common):
    prompt: Text | list[int] | list[Text] | list[list[int]]
    max_tokens: int | None = Field(default=16, description="OpenAI's default for completions")
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS,
                                 description="the chosen token's log-probability and this many alternatives")
    echo: bool = Field(default=False, description="the prompt's text before the completion")
    best_of: int | None = Field(default=None, ge=1, le=MAX_N, description="equal to n: choices are not ranked")
    suffix: None = None

    @field_validator("best_of")
    @classmethod
    def _best_of_is_n(cls, v: int | None, info: ValidationInfo) -> int | None:
        n = info.data.get("n", 1)
        if v is not None and v != n:
            raise ValueError(f"best_of must equal n ({n}): the gateway samples n choices and does not rank them")
        return v

    @field_validator("echo")
    @classmethod
    def _echo_without_logprobs(cls, v: bool, info: ValidationInfo) -> bool:
        if v and info.data.get("logprobs") is not None:
            raise ValueError("echo with logprobs (the prompt's log-probabilities) is not supported")
        return v

    def prompt_count(self) -> int:
        """How many prompts the body holds (a list of strings or of token-id lists is a batch)."""
        p = self.prompt
        return len(p) if isinstance(p, list) and p and not isinstance(p[0], int) else 1


class ContentPart(_Body):
    type: Literal["text"]
    text: Text


class FunctionCall(_Body):
    name: Text
    arguments: Text = Field(description="the arguments as a JSON object's text")


class ToolCall(_Body):
    id: Text
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDef(_Body):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: Text | None = None
    parameters: dict[str, Any] | None = Field(default=None, description="a JSON schema of the arguments")
    strict: bool | None = None


class Tool(_Body):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Body):
    name: Text


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: NamedFunction


MAX_TOOLS = 128  # OpenAI's limit


class ChatMessage(_Body):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Text | list[ContentPart] | None = None
    name: Text | None = None
    tool_calls: list[ToolCall] | None = Field(default=None, description="an assistant's earlier calls")
    tool_call_id: Text | None = Field(default=None, description="a tool message: the call it answers")

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatBody(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS, description="alternatives per token")
    tools: list[Tool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True

    @field_validator("top_logprobs")
    @classmethod
    def _top_needs_logprobs(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs: true")
        return v

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


def field_of(loc: tuple[Any, ...]) -> str | None:
    """The OpenAI `param` for a pydantic error location (`body.messages.0.role` -> `messages`)."""
    names = [str(p) for p in loc if p != "body"]
    return names[0] if names else None


class TokenizeBody(_Tolerant):
    """vLLM's /tokenize: a prompt, or chat messages rendered by the model's chat template."""

    model: Text = Field(min_length=1)
    prompt: Text | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True

    @field_validator("messages")
    @classmethod
    def _not_empty(cls, v: list[ChatMessage] | None) -> list[ChatMessage] | None:
        if v is not None and not v:
            raise ValueError("messages must not be empty")
        return v


class DetokenizeBody(_Tolerant):
    model: Text = Field(min_length=1)
    tokens: list[int] = Field(max_length=1 << 20)

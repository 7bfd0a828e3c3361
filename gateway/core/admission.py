"""From an OpenAI body to a GenerateRequest: tokenise, check limits, set deadlines. Pure: time comes in."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Protocol, Sequence

from contracts import ErrorCode, GenerateRequest, SamplingParams

from .api import ChatBody, CompletionBody
from .errors import ApiError
from .structured import guided_of
from .tools import ToolPlan, guided_for, plan_tools, template_messages


class Tokenizer(Protocol):
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tools: list[dict] | None = None) -> str: ...


@dataclass(frozen=True)
class ServedModel:
    """What the gateway knows of a model: enough to validate and tokenise without touching a device."""

    name: str
    max_model_len: int
    ttft_slo_ms: float
    tpot_slo_ms: float
    tokenizer: Tokenizer


@dataclass(frozen=True)
class Envelope:
    request_id: str
    tenant: str
    now_unix_ms: float
    reply_subject: str
    traceparent: str = ""
    reply_subject_of: Callable[[str], str] | None = None  # a batched prompt's own reply subject, by request id

    def for_prompt(self, index: int) -> "Envelope":
        request_id = f"{self.request_id}-p{index}"
        subject = self.reply_subject_of(request_id) if self.reply_subject_of else f"{self.reply_subject}-p{index}"
        return replace(self, request_id=request_id, reply_subject=subject)


MAX_BATCHED_PROMPTS = 64  # prompts in one completions body: each becomes a request of its own


def prompt_ids_of_completion(body: CompletionBody, tokenizer: Tokenizer) -> list[list[int]]:
    """One token-id list per prompt: a string or a token-id list is one prompt, a list of either is a batch."""
    prompt = body.prompt
    if isinstance(prompt, str):
        return [tokenizer.encode(prompt)]
    if not prompt:
        raise ApiError(ErrorCode.INVALID_REQUEST, "prompt must not be empty", "prompt")
    if all(isinstance(p, int) for p in prompt):
        return [list(prompt)]  # type: ignore[arg-type]
    if len(prompt) > MAX_BATCHED_PROMPTS:
        raise ApiError(ErrorCode.INVALID_REQUEST, f"at most {MAX_BATCHED_PROMPTS} prompts in one request", "prompt")
    if len(prompt) * body.n > MAX_BATCHED_PROMPTS:
        raise ApiError(ErrorCode.INVALID_REQUEST,
                       f"prompts x n is at most {MAX_BATCHED_PROMPTS} choices in one request", "n")
    return [tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompt]  # type: ignore[union-attr]


def tool_plan(body: ChatBody, model: ServedModel) -> ToolPlan:
    return plan_tools(body, getattr(model.tokenizer, "tool_call_format", "hermes"))


def prompt_ids_of_chat(body: ChatBody, tokenizer: Tokenizer, plan: ToolPlan | None = None) -> list[int]:
    tools = {"tools": list(plan.tools)} if plan and plan.mode != "none" and plan.tools else {}
    text = tokenizer.apply_chat_template(template_messages(body), add_generation_prompt=True, **tools)
    return tokenizer.encode(text)


def _check_ids(ids: Sequence[int], model: ServedModel) -> None:
    if not ids:
        raise ApiError(ErrorCode.INVALID_REQUEST, "the prompt has no tokens", "prompt")
    bad = next((t for t in ids if not 0 <= t < model.tokenizer.vocab_size), None)
    if bad is not None:
        raise ApiError(ErrorCode.INVALID_REQUEST,
                       f"token id {bad} is outside the vocabulary of {model.name} (size {model.tokenizer.vocab_size})",
                       "prompt")


def _max_tokens(requested: int | None, num_prompt_tokens: int, model: ServedModel, param: str) -> int:
    room = model.max_model_len - num_prompt_tokens
    if room < 1:
        raise ApiError(ErrorCode.CONTEXT_LENGTH_EXCEEDED,
                       f"the prompt has {num_prompt_tokens} tokens; {model.name} takes at most "
                       f"{model.max_model_len} tokens in all", "messages" if param != "max_tokens" else "prompt")
    if requested is None:
        return room
    if requested < 1:
        raise ApiError(ErrorCode.INVALID_REQUEST, f"{param} must be at least 1, got {requested}", param)
    if requested > room:
        raise ApiError(ErrorCode.CONTEXT_LENGTH_EXCEEDED,
                       f"{model.name} takes at most {model.max_model_len} tokens; the prompt has "
                       f"{num_prompt_tokens}, so {param} can be at most {room} (got {requested})", param)
    return requested


def _check_stop_token_ids(ids: Sequence[int], model: ServedModel) -> None:
    """A stop token id the model cannot produce is a client error (the body's own limits bound their number)."""
    vocab = model.tokenizer.vocab_size
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise ApiError(ErrorCode.INVALID_REQUEST,
                       f"stop token id {bad} is outside the vocabulary of {model.name} (0 <= id < {vocab})",
                       "stop_token_ids")


def _check_logit_bias(pairs: Sequence[tuple[int, float]], model: ServedModel) -> None:
    vocab = model.tokenizer.vocab_size
    bad = next((t for t, _ in pairs if not 0 <= t < vocab), None)
    if bad is not None:
        raise ApiError(ErrorCode.INVALID_REQUEST,
                       f"logit_bias token id {bad} is outside the vocabulary of {model.name} (0 <= id < {vocab})",
                       "logit_bias")


def _sampling(body: CompletionBody | ChatBody, model: ServedModel, max_tokens: int, logprobs: bool,
              top_logprobs: int, guided=None) -> SamplingParams:
    _check_stop_token_ids(body.stop_token_ids or (), model)
    bias = body.logit_bias_pairs()
    _check_logit_bias(bias, model)
    if body.min_tokens > max_tokens:
        raise ApiError(ErrorCode.INVALID_REQUEST,
                       f"min_tokens ({body.min_tokens}) must not exceed max_tokens ({max_tokens})", "min_tokens")
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=max(body.top_k or 0, 0),
        seed=body.seed,
        stop=body.stop_list(),
        stop_token_ids=tuple(body.stop_token_ids or ()),
        ignore_eos=body.ignore_eos,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        n=body.n,
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
        repetition_penalty=1.0 if body.repetition_penalty is None else body.repetition_penalty,
        logit_bias=bias,
        min_p=body.min_p or 0.0,
        min_tokens=body.min_tokens,
        guided=guided if guided is not None else guided_of(body.response_format),
    )


def _request(model: ServedModel, env: Envelope, ids: list[int], sampling: SamplingParams) -> GenerateRequest:
    return GenerateRequest(
        request_id=env.request_id, model=model.name, tenant=env.tenant, prompt_token_ids=tuple(ids),
        sampling=sampling, arrival_unix_ms=env.now_unix_ms,
        ttft_deadline_unix_ms=env.now_unix_ms + model.ttft_slo_ms, tpot_slo_ms=model.tpot_slo_ms,
        reply_subject=env.reply_subject, traceparent=env.traceparent)


def admit_completion(body: CompletionBody, model: ServedModel, env: Envelope) -> list[GenerateRequest]:
    """One request per prompt (a batch is served as that many requests, their choices indexed in order); the
    first keeps the envelope's id, the others add `-p<i>`."""
    requests = []
    for i, ids in enumerate(prompt_ids_of_completion(body, model.tokenizer)):
        _check_ids(ids, model)
        max_tokens = _max_tokens(body.max_tokens, len(ids), model, "max_tokens")
        logprobs = body.logprobs is not None
        sampling = _sampling(body, model, max_tokens, logprobs, body.logprobs or 0)
        requests.append(_request(model, env if i == 0 else env.for_prompt(i), ids, sampling))
    return requests


def admit_chat(body: ChatBody, model: ServedModel, env: Envelope, plan: ToolPlan | None = None) -> GenerateRequest:
    plan = plan or tool_plan(body, model)
    ids = prompt_ids_of_chat(body, model.tokenizer, plan)
    _check_ids(ids, model)
    param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    max_tokens = _max_tokens(body.requested_max_tokens(), len(ids), model, param)
    top = (body.top_logprobs or 0) if body.logprobs else 0
    return _request(model, env, ids, _sampling(body, model, max_tokens, body.logprobs, top, guided_for(body, plan)))

"""From an OpenAI body to a GenerateRequest: tokenise, check limits, set deadlines. Pure: time comes in."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from contracts import ErrorCode, GenerateRequest, SamplingParams

from .api import ChatBody, CompletionBody
from .errors import ApiError


class Tokenizer(Protocol):
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str: ...


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


def prompt_ids_of_completion(body: CompletionBody, tokenizer: Tokenizer) -> list[int]:
    prompt = body.prompt
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    if not prompt:
        raise ApiError(ErrorCode.INVALID_REQUEST, "prompt must not be empty", "prompt")
    if all(isinstance(p, int) for p in prompt):
        return list(prompt)  # type: ignore[arg-type]
    if len(prompt) != 1:
        raise ApiError(ErrorCode.INVALID_REQUEST, "batched prompts are not supported: send one prompt per request",
                       "prompt")
    only = prompt[0]
    return tokenizer.encode(only) if isinstance(only, str) else list(only)


def prompt_ids_of_chat(body: ChatBody, tokenizer: Tokenizer) -> list[int]:
    messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    return tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True))


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


def _sampling(body: CompletionBody | ChatBody, model: ServedModel, max_tokens: int, logprobs: bool) -> SamplingParams:
    _check_stop_token_ids(body.stop_token_ids or (), model)
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=body.top_k or 0,
        seed=body.seed,
        stop=body.stop_list(),
        stop_token_ids=tuple(body.stop_token_ids or ()),
        ignore_eos=body.ignore_eos,
        logprobs=logprobs,
    )


def _request(model: ServedModel, env: Envelope, ids: list[int], sampling: SamplingParams) -> GenerateRequest:
    return GenerateRequest(
        request_id=env.request_id, model=model.name, tenant=env.tenant, prompt_token_ids=tuple(ids),
        sampling=sampling, arrival_unix_ms=env.now_unix_ms,
        ttft_deadline_unix_ms=env.now_unix_ms + model.ttft_slo_ms, tpot_slo_ms=model.tpot_slo_ms,
        reply_subject=env.reply_subject, traceparent=env.traceparent)


def admit_completion(body: CompletionBody, model: ServedModel, env: Envelope) -> GenerateRequest:
    ids = prompt_ids_of_completion(body, model.tokenizer)
    _check_ids(ids, model)
    max_tokens = _max_tokens(body.max_tokens, len(ids), model, "max_tokens")
    return _request(model, env, ids, _sampling(body, model, max_tokens, bool(body.logprobs)))


def admit_chat(body: ChatBody, model: ServedModel, env: Envelope) -> GenerateRequest:
    ids = prompt_ids_of_chat(body, model.tokenizer)
    _check_ids(ids, model)
    param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    max_tokens = _max_tokens(body.requested_max_tokens(), len(ids), model, param)
    return _request(model, env, ids, _sampling(body, model, max_tokens, body.logprobs))

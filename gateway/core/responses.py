"""OpenAI response bodies and stream chunks, built from what the workers sent.

A response has one choice per (prompt, sample): a completions batch of P prompts with `n` samples each has P * n
choices, prompt p's j-th sample at index p * n + j. Usage counts each prompt once (its KV is computed once and
shared by its samples) and every choice's tokens.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# A token as the client sees it: its text, its bytes, its log-probability, and its most likely alternatives
# (each text, bytes, log-probability).
Alternative = tuple[str, bytes, float]
TokenLogprob = tuple[str, bytes, float, tuple[Alternative, ...]]


@dataclass
class Choice:
    index: int
    prefix: str = ""  # echo: the prompt's text, before the completion
    text_parts: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[tuple[tuple[int, float], ...]] = field(default_factory=list)
    finish_reason: str | None = None
    has_started: bool = False  # streaming: its first chunk (chat: the role) went out

    @property
    def text(self) -> str:
        return self.prefix + "".join(self.text_parts)


@dataclass
class Completion:
    """What a request produced so far, as the gateway assembles it."""

    request_id: str
    model: str
    created_s: int
    kind: str  # "completion" | "chat"
    num_prompt_tokens: int
    choices: list[Choice] = field(default_factory=lambda: [Choice(0)])
    num_cached_tokens: int = 0  # prompt tokens the engines found in their prefix caches (RequestDone)

    def usage(self) -> dict:
        n = sum(len(c.token_ids) for c in self.choices)
        return {"prompt_tokens": self.num_prompt_tokens, "completion_tokens": n,
                "total_tokens": self.num_prompt_tokens + n,
                "prompt_tokens_details": {"cached_tokens": self.num_cached_tokens}}

    @property
    def object_id(self) -> str:
        return f"{'chatcmpl' if self.kind == 'chat' else 'cmpl'}-{self.request_id}"

    @property
    def is_done(self) -> bool:
        return all(c.finish_reason is not None for c in self.choices)


def _completion_logprobs(entries: list[TokenLogprob], text_offset: int, with_top: bool) -> dict:
    offsets = []
    for text, _, _, _ in entries:
        offsets.append(text_offset)
        text_offset += len(text)
    # the legacy format maps each alternative's text to its logprob; the chosen token is always among them (vLLM)
    top = [{**{t: lp for t, _, lp in alts}, text: lp} for text, _, lp, alts in entries] if with_top else None
    return {"tokens": [e[0] for e in entries], "token_logprobs": [e[2] for e in entries], "top_logprobs": top,
            "text_offset": offsets}


def _chat_logprobs(entries: list[TokenLogprob]) -> dict:
    return {"content": [{"token": t, "logprob": lp, "bytes": list(raw),
                         "top_logprobs": [{"token": a, "logprob": alp, "bytes": list(araw)} for a, araw, alp in alts]}
                        for t, raw, lp, alts in entries]}


def logprobs_body(kind: str, entries: list[TokenLogprob], *, text_offset: int = 0, with_top: bool = False) -> dict:
    """`text_offset`: where the first entry's text starts in the choice's text (completions)."""
    return _chat_logprobs(entries) if kind == "chat" else _completion_logprobs(entries, text_offset, with_top)


def _object(c: Completion, *, chunk: bool) -> str:
    if c.kind == "chat":
        return "chat.completion.chunk" if chunk else "chat.completion"
    return "text_completion"


def final_body(c: Completion, logprobs: dict[int, dict] | None = None) -> dict:
    """`logprobs`: each choice's logprobs body by index, when the request asked for them (None: it did not)."""
    choices = []
    for choice in c.choices:
        lp = None if logprobs is None else logprobs.get(choice.index)
        if c.kind == "chat":
            choices.append({"index": choice.index, "message": {"role": "assistant", "content": choice.text},
                            "logprobs": lp, "finish_reason": choice.finish_reason})
        else:
            choices.append({"index": choice.index, "text": choice.text, "logprobs": lp,
                            "finish_reason": choice.finish_reason})
    return {"id": c.object_id, "object": _object(c, chunk=False), "created": c.created_s, "model": c.model,
            "choices": choices, "usage": c.usage()}


def chunk_body(c: Completion, text: str, finish_reason: str | None = None, *, index: int = 0,
               is_first: bool = False, logprobs: dict | None = None) -> dict:
    if c.kind == "chat":
        delta: dict = {"role": "assistant", "content": text} if is_first else ({"content": text} if text else {})
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
    else:
        choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
    return {"id": c.object_id, "object": _object(c, chunk=True), "created": c.created_s, "model": c.model,
            "choices": [choice]}


def usage_chunk(c: Completion) -> dict:
    return {"id": c.object_id, "object": _object(c, chunk=True), "created": c.created_s, "model": c.model,
            "choices": [], "usage": c.usage()}


def apply_chunk(c: Completion, first_index: int, num_choices: int, ev) -> Choice | None:
    """A TokenChunk of the request whose choices start at `first_index`; None for an index it does not have."""
    if not 0 <= ev.index < num_choices:
        return None
    choice = c.choices[first_index + ev.index]
    choice.text_parts.append(ev.text)
    choice.token_ids.extend(ev.token_ids)
    if ev.logprobs:
        choice.logprobs.extend(ev.logprobs)
    if ev.top_logprobs:
        choice.top_logprobs.extend(ev.top_logprobs)
    if ev.finish_reason is not None:
        choice.finish_reason = ev.finish_reason
    return choice


def apply_done(c: Completion, first_index: int, num_choices: int, finish_reason: str,
               num_cached_tokens: int = 0) -> list[Choice]:
    """The request ended: its choices still open end with its finish reason, its prompt tokens found cached count
    in the usage. Returns the choices it ended."""
    c.num_cached_tokens += num_cached_tokens
    ended = [ch for ch in c.choices[first_index:first_index + num_choices] if ch.finish_reason is None]
    for ch in ended:
        ch.finish_reason = finish_reason
    return ended


def token_entries(pieces, token_ids, logprobs, tops) -> list[TokenLogprob]:
    """Name every token and its alternatives with the tokenizer's text and bytes. `tops` may be shorter
    (no alternatives asked)."""
    out = []
    for k, (t, lp) in enumerate(zip(token_ids, logprobs)):
        alts = tuple((*pieces(a), alp) for a, alp in tops[k]) if k < len(tops) else ()
        out.append((*pieces(t), lp, alts))
    return out

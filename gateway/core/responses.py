"""OpenAI response bodies and stream chunks, built from what the worker sent."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Completion:
    """What a request produced so far, as the gateway assembles it."""

    request_id: str
    model: str
    created_s: int
    kind: str  # "completion" | "chat"
    num_prompt_tokens: int
    text_parts: list[str] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    def usage(self) -> dict:
        n = len(self.token_ids)
        return {"prompt_tokens": self.num_prompt_tokens, "completion_tokens": n,
                "total_tokens": self.num_prompt_tokens + n}

    @property
    def object_id(self) -> str:
        return f"{'chatcmpl' if self.kind == 'chat' else 'cmpl'}-{self.request_id}"


TokenLogprob = tuple[str, bytes, float]  # a token's text, its bytes, its log-probability


def _completion_logprobs(entries: list[TokenLogprob]) -> dict:
    return {"tokens": [t for t, _, _ in entries], "token_logprobs": [lp for _, _, lp in entries],
            "top_logprobs": None, "text_offset": None}


def _chat_logprobs(entries: list[TokenLogprob]) -> dict:
    return {"content": [{"token": t, "logprob": lp, "bytes": list(raw), "top_logprobs": []}
                        for t, raw, lp in entries]}


def _logprobs(kind: str, entries: list[TokenLogprob]) -> dict:
    return _chat_logprobs(entries) if kind == "chat" else _completion_logprobs(entries)


def final_body(c: Completion, logprobs: list[TokenLogprob] | None = None) -> dict:
    """`logprobs`: one entry per generated token when the request asked for them (None: it did not)."""
    lp = _logprobs(c.kind, logprobs) if logprobs is not None else None
    if c.kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": c.text}, "logprobs": lp,
                  "finish_reason": c.finish_reason}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": c.text, "logprobs": lp, "finish_reason": c.finish_reason}
        obj = "text_completion"
    return {"id": c.object_id, "object": obj, "created": c.created_s, "model": c.model, "choices": [choice],
            "usage": c.usage()}


def chunk_body(c: Completion, text: str, finish_reason: str | None = None, *, is_first: bool = False,
               logprobs: list[TokenLogprob] | None = None) -> dict:
    lp = _logprobs(c.kind, logprobs) if logprobs else None
    if c.kind == "chat":
        delta: dict = {"role": "assistant", "content": text} if is_first else ({"content": text} if text else {})
        choice = {"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish_reason}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text, "logprobs": lp, "finish_reason": finish_reason}
        obj = "text_completion"
    return {"id": c.object_id, "object": obj, "created": c.created_s, "model": c.model, "choices": [choice]}


def usage_chunk(c: Completion) -> dict:
    obj = "chat.completion.chunk" if c.kind == "chat" else "text_completion"
    return {"id": c.object_id, "object": obj, "created": c.created_s, "model": c.model, "choices": [],
            "usage": c.usage()}

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


def _completion_logprobs(tokens: list[str], logprobs: list[float]) -> dict:
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": None, "text_offset": None}


def _chat_logprobs(tokens: list[str], logprobs: list[float]) -> dict:
    return {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                        for t, lp in zip(tokens, logprobs)]}


def final_body(c: Completion, token_texts: list[str] | None = None, want_logprobs: bool = False) -> dict:
    lp = None
    if want_logprobs:
        texts = token_texts or [""] * len(c.logprobs)
        lp = _chat_logprobs(texts, c.logprobs) if c.kind == "chat" else _completion_logprobs(texts, c.logprobs)
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
               logprobs: list[float] | None = None) -> dict:
    if c.kind == "chat":
        delta: dict = {"role": "assistant", "content": text} if is_first else ({"content": text} if text else {})
        lp = ({"content": [{"token": "", "logprob": v, "bytes": [], "top_logprobs": []} for v in logprobs]}
              if logprobs else None)
        choice = {"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish_reason}
        obj = "chat.completion.chunk"
    else:
        lp = _completion_logprobs([""] * len(logprobs), logprobs) if logprobs else None
        choice = {"index": 0, "text": text, "logprobs": lp, "finish_reason": finish_reason}
        obj = "text_completion"
    return {"id": c.object_id, "object": obj, "created": c.created_s, "model": c.model, "choices": [choice]}


def usage_chunk(c: Completion) -> dict:
    obj = "chat.completion.chunk" if c.kind == "chat" else "text_completion"
    return {"id": c.object_id, "object": obj, "created": c.created_s, "model": c.model, "choices": [],
            "usage": c.usage()}

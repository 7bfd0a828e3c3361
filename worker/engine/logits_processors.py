"""What a request's own parameters do to the model's logits before a token is chosen, for a whole batch at once.

In vLLM's order: min_tokens (EOS and stop ids masked until enough output), logit_bias, then the penalties —
repetition (vLLM: over prompt + output, a seen token's positive logit divided by the penalty, a negative one
multiplied), frequency and presence (OpenAI: over the output, `logit -= frequency * count + presence * (count > 0)`).
Each is applied only when some row of the batch asks for it, as one scatter or one masked op over the rows that do:
no Python loop over the vocabulary.
"""
from __future__ import annotations

from typing import Protocol, Sequence

import torch

from contracts.requests import SamplingParams


class History(Protocol):
    """A row's tokens so far: prompt first, then output."""

    token_ids: list[int]
    num_prompt_tokens: int


def process_logits(logits: torch.Tensor, params: Sequence[SamplingParams], histories: Sequence[History],
                   eos_token_ids: frozenset[int]) -> torch.Tensor:
    """logits [N, vocab] float32 (not changed); returns the processed logits (the same tensor when nothing applies)."""
    x = logits
    masked = _min_tokens_mask(params, histories, eos_token_ids)
    if masked is not None:
        x = x.clone()
        rows, ids = (torch.tensor(v, dtype=torch.long, device=x.device) for v in masked)
        x[rows, ids] = float("-inf")
    biased = [(i, t, b) for i, p in enumerate(params) for t, b in p.logit_bias]
    if biased:
        x = x.clone() if x is logits else x
        rows, ids = (torch.tensor([e[k] for e in biased], dtype=torch.long, device=x.device) for k in (0, 1))
        values = torch.tensor([e[2] for e in biased], dtype=x.dtype, device=x.device)
        x.index_put_((rows, ids), values, accumulate=True)
    penalised = [i for i, p in enumerate(params) if p.has_penalties]
    if penalised:
        x = x.clone() if x is logits else x
        x[penalised] = _penalties(x[penalised], [params[i] for i in penalised], [histories[i] for i in penalised])
    return x


def _min_tokens_mask(params, histories, eos_token_ids) -> tuple[list[int], list[int]] | None:
    rows: list[int] = []
    ids: list[int] = []
    for i, (p, h) in enumerate(zip(params, histories)):
        if p.min_tokens and len(h.token_ids) - h.num_prompt_tokens < p.min_tokens:
            stops = set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos_token_ids))
            rows += [i] * len(stops)
            ids += sorted(stops)
    return (rows, ids) if rows else None


def _token_counts(x: torch.Tensor, token_lists: Sequence[Sequence[int]]) -> torch.Tensor:
    """[rows, vocab] how often each token occurs in each row's list: one scatter-add over all rows."""
    counts = torch.zeros_like(x)
    rows = [i for i, tokens in enumerate(token_lists) for _ in tokens]
    if rows:
        flat = [t for tokens in token_lists for t in tokens]
        index = (torch.tensor(rows, dtype=torch.long, device=x.device),
                 torch.tensor(flat, dtype=torch.long, device=x.device))
        counts.index_put_(index, torch.ones(len(flat), dtype=x.dtype, device=x.device), accumulate=True)
    return counts


def _penalties(x: torch.Tensor, params: Sequence[SamplingParams], histories: Sequence[History]) -> torch.Tensor:
    dev, dtype = x.device, x.dtype
    outputs = [h.token_ids[h.num_prompt_tokens:] for h in histories]
    output_counts = _token_counts(x, outputs)
    repetition = torch.tensor([p.repetition_penalty for p in params], dtype=dtype, device=dev)[:, None]
    if any(p.repetition_penalty != 1.0 for p in params):
        prompts = [h.token_ids[: h.num_prompt_tokens] if p.repetition_penalty != 1.0 else ()
                   for p, h in zip(params, histories)]
        seen = (_token_counts(x, prompts) > 0) | (output_counts > 0)
        x = torch.where(seen, torch.where(x > 0, x / repetition, x * repetition), x)
    frequency = torch.tensor([p.frequency_penalty for p in params], dtype=dtype, device=dev)[:, None]
    presence = torch.tensor([p.presence_penalty for p in params], dtype=dtype, device=dev)[:, None]
    return x - frequency * output_counts - presence * (output_counts > 0).to(dtype)

"""Attention over the paged KV cache for a flat batch of tokens: decoding requests first (one token each), then
prefill chunks.

Decode: each layer gathers the requests' blocks with one `index_select` over the cache's units (`kv_cache`
docstring), and one masked SDPA call runs the whole batch over strided K/V views. Grouped-query attention folds the
query heads of a KV head into SDPA's query-length axis (`[B, kv_heads, groups, head_dim]`), so K and V are never
repeated. Prefill: one SDPA call per request, causal over the chunk itself when the request has no KV yet,
otherwise over its gathered blocks with an offset causal mask (chunked prefill, or a preempted request's
recompute). Masks are additive (0 / -inf), built once per step and shared by all layers.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .kv_cache import PagedKVCache

# SDPA learned `enable_gqa` in torch 2.5; older versions repeat K/V instead.
_HAS_ENABLE_GQA = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)


@dataclass
class PrefillSpan:
    """`num_tokens` query tokens starting at flat index `start`, at positions [num_context, num_context + n)."""

    start: int
    num_tokens: int
    num_context: int
    units: torch.Tensor | None = None  # [layers, num_blocks]: the request's blocks, when num_context > 0
    mask: torch.Tensor | None = None  # [num_tokens, num_context + num_tokens] additive


@dataclass
class AttentionBatch:
    """Where each token's K/V goes and what each query attends to. All tensors on the model's device."""

    num_decode: int = 0
    decode_units: torch.Tensor | None = None  # [layers, B * num_blocks]
    decode_mask: torch.Tensor | None = None  # [B, 1, 1, num_blocks * block_size] additive
    prefills: list[PrefillSpan] = field(default_factory=list)
    write_rows: torch.Tensor | None = None  # [layers, T] K row of each new token (V is the next row); None: no write
    write_rows_v: torch.Tensor | None = None


def _sdpa_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_groups: int, **kwargs) -> torch.Tensor:
    if num_groups == 1:
        return F.scaled_dot_product_attention(q, k, v, **kwargs)
    if _HAS_ENABLE_GQA:
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kwargs)
    return F.scaled_dot_product_attention(
        q, k.repeat_interleave(num_groups, dim=-3), v.repeat_interleave(num_groups, dim=-3), **kwargs
    )


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: PagedKVCache | None,
    layer: int,
    batch: AttentionBatch,
) -> torch.Tensor:
    """q: [T, heads, head_dim]; k, v: [T, kv_heads, head_dim]. Returns [T, heads * head_dim]."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k.shape[1]
    num_groups = num_heads // num_kv_heads
    if batch.write_rows is not None:
        kv_cache.rows.index_copy_(0, batch.write_rows[layer], k)
        kv_cache.rows.index_copy_(0, batch.write_rows_v[layer], v)
    outputs = []
    if batch.num_decode:
        b = batch.num_decode
        gathered = kv_cache.units.index_select(0, batch.decode_units[layer])
        gathered = gathered.view(b, -1, 2, num_kv_heads, head_dim)  # [B, tokens, K/V, kv_heads, head_dim]
        q_grouped = q[:b].view(b, num_kv_heads, num_groups, head_dim)
        out = F.scaled_dot_product_attention(
            q_grouped, gathered[:, :, 0].transpose(1, 2), gathered[:, :, 1].transpose(1, 2),
            attn_mask=batch.decode_mask,
        )
        outputs.append(out.reshape(b, num_heads * head_dim))
    spans = batch.prefills
    index = 0
    while index < len(spans):
        span = spans[index]
        if span.num_context == 0:
            # Consecutive fresh prompts of one length are contiguous in the flat batch: one batched SDPA call.
            run = 1
            while (index + run < len(spans) and spans[index + run].num_context == 0
                   and spans[index + run].num_tokens == span.num_tokens):
                run += 1
            n, end = span.num_tokens, span.start + run * span.num_tokens
            qs = q[span.start : end].view(run, n, num_heads, head_dim).transpose(1, 2)
            ks = k[span.start : end].view(run, n, num_kv_heads, head_dim).transpose(1, 2)
            vs = v[span.start : end].view(run, n, num_kv_heads, head_dim).transpose(1, 2)
            out = _sdpa_gqa(qs, ks, vs, num_groups, is_causal=True)  # [run, H, n, hd]
            outputs.append(out.transpose(1, 2).reshape(run * n, num_heads * head_dim))
            index += run
            continue
        qs = q[span.start : span.start + span.num_tokens].transpose(0, 1).unsqueeze(0)  # [1, H, n, hd]
        length = span.num_context + span.num_tokens
        gathered = kv_cache.units.index_select(0, span.units[layer])
        gathered = gathered.view(-1, 2, num_kv_heads, head_dim)[:length]
        ks = gathered[:, 0].transpose(0, 1).unsqueeze(0)
        vs = gathered[:, 1].transpose(0, 1).unsqueeze(0)
        out = _sdpa_gqa(qs, ks, vs, num_groups, attn_mask=span.mask)
        outputs.append(out[0].transpose(0, 1).reshape(span.num_tokens, num_heads * head_dim))
        index += 1
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=0)

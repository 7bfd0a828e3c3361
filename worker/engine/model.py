"""The Qwen2 / Llama decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU, tied or untied head) as plain
functions over weight views, on a flat batch of tokens with paged KV. Numerics follow transformers'
`Qwen2ForCausalLM` (norms computed in float32, the rotate-half RoPE, SDPA with scale 1/sqrt(head_dim))."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .attention import AttentionBatch, paged_attention
from .config import ModelConfig
from .kv_cache import PagedKVCache
from .rope import RotaryEmbedding, apply_rotary
from .weights import ModelWeights


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)  # one fused kernel; same math in float32
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _project(x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.addmm(bias, x, weight_t) if bias is not None else torch.mm(x, weight_t)


def _project_add(residual: torch.Tensor, x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor | None):
    """residual + x @ weight_t (+ bias), the residual add fused into the GEMM."""
    if bias is not None:
        residual = residual + bias
    return torch.addmm(residual, x, weight_t)


class CausalLM:
    """A decoder bound to weight views. `forward` writes the new tokens' K/V into the paged cache (unless the
    batch has no write mapping) and returns the final hidden states; `compute_logits` applies the head."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, rope: RotaryEmbedding) -> None:
        self.config = config
        self.weights = weights
        self.rope = rope
        c = config
        self._num_qk_heads = c.num_attention_heads + c.num_key_value_heads
        self._v_start = self._num_qk_heads * c.head_dim

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        batch: AttentionBatch,
        kv_cache: PagedKVCache | None,
    ) -> torch.Tensor:
        c, w = self.config, self.weights
        num_tokens = input_ids.shape[0]
        num_heads, head_dim, eps = c.num_attention_heads, c.head_dim, c.rms_norm_eps
        cos, sin = self.rope.cos_sin(positions)
        hidden = F.embedding(input_ids, w.embed)
        for index, layer in enumerate(w.layers):
            x = rms_norm(hidden, layer.input_norm, eps)
            qkv = _project(x, layer.qkv_t, layer.qkv_bias)
            # q and k are adjacent in the fused projection: one RoPE call rotates both.
            qk = apply_rotary(qkv[:, : self._v_start].view(num_tokens, self._num_qk_heads, head_dim), cos, sin)
            q, k = qk[:, :num_heads], qk[:, num_heads:]
            v = qkv[:, self._v_start :].view(num_tokens, c.num_key_value_heads, head_dim)
            attn = paged_attention(q, k, v, kv_cache, index, batch)
            hidden = _project_add(hidden, attn, layer.o_t, layer.o_bias)
            x = rms_norm(hidden, layer.post_norm, eps)
            gate, up = _project(x, layer.gate_up_t, layer.gate_up_bias).chunk(2, dim=-1)
            hidden = _project_add(hidden, F.silu(gate) * up, layer.down_t, layer.down_bias)
        return rms_norm(hidden, w.final_norm, eps)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, vocab] float32."""
        w = self.weights
        logits = F.linear(hidden, w.embed) if w.lm_head_t is None else torch.mm(hidden, w.lm_head_t)
        return logits.float()

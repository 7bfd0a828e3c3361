"""What the engine reads from a checkpoint's config.json (`ModelConfig`) and the engine's own knobs
(`EngineConfig`). Torch-free."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MiB = 1 << 20
GiB = 1 << 30

# Decoder families that share the Llama block (RMSNorm, RoPE, GQA, SwiGLU); they differ only in biases.
_SUPPORTED_MODEL_TYPES = ("qwen2", "llama", "mistral")
_SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True)
class ModelConfig:
    """The decoder's shape, read from a Hugging Face `config.json`."""

    model_type: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    tie_word_embeddings: bool
    has_qkv_bias: bool
    has_o_bias: bool
    has_mlp_bias: bool
    checkpoint_dtype: str | None = None
    eos_token_ids: tuple[int, ...] = ()

    @property
    def num_query_groups(self) -> int:
        """Query heads per KV head (grouped-query attention)."""
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> "ModelConfig":
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"no config.json in {model_dir}")
        return cls.from_dict(json.loads(path.read_text(encoding="utf-8")))

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "ModelConfig":
        model_type = raw.get("model_type")
        if model_type not in _SUPPORTED_MODEL_TYPES:
            raise ValueError(f"model_type {model_type!r} is not supported (supported: {_SUPPORTED_MODEL_TYPES})")
        if raw.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {raw.get('hidden_act')!r} is not supported (only silu / SwiGLU)")
        if raw.get("use_sliding_window"):
            raise ValueError("sliding-window attention is not supported")
        hidden = int(raw["hidden_size"])
        num_heads = int(raw["num_attention_heads"])
        num_kv_heads = int(raw.get("num_key_value_heads") or num_heads)
        if num_heads % num_kv_heads:
            raise ValueError(f"num_attention_heads {num_heads} is not a multiple of num_key_value_heads {num_kv_heads}")
        head_dim = int(raw.get("head_dim") or hidden // num_heads)
        # transformers >= 5 writes rope_parameters; older checkpoints write rope_theta + rope_scaling.
        rope_params = raw.get("rope_parameters") or {}
        rope_theta = float(rope_params.get("rope_theta", raw.get("rope_theta", 10000.0)))
        rope_scaling = raw.get("rope_scaling") or (rope_params if rope_params.get("rope_type") else None)
        if rope_scaling is not None:
            rope_type = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
            if rope_type not in _SUPPORTED_ROPE_TYPES:
                raise ValueError(f"rope type {rope_type!r} is not supported (supported: {_SUPPORTED_ROPE_TYPES})")
            rope_scaling = None if rope_type == "default" else {**rope_scaling, "rope_type": rope_type}
        is_qwen2 = model_type == "qwen2"
        attention_bias = bool(raw.get("attention_bias", False))
        eos = raw.get("eos_token_id")
        eos_ids = (eos,) if isinstance(eos, int) else tuple(eos or ())
        return cls(
            model_type=model_type,
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            head_dim=head_dim,
            vocab_size=int(raw["vocab_size"]),
            max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            # Qwen2 always has q/k/v biases and never an o_proj bias; Llama's `attention_bias` covers all four.
            has_qkv_bias=is_qwen2 or attention_bias,
            has_o_bias=(not is_qwen2) and attention_bias,
            has_mlp_bias=bool(raw.get("mlp_bias", False)),
            checkpoint_dtype=raw.get("torch_dtype") or raw.get("dtype"),
            eos_token_ids=eos_ids,
        )


@dataclass(frozen=True)
class EngineConfig:
    """Engine knobs. Defaults suit a CPU demo; a GPU deployment raises the KV budget and batch sizes."""

    block_size: int = 16  # tokens per KV block
    max_num_seqs: int = 64  # running requests at most (decode batch size)
    max_num_batched_tokens: int = 2048  # the per-step token budget (chunked prefill splits long prompts to it)
    max_model_len: int | None = None  # prompt + output tokens; None: min(max_position_embeddings, 8192)
    kv_cache_bytes: int | None = None  # KV reservation; None: 256 MiB on CPU, 8 GiB on CUDA
    page_size_bytes: int = 2 * MiB  # page size of the plain pool used when no KVPageSource is given
    num_free_pages_cached: int = 1  # empty KV pages kept before returning pages to the pool (hysteresis)
    enable_prefix_caching: bool = True  # reuse the KV of full blocks of a prompt prefix seen before (block_manager)
    use_cuda_graphs: bool = True  # CUDA only: decode steps replayed from captured graphs
    cuda_graph_max_batch_size: int = 64
    seed: int = 0  # the sampler's generator for requests without their own seed
    stats_window_s: float = 30.0  # how far back EngineStats looks
    keep_logits: bool = False  # verification aid: keep the last step's logits per request (tests, canary)

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError("block_size must be >= 1")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError("max_model_len must be >= 2")
        if self.kv_cache_bytes is not None and self.kv_cache_bytes <= 0:
            raise ValueError("kv_cache_bytes must be > 0")

    def resolved_kv_cache_bytes(self, device_type: str) -> int:
        if self.kv_cache_bytes is not None:
            return self.kv_cache_bytes
        return 8 * GiB if device_type == "cuda" else 256 * MiB

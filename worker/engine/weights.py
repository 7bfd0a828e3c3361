"""Weights as views of one flat byte buffer, loaded from Hugging Face safetensors.

Weight layout (`WeightLayout.for_config`), in the engine dtype, each tensor starting on a 256-byte boundary, in
this order:

    embed                     [vocab, hidden]          model.embed_tokens.weight
    per layer i:
      layers.i.input_norm     [hidden]
      layers.i.qkv_t          [hidden, q + 2 * kv]     q_proj | k_proj | v_proj weights, transposed, side by side
      layers.i.qkv_bias       [q + 2 * kv]             (when the model has q/k/v biases: Qwen2)
      layers.i.o_t            [q, hidden]              o_proj weight, transposed
      layers.i.o_bias         [hidden]                 (Llama with attention_bias)
      layers.i.post_norm      [hidden]
      layers.i.gate_up_t      [hidden, 2 * inter]      gate_proj | up_proj weights, transposed, side by side
      layers.i.gate_up_bias   [2 * inter]              (mlp_bias)
      layers.i.down_t         [inter, hidden]          down_proj weight, transposed
      layers.i.down_bias      [hidden]                 (mlp_bias)
    final_norm                [hidden]                 model.norm.weight
    lm_head_t                 [hidden, vocab]          lm_head.weight transposed (untied only; tied heads use embed)

Matrices are stored transposed and fused so each projection is one `addmm(bias or residual, x, W_t)` call:
fewer kernels per layer and, on CPU, faster small-batch GEMMs. The layout depends only on the config and dtype,
so two replicas of a model have byte-identical buffers: the lifecycle layer can restore or fork a buffer (host
copy, or a peer's pages by global offset) and the engine's tensors stay valid, because they are views of that
buffer (`bind`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from .checksum import bytes_checksum, segment_checksums  # noqa: F401 - the weights' fingerprint lives there
from .config import ModelConfig

ALIGN_BYTES = 256  # each tensor starts on this boundary (relative to the buffer start)
_MIN_BUFFER_ALIGN_BYTES = 64


@dataclass(frozen=True)
class WeightEntry:
    name: str
    shape: tuple[int, ...]
    offset_bytes: int
    num_bytes: int


@dataclass(frozen=True)
class _Source:
    """Where a checkpoint tensor goes: entry `name`, columns (or elements) [start, stop), transposed or not."""

    entry: str
    start: int
    stop: int
    is_transposed: bool


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    qkv_t: torch.Tensor  # [hidden, q + 2 * kv]
    qkv_bias: torch.Tensor | None
    o_t: torch.Tensor  # [q, hidden]
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up_t: torch.Tensor  # [hidden, 2 * intermediate]
    gate_up_bias: torch.Tensor | None
    down_t: torch.Tensor  # [intermediate, hidden]
    down_bias: torch.Tensor | None


@dataclass
class ModelWeights:
    embed: torch.Tensor  # [vocab, hidden]
    layers: list[LayerWeights]
    final_norm: torch.Tensor
    lm_head_t: torch.Tensor | None  # [hidden, vocab]; None when tied (the head is `embed`)


class WeightLayout:
    """Where each tensor lives in the flat buffer and where each checkpoint tensor goes (module docstring)."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype, entries: list[WeightEntry],
                 sources: dict[str, _Source], total_bytes: int):
        self.config = config
        self.dtype = dtype
        self.entries = {e.name: e for e in entries}
        self.sources = sources
        self.total_bytes = total_bytes

    @classmethod
    def for_config(cls, config: ModelConfig, dtype: torch.dtype) -> "WeightLayout":
        c = config
        elem = torch.empty((), dtype=dtype).element_size()
        h, d, inter, vocab = c.hidden_size, c.head_dim, c.intermediate_size, c.vocab_size
        q_out, kv_out = c.num_attention_heads * d, c.num_key_value_heads * d
        shapes: list[tuple[str, tuple[int, ...]]] = [("embed", (vocab, h))]
        sources: dict[str, _Source] = {"model.embed_tokens.weight": _Source("embed", 0, vocab, False)}
        qkv_cols = (("q", 0, q_out), ("k", q_out, q_out + kv_out), ("v", q_out + kv_out, q_out + 2 * kv_out))
        for i in range(c.num_hidden_layers):
            p, e = f"model.layers.{i}.", f"layers.{i}."
            shapes += [(e + "input_norm", (h,)), (e + "qkv_t", (h, q_out + 2 * kv_out))]
            sources[p + "input_layernorm.weight"] = _Source(e + "input_norm", 0, h, False)
            for name, start, stop in qkv_cols:
                sources[p + f"self_attn.{name}_proj.weight"] = _Source(e + "qkv_t", start, stop, True)
            if c.has_qkv_bias:
                shapes.append((e + "qkv_bias", (q_out + 2 * kv_out,)))
                for name, start, stop in qkv_cols:
                    sources[p + f"self_attn.{name}_proj.bias"] = _Source(e + "qkv_bias", start, stop, False)
            shapes.append((e + "o_t", (q_out, h)))
            sources[p + "self_attn.o_proj.weight"] = _Source(e + "o_t", 0, h, True)
            if c.has_o_bias:
                shapes.append((e + "o_bias", (h,)))
                sources[p + "self_attn.o_proj.bias"] = _Source(e + "o_bias", 0, h, False)
            shapes += [(e + "post_norm", (h,)), (e + "gate_up_t", (h, 2 * inter))]
            sources[p + "post_attention_layernorm.weight"] = _Source(e + "post_norm", 0, h, False)
            sources[p + "mlp.gate_proj.weight"] = _Source(e + "gate_up_t", 0, inter, True)
            sources[p + "mlp.up_proj.weight"] = _Source(e + "gate_up_t", inter, 2 * inter, True)
            if c.has_mlp_bias:
                shapes.append((e + "gate_up_bias", (2 * inter,)))
                sources[p + "mlp.gate_proj.bias"] = _Source(e + "gate_up_bias", 0, inter, False)
                sources[p + "mlp.up_proj.bias"] = _Source(e + "gate_up_bias", inter, 2 * inter, False)
            shapes.append((e + "down_t", (inter, h)))
            sources[p + "mlp.down_proj.weight"] = _Source(e + "down_t", 0, h, True)
            if c.has_mlp_bias:
                shapes.append((e + "down_bias", (h,)))
                sources[p + "mlp.down_proj.bias"] = _Source(e + "down_bias", 0, h, False)
        shapes.append(("final_norm", (h,)))
        sources["model.norm.weight"] = _Source("final_norm", 0, h, False)
        if not c.tie_word_embeddings:
            shapes.append(("lm_head_t", (h, vocab)))
            sources["lm_head.weight"] = _Source("lm_head_t", 0, vocab, True)
        entries, offset = [], 0
        for name, shape in shapes:
            offset = -(-offset // ALIGN_BYTES) * ALIGN_BYTES
            num_bytes = elem
            for dim in shape:
                num_bytes *= dim
            entries.append(WeightEntry(name, shape, offset, num_bytes))
            offset += num_bytes
        return cls(config, dtype, entries, sources, -(-offset // ALIGN_BYTES) * ALIGN_BYTES)

    def view(self, buffer: torch.Tensor, name: str) -> torch.Tensor:
        e = self.entries[name]
        return buffer[e.offset_bytes : e.offset_bytes + e.num_bytes].view(self.dtype).view(e.shape)

    def target(self, buffer: torch.Tensor, checkpoint_name: str) -> torch.Tensor:
        """The view a checkpoint tensor is copied into, in the checkpoint's own orientation."""
        src = self.sources[checkpoint_name]
        entry = self.view(buffer, src.entry)
        if src.is_transposed:
            return entry[:, src.start : src.stop].t()
        return entry[src.start : src.stop]

    def bind(self, buffer: torch.Tensor) -> ModelWeights:
        """Typed views of `buffer` (uint8, at least `total_bytes`); no copy."""
        if buffer.dtype != torch.uint8 or buffer.dim() != 1 or buffer.numel() < self.total_bytes:
            raise ValueError(f"weight buffer must be a 1-D uint8 tensor of at least {self.total_bytes} bytes")
        if buffer.data_ptr() % _MIN_BUFFER_ALIGN_BYTES:  # torch's CPU allocator aligns to 64 bytes
            raise ValueError(f"weight buffer must be {_MIN_BUFFER_ALIGN_BYTES}-byte aligned")

        def opt(name: str) -> torch.Tensor | None:
            return self.view(buffer, name) if name in self.entries else None

        layers = []
        for i in range(self.config.num_hidden_layers):
            e = f"layers.{i}."
            layers.append(LayerWeights(
                input_norm=self.view(buffer, e + "input_norm"),
                qkv_t=self.view(buffer, e + "qkv_t"),
                qkv_bias=opt(e + "qkv_bias"),
                o_t=self.view(buffer, e + "o_t"),
                o_bias=opt(e + "o_bias"),
                post_norm=self.view(buffer, e + "post_norm"),
                gate_up_t=self.view(buffer, e + "gate_up_t"),
                gate_up_bias=opt(e + "gate_up_bias"),
                down_t=self.view(buffer, e + "down_t"),
                down_bias=opt(e + "down_bias"),
            ))
        return ModelWeights(self.view(buffer, "embed"), layers, self.view(buffer, "final_norm"), opt("lm_head_t"))


def checkpoint_files(model_dir: str | Path) -> list[Path]:
    """The safetensors files of a checkpoint: the shards named by `model.safetensors.index.json`, else every
    `*.safetensors` in the folder."""
    root = Path(model_dir)
    index = root / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = [root / f for f in sorted(set(weight_map.values()))]
    else:
        files = sorted(root.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {root}")
    return files


def load_checkpoint(model_dir: str | Path, layout: WeightLayout, buffer: torch.Tensor) -> None:
    """Copy every tensor of the checkpoint into its place in `buffer` (cast to the layout's dtype). Bytes the
    layout does not use are zeroed, so replicas' buffers (and their checksums) are identical."""
    from safetensors import safe_open

    buffer.zero_()
    loaded: set[str] = set()
    for path in checkpoint_files(model_dir):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                if name not in layout.sources:
                    if name == "lm_head.weight" and layout.config.tie_word_embeddings:
                        continue  # some tied checkpoints store the head too
                    if name.endswith("rotary_emb.inv_freq"):
                        continue
                    raise ValueError(f"{path.name}: unexpected tensor {name!r} for this model config")
                tensor = f.get_tensor(name)
                target = layout.target(buffer, name)
                if tuple(tensor.shape) != tuple(target.shape):
                    raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != config's {tuple(target.shape)}")
                target.copy_(tensor)
                loaded.add(name)
    missing = sorted(set(layout.sources) - loaded)
    if missing:
        raise ValueError(f"checkpoint {model_dir} lacks {len(missing)} tensors, e.g. {missing[:3]}")

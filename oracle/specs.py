"""Device specs and model shapes: the plain numbers the roofline model, the simulator and the planners start from.

Pure and torch-free, no clock. Every device figure says where it comes from (see docs/oracle.md, "Device specs"):
measured here (one H200's copy bandwidths; this CPU: oracle/cpu_device.py, calibrate_cpu), a vendor datasheet, or
a stated assumption.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

GIB = 2**30
MIB = 2**20


@dataclass(frozen=True)
class DeviceSpec:
    """One device (one die): capacity and the speeds that bound serving work on it.

    `d2d_bytes_per_s` is the link a replica is forked over (device to *another* device), not a copy inside one
    device; `local_copy_bytes_per_s` is the latter (0 when unknown). `net_bytes_per_s` is the scale-out network a
    device reads another host's pinned memory over (RDMA; 0 when unknown: no such path)."""

    name: str
    hbm_bytes: int
    peak_bf16_flops_per_s: float
    hbm_bytes_per_s: float
    h2d_bytes_per_s: float
    d2d_bytes_per_s: float
    disk_bytes_per_s: float
    local_copy_bytes_per_s: float = 0.0
    net_bytes_per_s: float = 0.0
    source: str = ""

    def __post_init__(self) -> None:
        for field_name in ("hbm_bytes", "peak_bf16_flops_per_s", "hbm_bytes_per_s", "h2d_bytes_per_s",
                           "d2d_bytes_per_s", "disk_bytes_per_s"):
            if not getattr(self, field_name) > 0:
                raise ValueError(f"DeviceSpec {self.name!r}: {field_name} must be > 0, got {getattr(self, field_name)}")

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity above which work on this device is compute-bound."""
        return self.peak_bf16_flops_per_s / self.hbm_bytes_per_s


# Copy bandwidths measured on one H200 (pinned host->device; in-device copy), GB/s: docs/oracle.md, "Devices".
H200_MEASURED_GBPS = {"h2d_pinned": 55.2, "d2d": 3823.1}


def h200(measured_GBps: Mapping[str, float] | None = None) -> DeviceSpec:
    """NVIDIA H200 SXM. HBM size and speeds from NVIDIA's datasheet (141 GB HBM3e = 143,771 MiB as nvidia-smi reports
    it, 4.8 TB/s, 989 TFLOP/s dense BF16); pinned host->device and in-device copy measured here; NVLink 4 gives
    450 GB/s per direction to a peer; disk is one PCIe 4.0 NVMe drive (~7 GB/s), an assumption. Network: one
    400 Gb/s RDMA NIC per GPU (as in DGX H200) at the efficiency the host link measured here (55/64), an assumption.
    `measured_GBps`: figures measured on another H200, by the same keys ("h2d_pinned", "d2d")."""
    measured = {**H200_MEASURED_GBPS, **(measured_GBps or {})}
    return DeviceSpec(
        name="nvidia-h200",
        hbm_bytes=143_771 * MIB,
        peak_bf16_flops_per_s=989.4e12,
        hbm_bytes_per_s=4.8e12,
        h2d_bytes_per_s=measured["h2d_pinned"] * 1e9,
        d2d_bytes_per_s=450e9,
        disk_bytes_per_s=7e9,
        local_copy_bytes_per_s=measured["d2d"] * 1e9,
        net_bytes_per_s=50e9 * 55 / 64,
        source="NVIDIA H200 datasheet; h2d and local copy measured on one H200",
    )


def ascend_910c_die() -> DeviceSpec:
    """One die of a Huawei Ascend 910C (the paper's device; a 910C package holds two dies). Public figures for the
    package: ~752-780 TFLOP/s BF16, 128 GB HBM2E in eight stacks at 3.2 TB/s (CloudMatrix384 report, arXiv
    2506.12708; DigiTimes via TechPowerUp), split evenly per die. Die-to-die link: 163.6 GB/s, the figure the Janus
    paper uses for its D2D restore. Host link: half of a PCIe 5.0 x16 at the efficiency the H200 measured here
    (55/64) per die, an assumption. Disk as for the H200, an assumption. Network: the package's 400 Gb/s RDMA plane
    (CloudMatrix384 report) split per die, at the same efficiency, an assumption."""
    return DeviceSpec(
        name="ascend-910c-die",
        hbm_bytes=64 * GIB,
        peak_bf16_flops_per_s=376e12,
        hbm_bytes_per_s=1.6e12,
        h2d_bytes_per_s=27.6e9,
        d2d_bytes_per_s=163.6e9,
        disk_bytes_per_s=7e9,
        net_bytes_per_s=25e9 * 55 / 64,
        source="CloudMatrix384 report (arXiv 2506.12708) per-package figures / 2; Janus paper D2D link",
    )


DEVICES = {"nvidia-h200": h200, "ascend-910c-die": ascend_910c_die}


def device(name: str) -> DeviceSpec:
    """A catalogued device by name (`nvidia-h200`, `ascend-910c-die`)."""
    try:
        return DEVICES[name]()
    except KeyError:
        raise ValueError(f"unknown device {name!r}; known: {sorted(DEVICES)}") from None


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer's shape. GQA attention by default; `kv_lora_rank > 0` switches to DeepSeek's
    multi-head latent attention (MLA), whose KV cache is one compressed vector per token per layer. MoE when
    `num_experts > 0`: the first `num_dense_layers` layers keep a dense MLP of `intermediate_size`, the rest route
    each token to `num_active_experts` of `num_experts` experts of `moe_intermediate_size` plus
    `num_shared_experts` always-on experts. Weight bytes per parameter default to bf16; KV is stored in bf16."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    bytes_per_param: float = 2.0
    kv_bytes_per_element: int = 2
    tie_embeddings: bool = False
    has_qkv_bias: bool = False
    num_experts: int = 0
    num_active_experts: int = 0
    num_shared_experts: int = 0
    moe_intermediate_size: int = 0
    num_dense_layers: int = 0
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0

    def __post_init__(self) -> None:
        for field_name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                           "intermediate_size", "vocab_size"):
            if getattr(self, field_name) < 1:
                raise ValueError(f"ModelShape {self.name!r}: {field_name} must be >= 1")
        if self.bytes_per_param <= 0 or self.kv_bytes_per_element < 1:
            raise ValueError(f"ModelShape {self.name!r}: bytes per param and per KV element must be positive")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"ModelShape {self.name!r}: num_heads must be a multiple of num_kv_heads")
        if self.is_moe and not (0 < self.num_active_experts <= self.num_experts and self.moe_intermediate_size > 0):
            raise ValueError(f"ModelShape {self.name!r}: MoE needs 0 < active <= experts and an expert size")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    # --- parameter counts -------------------------------------------------------------------------------------
    @property
    def attn_params_per_layer(self) -> int:
        h, d = self.hidden_size, self.head_dim
        if self.is_mla:
            qk_dim = d + self.qk_rope_head_dim  # head_dim is the non-rotary part of q/k in MLA
            q = (h * self.q_lora_rank + self.q_lora_rank * self.num_heads * qk_dim) if self.q_lora_rank \
                else h * self.num_heads * qk_dim
            kv = h * (self.kv_lora_rank + self.qk_rope_head_dim) \
                + self.kv_lora_rank * self.num_heads * (d + self.v_head_dim)
            return q + kv + self.num_heads * self.v_head_dim * h
        q_out, kv_out = self.num_heads * d, self.num_kv_heads * d
        bias = (q_out + 2 * kv_out) if self.has_qkv_bias else 0
        return h * q_out + 2 * h * kv_out + q_out * h + bias

    @property
    def expert_params(self) -> int:
        return 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def dense_mlp_params(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size * (1 if self.tie_embeddings else 2)

    @property
    def num_params(self) -> int:
        """All parameters (every expert counted)."""
        num_dense = self.num_layers - self.num_moe_layers
        moe = self.num_moe_layers * (self.num_experts + self.num_shared_experts) * self.expert_params
        router = self.num_moe_layers * self.hidden_size * self.num_experts
        norms = self.num_layers * 2 * self.hidden_size + self.hidden_size
        return (self.num_layers * self.attn_params_per_layer + num_dense * self.dense_mlp_params + moe + router
                + norms + self.embedding_params)

    @property
    def num_active_params(self) -> int:
        """Parameters one token's forward pass multiplies through (routed experts: only the active ones; the input
        embedding is a lookup, not a matmul, so only the LM head counts of the embeddings)."""
        num_dense = self.num_layers - self.num_moe_layers
        moe = self.num_moe_layers * (self.num_active_experts + self.num_shared_experts) * self.expert_params
        return (self.num_layers * self.attn_params_per_layer + num_dense * self.dense_mlp_params + moe
                + self.vocab_size * self.hidden_size)

    @property
    def kv_elements_per_token_per_layer(self) -> int:
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.num_kv_heads * self.head_dim

    def check_tp(self, tp: int) -> None:
        """Raise unless this shape can be split over `tp` devices by heads."""
        if tp < 1 or self.num_heads % tp:
            raise ValueError(f"{self.name}: tensor parallelism {tp} must divide num_heads {self.num_heads}")

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any], name: str = "", bytes_per_param: float | None = None) \
            -> "ModelShape":
        """A shape from a Hugging Face `config.json` (Qwen2 / Llama / DeepSeek-V3 keys)."""
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        dtype_bytes = {"float32": 4, "bfloat16": 2, "float16": 2}.get(str(config.get("torch_dtype", "bfloat16")), 2)
        head_dim = int(config.get("qk_nope_head_dim") or config.get("head_dim") or hidden // heads)
        return cls(
            name=name or str(config.get("_name_or_path") or config.get("model_type", "model")),
            num_layers=int(config["num_hidden_layers"]),
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            intermediate_size=int(config["intermediate_size"]),
            vocab_size=int(config["vocab_size"]),
            bytes_per_param=float(bytes_per_param if bytes_per_param is not None else dtype_bytes),
            tie_embeddings=bool(config.get("tie_word_embeddings", False)),
            has_qkv_bias=str(config.get("model_type", "")).startswith("qwen2"),
            num_experts=int(config.get("n_routed_experts") or 0),
            num_active_experts=int(config.get("num_experts_per_tok") or 0) if config.get("n_routed_experts") else 0,
            num_shared_experts=int(config.get("n_shared_experts") or 0),
            moe_intermediate_size=int(config.get("moe_intermediate_size") or 0),
            num_dense_layers=int(config.get("first_k_dense_replace") or 0),
            q_lora_rank=int(config.get("q_lora_rank") or 0),
            kv_lora_rank=int(config.get("kv_lora_rank") or 0),
            qk_rope_head_dim=int(config.get("qk_rope_head_dim") or 0) if config.get("kv_lora_rank") else 0,
            v_head_dim=int(config.get("v_head_dim") or 0),
        )


def _qwen2(name: str, layers: int, hidden: int, heads: int, kv_heads: int, inter: int, vocab: int, tied: bool) \
        -> ModelShape:
    return ModelShape(name=name, num_layers=layers, hidden_size=hidden, num_heads=heads, num_kv_heads=kv_heads,
                      head_dim=hidden // heads, intermediate_size=inter, vocab_size=vocab, tie_embeddings=tied,
                      has_qkv_bias=True)


def _llama(name: str, layers: int, hidden: int, heads: int, kv_heads: int, inter: int) -> ModelShape:
    return ModelShape(name=name, num_layers=layers, hidden_size=hidden, num_heads=heads, num_kv_heads=kv_heads,
                      head_dim=hidden // heads, intermediate_size=inter, vocab_size=128_256)


# Shapes from each model's published config.json. 14B and 32B are Qwen2.5 (same architecture as Qwen2).
MODEL_SHAPES: dict[str, ModelShape] = {
    s.name: s
    for s in (
        _qwen2("qwen2-0.5b", 24, 896, 14, 2, 4_864, 151_936, tied=True),
        _qwen2("qwen2-1.5b", 28, 1_536, 12, 2, 8_960, 151_936, tied=True),
        _qwen2("qwen2-7b", 28, 3_584, 28, 4, 18_944, 152_064, tied=False),
        _llama("llama-3-8b", 32, 4_096, 32, 8, 14_336),
        _qwen2("qwen2.5-14b", 48, 5_120, 40, 8, 13_824, 152_064, tied=False),
        _qwen2("qwen2.5-32b", 64, 5_120, 40, 8, 27_648, 152_064, tied=False),
        _llama("llama-3-70b", 80, 8_192, 64, 8, 28_672),
        # DeepSeek-V3 as released: FP8 weights (1 byte), MLA, 256 routed experts (8 active) + 1 shared, 3 dense layers
        ModelShape(name="deepseek-v3-671b", num_layers=61, hidden_size=7_168, num_heads=128, num_kv_heads=128,
                   head_dim=128, intermediate_size=18_432, vocab_size=129_280, bytes_per_param=1.0,
                   num_experts=256, num_active_experts=8, num_shared_experts=1, moe_intermediate_size=2_048,
                   num_dense_layers=3, q_lora_rank=1_536, kv_lora_rank=512, qk_rope_head_dim=64, v_head_dim=128),
    )
}


def model_shape(name: str, **overrides: Any) -> ModelShape:
    """A catalogued shape by name, optionally with fields replaced (e.g. `bytes_per_param=1`)."""
    try:
        shape = MODEL_SHAPES[name]
    except KeyError:
        raise ValueError(f"unknown model shape {name!r}; known: {sorted(MODEL_SHAPES)}") from None
    return replace(shape, **overrides) if overrides else shape

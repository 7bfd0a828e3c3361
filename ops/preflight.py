"""The checkpoints a cluster config names, checked when the config is loaded, before any process starts: the files
are there, the architecture is one the engine runs, and the model fits the worker's page pool. Without this a
`model_type: gemma2` was found only when a worker loaded it, 18.6 s after `janus up`, inside a traceback (issue 28).

Reads only config.json and the safetensors headers (no torch, no weights), so it costs milliseconds. Each problem is
a ConfigError: one line naming the model's YAML path (`models[0]`), the file and what is wrong. A check may pass a
model the worker still refuses (it is a lower bound: weights plus one KV page), never the other way round.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

from runtime.catalog import model_dir
from runtime.settings import ClusterConfig, ModelSpec

from .effective import ConfigError

# The engine's dtype per device (worker/engine/engine.py: _resolve_dtype): float32 on CPU, bfloat16 on CUDA.
BYTES_PER_ELEMENT = {"cpu": 4}
DEFAULT_BYTES_PER_ELEMENT = 2
KV_BLOCK_TOKENS = 16  # EngineConfig.block_size
_SAFETENSORS_HEADER_MAX_BYTES = 100 << 20  # the format's own limit on a header


def check_checkpoints(cluster: ClusterConfig, models_dir: Path, where: str = "cluster config") -> None:
    """Raise ConfigError for the first model whose checkpoint is missing, unsupported or too large for a worker.
    A demo model whose files are not written yet is skipped (`janus up` writes it: a supported shape)."""
    for index, spec in enumerate(cluster.models):
        folder = model_dir(spec, models_dir)
        if spec.demo and spec.path is None and not (folder / "config.json").exists():
            continue
        _check_one(cluster, spec, folder, f"{where}: models[{index}] ({spec.name})")


def _check_one(cluster: ClusterConfig, spec: ModelSpec, folder: Path, label: str) -> None:
    from worker.engine.config import ModelConfig  # torch-free

    if not folder.is_dir():
        raise ConfigError(f"{label}: path {str(folder)!r} is not a folder (a Hugging Face checkpoint is needed: "
                          "config.json, tokenizer.json, *.safetensors)")
    missing = [name for name in ("config.json", "tokenizer.json") if not (folder / name).is_file()]
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        missing.append("*.safetensors")
    if missing:
        raise ConfigError(f"{label}: {folder} lacks {', '.join(missing)}")
    try:
        raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        config = ModelConfig.from_dict(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{label}: {folder / 'config.json'} is not JSON: {exc}") from None
    except KeyError as exc:
        raise ConfigError(f"{label}: {folder / 'config.json'} has no {exc}") from None
    except (ValueError, TypeError) as exc:  # model_type gemma2, an activation or a RoPE the engine does not run
        raise ConfigError(f"{label}: {folder / 'config.json'}: {exc}") from None
    _check_page_fit(cluster, config, shards, label)


def _check_page_fit(cluster: ClusterConfig, config, shards: list[Path], label: str) -> None:
    workers = cluster.workers
    device = workers.device.split(":")[0]
    element_bytes = BYTES_PER_ELEMENT.get(device, DEFAULT_BYTES_PER_ELEMENT)
    page = workers.page_size_bytes
    kv_block_bytes = (config.num_hidden_layers * 2 * KV_BLOCK_TOKENS * config.num_key_value_heads * config.head_dim
                      * element_bytes)
    if kv_block_bytes > page:
        raise ConfigError(f"{label}: a KV block ({KV_BLOCK_TOKENS} tokens, {kv_block_bytes} bytes) does not fit "
                          f"workers.page_size_bytes: {page}")
    num_params = sum(_num_elements(shard, label) for shard in shards)
    weight_bytes = num_params * element_bytes
    needed_pages = -(-weight_bytes // page) + 1  # the weights, and at least one page of KV cache
    pool_pages = workers.pool_bytes // page
    if needed_pages > pool_pages:
        raise ConfigError(f"{label}: needs at least {needed_pages} pages of {page} bytes ({num_params} parameters, "
                          f"{weight_bytes / (1 << 20):.1f} MiB on {device}, plus one KV page) but workers.pool_bytes: "
                          f"{workers.pool_bytes} holds {pool_pages}")


def _num_elements(shard: Path, label: str) -> int:
    """Parameters in one safetensors file, from its header (8 bytes little-endian length, then JSON)."""
    try:
        with shard.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > _SAFETENSORS_HEADER_MAX_BYTES:
                raise ValueError(f"header of {length} bytes")
            header = json.loads(f.read(length))
    except (OSError, struct.error, ValueError) as exc:
        raise ConfigError(f"{label}: {shard} is not a safetensors file ({exc})") from None
    total = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        count = 1
        for dim in entry.get("shape", ()):
            count *= int(dim)
        total += count
    return total

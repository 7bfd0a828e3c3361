"""Where each served model's files are and how long a context it serves: what the gateway and the worker both read.
Writing the demo checkpoints is the operator tools' job (ops/demo_models.py)."""
from __future__ import annotations

import json
from pathlib import Path

from .settings import ModelSpec


def model_dir(spec: ModelSpec, models_dir: Path) -> Path:
    if spec.path is not None:
        return Path(spec.path)
    return Path(models_dir) / (spec.demo or spec.name)


def is_complete(path: Path) -> bool:
    return (path / "config.json").exists() and (path / "tokenizer.json").exists() and any(path.glob("*.safetensors"))


# Longer contexts than this are not served by default on a demo cluster (KV memory); gateway and engine share it.
MAX_SERVED_CONTEXT_TOKENS = 8192


def max_model_len(path: Path) -> int:
    """Prompt + output tokens a served model takes: what gateway validation and the engine both use."""
    config = json.loads((Path(path) / "config.json").read_text())
    native = int(config.get("max_position_embeddings") or config.get("max_sequence_length") or 2048)
    return min(native, MAX_SERVED_CONTEXT_TOKENS)

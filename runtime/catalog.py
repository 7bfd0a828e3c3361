"""Where each served model's files are, and generating the demo checkpoints a fresh machine needs."""
from __future__ import annotations

import json
import logging
from pathlib import Path

from .settings import ClusterConfig, ModelSpec

log = logging.getLogger("janus.catalog")


def model_dir(spec: ModelSpec, models_dir: Path) -> Path:
    if spec.path is not None:
        return Path(spec.path)
    return Path(models_dir) / (spec.demo or spec.name)


def is_complete(path: Path) -> bool:
    return (path / "config.json").exists() and (path / "tokenizer.json").exists() and any(path.glob("*.safetensors"))


def ensure_demo_models(cluster: ClusterConfig, models_dir: Path) -> dict[str, Path]:
    """Write the demo checkpoints the config names and that are not on disk yet (nothing is downloaded)."""
    missing = [m.demo for m in cluster.models if m.demo and not is_complete(model_dir(m, models_dir))]
    if missing:
        from worker.engine.demo import make_demo_models  # torch: only when something must be written

        log.info("writing demo checkpoints %s into %s", missing, models_dir)
        make_demo_models(Path(models_dir), missing)
    paths = {m.name: model_dir(m, models_dir) for m in cluster.models}
    for name, path in paths.items():
        if not is_complete(path):
            raise SystemExit(f"model {name}: no complete Hugging Face checkpoint at {path} "
                             "(config.json, tokenizer.json and *.safetensors are needed)")
    return paths


# Longer contexts than this are not served by default on a demo cluster (KV memory); gateway and engine share it.
MAX_SERVED_CONTEXT_TOKENS = 8192


def max_model_len(path: Path) -> int:
    """Prompt + output tokens a served model takes: what gateway validation and the engine both use."""
    config = json.loads((Path(path) / "config.json").read_text())
    native = int(config.get("max_position_embeddings") or config.get("max_sequence_length") or 2048)
    return min(native, MAX_SERVED_CONTEXT_TOKENS)

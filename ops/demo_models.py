"""Generating the demo checkpoints a fresh machine needs (nothing is downloaded): `janus up` and `janus profile`
write the ones the cluster config names before anything loads them. Here, above the services, because it drives
the worker's checkpoint writer (worker/engine/demo.py); where a model's files are is runtime/catalog.py."""
from __future__ import annotations

import logging
from pathlib import Path

from runtime.catalog import is_complete, model_dir
from runtime.settings import ClusterConfig

log = logging.getLogger("janus.catalog")


def ensure_demo_models(cluster: ClusterConfig, models_dir: Path) -> dict[str, Path]:
    """Write the demo checkpoints the config names and that are not on disk yet (nothing is downloaded)."""
    missing = [m.demo for m in cluster.models if m.demo and not is_complete(model_dir(m, models_dir))]
    if missing:
        from worker.engine.demo import make_demo_models  # imported only when something must be written

        log.info("writing demo checkpoints %s into %s", missing, models_dir)
        make_demo_models(Path(models_dir), missing)
    paths = {m.name: model_dir(m, models_dir) for m in cluster.models}
    for name, path in paths.items():
        if not is_complete(path):
            raise SystemExit(f"model {name}: no complete Hugging Face checkpoint at {path} "
                             "(config.json, tokenizer.json and *.safetensors are needed)")
    return paths

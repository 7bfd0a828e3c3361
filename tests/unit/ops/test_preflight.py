"""Config mistakes found when the cluster config is loaded, before any process starts (ops/preflight.py,
ops/effective.py): one line with the YAML path and the offending value, exit 2, no traceback. The checkpoints
here are real Hugging Face folders (config.json, tokenizer.json, a safetensors file written by `safetensors`),
small enough to write in milliseconds."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from ops.effective import ConfigError, load_cluster
from ops.preflight import check_checkpoints
from runtime.settings import ClusterConfig

REPO = Path(__file__).resolve().parents[3]
JANUS = Path(sys.executable).parent / "janus"
QWEN2_CONFIG = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1024, "hidden_act": "silu"}


def _checkpoint(folder: Path, *, num_params: int = 4096, **config) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({**QWEN2_CONFIG, **config}))
    (folder / "tokenizer.json").write_text("{}")
    save_file({"model.embed_tokens.weight": np.zeros((num_params,), dtype=np.float16)},
              str(folder / "model.safetensors"))
    return folder


def _config(tmp_path: Path, model_dir: Path, **workers) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(json.dumps({"models": [{"name": "mine", "path": str(model_dir)}], "workers": workers}))
    return path


def _janus(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    env = {k: v for k, v in os.environ.items() if k not in ("JANUS_CONFIG", "JANUS_STATE_DIR")}
    started = time.monotonic()
    result = subprocess.run([str(JANUS), *args], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    return result, time.monotonic() - started


def _one_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_gemma2_is_refused_by_janus_up_before_anything_starts(tmp_path):
    model = _checkpoint(tmp_path / "gemma", model_type="gemma2")
    state = tmp_path / "state"
    result, elapsed_s = _janus(tmp_path, "up", "--config", str(_config(tmp_path, model)), "--state-dir", str(state),
                               "--no-profile")
    line = _one_line(result)
    assert "models[0] (mine)" in line and "model_type 'gemma2' is not supported" in line, line
    assert not state.exists()  # no NATS, no logs, no demo models: nothing was started
    assert elapsed_s < 18.6  # what finding it in the worker's traceback took before (issue 28)


def test_janus_serve_worker_refuses_it_too(tmp_path):
    model = _checkpoint(tmp_path / "gemma", model_type="gemma2")
    result, _ = _janus(tmp_path, "serve", "worker", "--config", str(_config(tmp_path, model)),
                       "--nats", "nats://127.0.0.1:1")  # never dialled: refused first
    assert "model_type 'gemma2' is not supported" in _one_line(result)


def test_missing_files_are_named(tmp_path):
    model = _checkpoint(tmp_path / "m")
    (model / "tokenizer.json").unlink()
    cluster = load_cluster(_config(tmp_path, model))
    with pytest.raises(ConfigError, match=r"models\[0\] \(mine\): .* lacks tokenizer\.json$"):
        check_checkpoints(cluster, tmp_path)
    with pytest.raises(ConfigError, match=r"models\[0\] \(mine\): path '.*absent' is not a folder"):
        check_checkpoints(load_cluster(_config(tmp_path, tmp_path / "absent")), tmp_path)


def test_a_model_larger_than_the_page_pool_is_refused_with_the_numbers(tmp_path):
    model = _checkpoint(tmp_path / "big", num_params=3 << 20)  # 12 MiB as float32 on CPU: 6 pages of 2 MiB
    fits = load_cluster(_config(tmp_path, model, pool_bytes=16 << 20))
    check_checkpoints(fits, tmp_path)  # 6 weight pages + 1 KV page of 8
    too_small = load_cluster(_config(tmp_path, model, pool_bytes=12 << 20))
    with pytest.raises(ConfigError, match=r"needs at least 7 pages of 2097152 bytes \(3145728 parameters, 12\.0 MiB "
                                          r"on cpu, plus one KV page\) but workers\.pool_bytes: 12582912 holds 6"):
        check_checkpoints(too_small, tmp_path)
    on_gpu = load_cluster(_config(tmp_path, model, pool_bytes=12 << 20, device="cuda"))
    check_checkpoints(on_gpu, tmp_path)  # bfloat16: half the bytes, 3 + 1 pages


def test_a_kv_block_larger_than_a_page_is_refused(tmp_path):
    model = _checkpoint(tmp_path / "deep", num_hidden_layers=64, num_attention_heads=8, num_key_value_heads=8,
                        head_dim=128)
    with pytest.raises(ConfigError, match=r"a KV block \(16 tokens, 8388608 bytes\) does not fit "
                                          r"workers\.page_size_bytes: 2097152"):
        check_checkpoints(load_cluster(_config(tmp_path, model)), tmp_path)


def test_demo_models_not_written_yet_are_left_to_janus_up(tmp_path):
    check_checkpoints(ClusterConfig(), tmp_path / "models")  # the default demo cluster on a fresh machine


def test_a_typo_a_wrong_type_and_bad_yaml_name_the_path_and_the_value(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("workers: {cont: 3}\n")
    result, _ = _janus(tmp_path, "up", "--config", str(path), "--state-dir", str(tmp_path / "s"))
    assert _one_line(result) == (f"janus up: {path}: workers.cont: Extra inputs are not permitted "
                                 "(did you mean 'count'?)")
    path.write_text("workers: {count: many}\n")
    result, _ = _janus(tmp_path, "serve", "dispatcher", "--config", str(path))
    line = _one_line(result)
    assert line.startswith(f"janus serve: {path}: workers.count: Input should be a valid integer")
    assert line.endswith("(got 'many')")
    path.write_text("workers:\n  count: [1\n")
    result, _ = _janus(tmp_path, "config", "--config", str(path))
    assert "invalid YAML at line 3, column 1" in _one_line(result)
    assert not (tmp_path / "s").exists()

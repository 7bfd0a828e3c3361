"""Weights as views of one flat buffer: checksums, canary verification, rebinding, sharded checkpoints."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from contracts.requests import SamplingParams
from worker.engine import LLMEngine
from worker.engine.weights import bytes_checksum, segment_checksums


def _greedy_tokens(engine, prompt, n=8):
    engine.add_request(f"g{len(prompt)}-{n}-{id(prompt)}", prompt, SamplingParams(max_tokens=n, temperature=0,
                                                                                    ignore_eos=True))
    tokens = []
    while engine.has_unfinished():
        tokens += [t for o in engine.step() for t in o.token_ids]
    return tokens


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return LLMEngine(tiny_model_dir)


def test_checksum_sees_every_byte_and_its_position():
    data = torch.randint(0, 256, (1 << 16,), dtype=torch.uint8)
    base = bytes_checksum(data)
    assert bytes_checksum(data.clone()) == base
    for index in (0, 1, 777, data.numel() - 1):
        changed = data.clone()
        changed[index] ^= 0x10
        assert bytes_checksum(changed) != base
    swapped = data.clone()
    swapped[0:2], swapped[2:4] = data[2:4].clone(), data[0:2].clone()
    if not torch.equal(data[0:2], data[2:4]):
        assert bytes_checksum(swapped) != base  # the weighted sum sees word order
    assert segment_checksums(data, [1 << 15, 1 << 15]) == [bytes_checksum(data[: 1 << 15]),
                                                          bytes_checksum(data[1 << 15 :])]
    with pytest.raises(ValueError):
        segment_checksums(data, [1 << 17])


def test_replicas_have_identical_weight_buffers(tiny_model_dir, engine):
    other = LLMEngine(tiny_model_dir)
    assert engine.weight_checksums() == other.weight_checksums()
    assert len(engine.weight_checksums()) == 1  # the plain pool gives one contiguous segment
    assert engine.reference_canary.matches(other.reference_canary)  # bitwise only on identical kernels


def test_corruption_is_caught_and_a_rebind_restores(tiny_model_dir):
    eng = LLMEngine(tiny_model_dir)
    prompt = [5, 9, 200, 31, 7]
    before = _greedy_tokens(eng, prompt)
    good_sums = eng.weight_checksums()
    backup = eng.weight_buffer.clone()
    assert eng.verify_weights()
    qkv = eng.model.weights.layers[1].qkv_t
    qkv.mul_(-1.0)  # a wrong page restored
    assert not eng.verify_weights()
    assert eng.weight_checksums() != good_sums
    eng.bind_weights(backup)  # e.g. a region the lifecycle layer refilled
    assert eng.weight_buffer is backup
    assert eng.model.weights.layers[1].qkv_t.data_ptr() >= backup.data_ptr()
    assert eng.verify_weights() and eng.weight_checksums() == good_sums
    assert _greedy_tokens(eng, prompt) == before


def test_sharded_checkpoint_loads_the_same(tiny_model_dir, tmp_path, engine):
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(tiny_model_dir / "model.safetensors"))
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2 :]}
    for fname in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(tiny_model_dir / fname, tmp_path / fname)
    weight_map = {}
    for fname, keys in halves.items():
        save_file({k: tensors[k] for k in keys}, str(tmp_path / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in keys})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    sharded = LLMEngine(tmp_path)
    assert sharded.weight_checksums() == engine.weight_checksums()


def test_missing_or_misshapen_tensors_are_clear_errors(tiny_model_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(tiny_model_dir / "model.safetensors"))
    for fname in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(tiny_model_dir / fname, tmp_path / fname)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="lacks 1 tensors"):
        LLMEngine(tmp_path)


def test_an_engine_built_without_weights_reads_no_checkpoint_and_is_filled_later(tiny_model_dir, engine, tmp_path):
    folder = tmp_path / "no-weights"
    shutil.copytree(tiny_model_dir, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    with pytest.raises(FileNotFoundError):
        LLMEngine(folder)  # the checkpoint really is missing
    bare = LLMEngine(folder, load_weights=False)
    assert bare.reference_canary is None
    with pytest.raises(ValueError, match="no reference canary"):
        bare.verify_weights()
    bare.weight_buffer.copy_(engine.weight_buffer)  # what a fork's pull or a host copy does
    assert bare.record_reference_canary().matches(engine.reference_canary)
    assert bare.verify_weights() and bare.weight_checksums() == engine.weight_checksums()
    assert _greedy_tokens(bare, [5, 9, 200, 31, 7]) == _greedy_tokens(engine, [5, 9, 200, 31, 7])
    given = LLMEngine(folder, load_weights=False, reference_canary=engine.reference_canary)
    given.weight_buffer.zero_()
    assert not given.verify_weights()  # zeroed weights do not reproduce the source's canary
    given.weight_buffer.fill_(0xFF)  # NaN in every float32: not a model
    with pytest.raises(ValueError, match="not finite"):
        given.record_reference_canary()

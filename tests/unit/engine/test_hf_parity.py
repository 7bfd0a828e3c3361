"""Correctness against a peer: transformers' Qwen2ForCausalLM on the same random checkpoint.

Every sampled step's logits (kept by EngineConfig.keep_logits) are compared with the logits Hugging Face computes
for the same position in one full forward over the final sequence: max abs error <= 1e-4 in float32. Small blocks
and small pages put a request's KV on many blocks across several pages, including a page size that blocks do not
divide.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from contracts.requests import SamplingParams

TOLERANCE = 1e-4

pytestmark = pytest.mark.slow  # importing transformers alone takes seconds on a shared CI core


@pytest.fixture(scope="module")
def tied_model_dir(demo_root):
    """A tied-embedding variant of the tiny model (the Qwen2-0.5B head is tied)."""
    from worker.engine.demo import DEMO_MODELS, write_demo_model

    folder = demo_root / "tiny-tied"
    if not (folder / "config.json").exists():
        folder.mkdir(exist_ok=True)
        write_demo_model(folder, dataclasses.replace(DEMO_MODELS["demo-tiny"], tie_word_embeddings=True, seed=11))
    return folder


def _hf_model(model_dir):
    from transformers import Qwen2ForCausalLM

    model = Qwen2ForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    return model


@pytest.fixture(scope="module")
def hf_tiny(tiny_model_dir):
    return _hf_model(tiny_model_dir)


def _engine(model_dir, **overrides):
    from worker.engine import EngineConfig, LLMEngine

    config = EngineConfig(keep_logits=True, **overrides)
    return LLMEngine(model_dir, config=config)


def _run_collecting_logits(engine, requests, *, arrivals=None):
    """Run greedy requests to completion; `arrivals` maps a step number to requests added then. Returns
    {rid: (prompt, output tokens, [logits per sampled step])}."""
    arrivals = dict(arrivals or {})
    results = {}

    def add(rid, prompt, max_tokens):
        engine.add_request(rid, prompt, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
        results[rid] = (prompt, [], [])

    for rid, prompt, max_tokens in requests:
        add(rid, prompt, max_tokens)
    step = 0
    while engine.has_unfinished() or arrivals:
        for rid, prompt, max_tokens in arrivals.pop(step, []):
            add(rid, prompt, max_tokens)
        for out in engine.step():
            results[out.request_id][1].extend(out.token_ids)
            results[out.request_id][2].append(engine.last_logits[out.request_id].clone())
        step += 1
    return results


@torch.inference_mode()
def _check_against_hf(hf, results):
    for rid, (prompt, output, step_logits) in results.items():
        full = torch.tensor([prompt + output])
        hf_logits = hf(full).logits[0]
        assert len(step_logits) == len(output)
        for i, ours in enumerate(step_logits):
            theirs = hf_logits[len(prompt) - 1 + i]
            err = (ours - theirs).abs().max().item()
            assert err <= TOLERANCE, f"{rid} step {i}: max abs logit error {err:.2e}"
            assert int(theirs.argmax()) == output[i], f"{rid} step {i}: greedy token differs from HF"


def _prompt(length, salt):
    return [(salt * 131 + i * 37) % 1000 + 3 for i in range(length)]


def test_single_prompt_many_paged_decode_steps(tiny_model_dir, hf_tiny):
    # 4-token blocks, 8 KiB pages of 4 blocks: 60 decode steps cross ~17 blocks on ~5 pages.
    engine = _engine(tiny_model_dir, block_size=4, page_size_bytes=8 << 10, kv_cache_bytes=1 << 20)
    results = _run_collecting_logits(engine, [("one", _prompt(9, 1), 60)])
    _check_against_hf(hf_tiny, results)


def test_mixed_length_batch_with_requests_joining_midway(tiny_model_dir, hf_tiny):
    # 9 KiB pages hold 4 blocks of 2 KiB and leave a 1 KiB tail unused: blocks must not straddle pages.
    engine = _engine(tiny_model_dir, block_size=4, page_size_bytes=9 << 10, kv_cache_bytes=1 << 20)
    requests = [("a", _prompt(3, 2), 20), ("b", _prompt(17, 3), 12), ("c", _prompt(1, 4), 16)]
    arrivals = {4: [("d", _prompt(26, 5), 10)], 7: [("e", _prompt(5, 6), 14), ("f", _prompt(40, 7), 5)]}
    results = _run_collecting_logits(engine, requests, arrivals=arrivals)
    assert set(results) == {"a", "b", "c", "d", "e", "f"}
    _check_against_hf(hf_tiny, results)


def test_equal_length_prompts_prefilled_in_one_batched_call(tiny_model_dir, hf_tiny):
    engine = _engine(tiny_model_dir, block_size=4)
    requests = [(f"same{i}", _prompt(12, 40 + i), 6) for i in range(3)] + [("odd", _prompt(5, 50), 6)]
    results = _run_collecting_logits(engine, requests)
    _check_against_hf(hf_tiny, results)


def test_chunked_prefill_under_a_small_token_budget(tiny_model_dir, hf_tiny):
    # A 7-token budget splits the 45- and 30-token prompts into many chunks that continue from cached KV,
    # while the other requests decode in the same steps.
    engine = _engine(tiny_model_dir, block_size=8, max_num_batched_tokens=7)
    requests = [("long", _prompt(45, 8), 8), ("short", _prompt(4, 9), 12), ("mid", _prompt(30, 10), 6)]
    results = _run_collecting_logits(engine, requests)
    _check_against_hf(hf_tiny, results)


def test_tied_embeddings(tied_model_dir):
    hf = _hf_model(tied_model_dir)
    engine = _engine(tied_model_dir, block_size=4)
    results = _run_collecting_logits(engine, [("t1", _prompt(11, 12), 10), ("t2", _prompt(6, 13), 10)])
    _check_against_hf(hf, results)


def test_greedy_equals_hf_generate(tiny_model_dir, hf_tiny):
    prompts = [_prompt(n, 20 + n) for n in (5, 13, 22)]
    engine = _engine(tiny_model_dir, block_size=4)
    results = _run_collecting_logits(engine, [(f"g{i}", p, 24) for i, p in enumerate(prompts)])
    for i, prompt in enumerate(prompts):
        with torch.inference_mode():
            generated = hf_tiny.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False,
                                         eos_token_id=None, pad_token_id=0)
        assert results[f"g{i}"][1] == generated[0, len(prompt):].tolist()


def _llama_variant(tiny_model_dir, folder, *, rope_scaling, with_biases):
    """The tiny checkpoint as a Llama: no Qwen2 q/k/v biases unless `attention_bias` (then o_proj too), optional
    MLP biases, and a RoPE scaling."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    folder.mkdir(exist_ok=True)
    for fname in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(tiny_model_dir / fname, folder / fname)
    config = json.loads((tiny_model_dir / "config.json").read_text())
    config.update(model_type="llama", architectures=["LlamaForCausalLM"], attention_bias=with_biases,
                  mlp_bias=with_biases, rope_scaling=rope_scaling, max_position_embeddings=512)
    (folder / "config.json").write_text(json.dumps(config))
    tensors = load_file(str(tiny_model_dir / "model.safetensors"))
    g = torch.Generator().manual_seed(5)
    if not with_biases:
        tensors = {k: v for k, v in tensors.items() if not k.endswith("bias")}
    else:
        for i in range(config["num_hidden_layers"]):
            p = f"model.layers.{i}."
            h, inter = config["hidden_size"], config["intermediate_size"]
            for name, size in (("self_attn.o_proj", h), ("mlp.gate_proj", inter), ("mlp.up_proj", inter),
                               ("mlp.down_proj", h)):
                tensors[p + name + ".bias"] = 0.1 * torch.randn(size, generator=g)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


@pytest.mark.parametrize("rope_scaling, with_biases", [
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 32}, False),
    ({"rope_type": "linear", "factor": 2.0}, True),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}, False),
])
def test_llama_family_with_rope_scaling(tiny_model_dir, tmp_path, rope_scaling, with_biases):
    from transformers import LlamaForCausalLM

    folder = _llama_variant(tiny_model_dir, tmp_path / "llama", rope_scaling=rope_scaling, with_biases=with_biases)
    hf = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    engine = _engine(folder, block_size=4, max_num_batched_tokens=9)
    results = _run_collecting_logits(engine, [("l1", _prompt(40, 30), 12), ("l2", _prompt(7, 31), 20)])
    _check_against_hf(hf, results)

"""The GPU path: CUDA graphs for decode, one CUDA stream per engine, bfloat16. Skipped without CUDA, except the
padding logic the graphs rely on, which runs on CPU too."""
from __future__ import annotations

import threading

import pytest
import torch

from contracts.requests import SamplingParams
from worker.engine import EngineConfig, LLMEngine

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")


def _greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)


def _run(engine) -> dict[str, list[int]]:
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.token_ids)
    return tokens


def _prompts():
    return {f"r{i}": [(i * 53 + j * 29) % 1000 + 3 for j in range(5 + 7 * i)] for i in range(5)}


@torch.inference_mode()
def test_padding_a_decode_batch_to_a_graph_bucket_changes_nothing(tiny_model_dir):
    """What a CUDA graph replays: the decode batch padded with null-block rows to a bucket's shape."""
    engine = LLMEngine(tiny_model_dir, config=EngineConfig(block_size=4))
    for rid, prompt in _prompts().items():
        engine.add_request(rid, prompt, _greedy(8))
    engine.step()  # prefills
    batch = engine.scheduler.schedule()  # a decode step: allocates the blocks it needs
    seqs, ones = batch.seqs, batch.num_new_tokens
    assert ones == [1] * 5
    runner = engine.runner
    exact = runner.prepare(seqs, ones)
    padded = runner.prepare(seqs, ones, pad_to=(8, 16))
    assert padded.input_ids.shape == (8,) and padded.attention.decode_units.shape[1] == 8 * 16
    h_exact = engine.model.forward(exact.input_ids, exact.positions, exact.attention, engine.kv_cache)
    h_padded = engine.model.forward(padded.input_ids, padded.positions, padded.attention, engine.kv_cache)
    assert torch.isfinite(h_padded).all()
    assert torch.allclose(h_padded[: len(seqs)], h_exact, atol=1e-5)
    assert padded.sample_seq_indices == exact.sample_seq_indices


@needs_cuda
@pytest.mark.gpu
def test_cuda_float32_with_graphs_matches_hugging_face(tiny_model_dir):
    from transformers import Qwen2ForCausalLM

    hf = Qwen2ForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).cuda().eval()
    engine = LLMEngine(tiny_model_dir, device="cuda", dtype=torch.float32,
                       config=EngineConfig(keep_logits=True, max_num_seqs=8, max_model_len=256))
    assert engine.runner.graphs is not None
    prompts = _prompts()
    logits: dict[str, list[torch.Tensor]] = {rid: [] for rid in prompts}
    for rid, prompt in prompts.items():
        engine.add_request(rid, prompt, _greedy(24))
    tokens: dict[str, list[int]] = {rid: [] for rid in prompts}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id] += out.token_ids
            logits[out.request_id].append(engine.last_logits[out.request_id])
    with torch.inference_mode():
        for rid, prompt in prompts.items():
            ref = hf(torch.tensor([prompt + tokens[rid]], device="cuda")).logits[0].float().cpu()
            for i, ours in enumerate(logits[rid]):
                assert (ours - ref[len(prompt) - 1 + i]).abs().max().item() <= 1e-3


@needs_cuda
@pytest.mark.gpu
def test_cuda_graphs_and_eager_agree_in_bfloat16(tiny_model_dir):
    results = []
    for use_graphs in (False, True):
        engine = LLMEngine(tiny_model_dir, device="cuda", config=EngineConfig(use_cuda_graphs=use_graphs,
                                                                                max_num_seqs=8, max_model_len=256))
        assert engine.dtype == torch.bfloat16
        for rid, prompt in _prompts().items():
            engine.add_request(rid, prompt, _greedy(20))
        results.append(_run(engine))
    assert results[0] == results[1]


@needs_cuda
@pytest.mark.gpu
def test_engines_on_their_own_streams_step_concurrently(tiny_model_dir):
    config = EngineConfig(max_num_seqs=8, max_model_len=256)
    engines = [LLMEngine(tiny_model_dir, device="cuda", config=config) for _ in range(2)]
    assert engines[0]._stream != engines[1]._stream and engines[0]._stream != torch.cuda.default_stream()
    sequential = []
    for engine in engines:
        for rid, prompt in _prompts().items():
            engine.add_request(rid, prompt, _greedy(16))
        sequential.append(_run(engine))
    concurrent: list[dict] = [{}, {}]

    def drive(i):
        for rid, prompt in _prompts().items():
            engines[i].add_request(rid, prompt, _greedy(16))
        concurrent[i] = _run(engines[i])

    threads = [threading.Thread(target=drive, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert concurrent == sequential


@needs_cuda
@pytest.mark.gpu
def test_checksums_agree_between_host_and_device(tiny_model_dir):
    from worker.engine.weights import bytes_checksum

    engine = LLMEngine(tiny_model_dir, device="cuda")
    host_copy = engine.weight_buffer.cpu()
    assert bytes_checksum(host_copy) == bytes_checksum(engine.weight_buffer)
    assert engine.verify_weights()

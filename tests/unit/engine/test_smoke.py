"""Stage-1 smoke test: tokenizer, demo checkpoint, engine end to end on the tiny demo model."""
from __future__ import annotations

import subprocess
import sys

import pytest

from contracts.requests import SamplingParams


def test_package_import_does_not_import_torch():
    code = "import sys, worker.engine as e; e.TextTokenizer; e.make_demo_models; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_tokenizer_round_trips_and_renders_chat(tiny_model_dir):
    from worker.engine import TextTokenizer

    tok = TextTokenizer.from_dir(tiny_model_dir)
    text = "Hello, wörld! 日本語 😀 ünïcödé"
    assert tok.decode(tok.encode(text)) == text
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(chat)
    assert tok.token_to_id("<|im_start|>") in ids
    assert tok.token_to_id("<|im_end|>") in tok.eos_token_ids
    assert tok.vocab_size == 1024


def test_engine_generates_and_streams_consistent_text(tiny_model_dir):
    from worker.engine import LLMEngine

    engine = LLMEngine(tiny_model_dir)
    tok = engine.tokenizer
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Tell me a story"}]))
    engine.add_request("greedy", prompt, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    engine.add_request("sampled", prompt[:7], SamplingParams(max_tokens=9, temperature=0.9, seed=5,
                                                             ignore_eos=True, logprobs=True))
    outs: dict[str, list] = {}
    while engine.has_unfinished():
        for out in engine.step():
            outs.setdefault(out.request_id, []).append(out)
    for rid, max_tokens in (("greedy", 12), ("sampled", 9)):
        stream = outs[rid]
        tokens = [t for o in stream for t in o.token_ids]
        assert len(tokens) == max_tokens
        assert [o.is_finished for o in stream] == [False] * (max_tokens - 1) + [True]
        assert stream[-1].finish_reason == "length" and stream[-1].num_output_tokens == max_tokens
        assert "".join(o.text for o in stream) == tok.decode(tokens)
    assert all(o.logprobs is not None and o.logprobs[0] <= 0.0 for o in outs["sampled"])
    assert all(o.logprobs is None for o in outs["greedy"])
    stats = engine.stats()
    assert stats.num_running == 0 and stats.num_waiting == 0 and stats.num_kv_blocks_used == 0
    assert stats.ttft_ms_p50 is not None and stats.decode_tokens_per_s > 0


def test_greedy_is_deterministic_and_prompt_validation(tiny_model_dir):
    from worker.engine import LLMEngine

    engine = LLMEngine(tiny_model_dir)

    def run(rid):
        engine.add_request(rid, [5, 6, 7, 8], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
        tokens = []
        while engine.has_unfinished():
            tokens += [t for o in engine.step() for t in o.token_ids]
        return tokens

    assert run("a") == run("b")
    with pytest.raises(ValueError):
        engine.add_request("empty", [], SamplingParams(max_tokens=1))
    with pytest.raises(ValueError):
        engine.add_request("oov", [10**6], SamplingParams(max_tokens=1))
    with pytest.raises(ValueError):
        engine.add_request("long", [1] * engine.max_model_len, SamplingParams(max_tokens=1))

"""Engine behaviour on the tiny demo model: preemption by recompute, stop strings and stop tokens, sampling,
abort, limits, thread safety."""
from __future__ import annotations

import threading

import pytest
import torch

from contracts.requests import SamplingParams
from worker.engine import EngineConfig, LLMEngine


def _greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, **kw)


def _run(engine: LLMEngine) -> dict[str, list]:
    outs: dict[str, list] = {}
    while engine.has_unfinished():
        for out in engine.step():
            outs.setdefault(out.request_id, []).append(out)
    return outs


def _tokens(stream) -> list[int]:
    return [t for o in stream for t in o.token_ids]


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return LLMEngine(tiny_model_dir, config=EngineConfig(keep_logits=True))


def _prompt(n, salt):
    return [(salt * 97 + i * 31) % 1000 + 3 for i in range(n)]


def test_preemption_by_recompute_under_block_pressure_keeps_outputs_exact(tiny_model_dir, engine):
    # 6 pages of 4 blocks of 4 tokens (one block is the padding block): 92 tokens of KV for 4 x 40 tokens.
    small = LLMEngine(tiny_model_dir, config=EngineConfig(block_size=4, page_size_bytes=8 << 10,
                                                          kv_cache_bytes=48 << 10))
    prompts = {f"p{i}": _prompt(10, i) for i in range(4)}
    for rid, prompt in prompts.items():
        small.add_request(rid, prompt, _greedy(30))
    outs = _run(small)
    assert small.num_preemptions > 0
    assert small.stats().num_kv_blocks_used == 0  # everything given back
    for rid, prompt in prompts.items():
        engine.add_request(rid, prompt, _greedy(30))
        alone = _run(engine)[rid]
        assert _tokens(outs[rid]) == _tokens(alone)
        assert "".join(o.text for o in outs[rid]) == "".join(o.text for o in alone)
        assert outs[rid][-1].finish_reason == "length" and outs[rid][-1].num_output_tokens == 30


def test_stop_string_ends_the_request_and_never_reaches_the_stream(engine):
    prompt = _prompt(7, 11)
    engine.add_request("free", prompt, _greedy(40))
    free_text = "".join(o.text for o in _run(engine)["free"])
    stop = free_text[12:15]
    cut = free_text.find(stop)
    engine.add_request("stopped", prompt, _greedy(40, stop=(stop,)))
    stream = _run(engine)["stopped"]
    text = "".join(o.text for o in stream)
    assert text == free_text[:cut]
    assert stream[-1].finish_reason == "stop" and stream[-1].is_finished
    assert len(_tokens(stream)) < 40


def test_stop_token_id_is_reported_but_adds_no_text(engine):
    prompt = _prompt(5, 12)
    engine.add_request("free", prompt, _greedy(20))
    free = _run(engine)["free"]
    free_tokens = _tokens(free)
    stop_token = free_tokens[4]
    first = free_tokens.index(stop_token)
    engine.add_request("stopped", prompt, _greedy(20, stop_token_ids=(stop_token,)))
    stream = _run(engine)["stopped"]
    assert _tokens(stream) == free_tokens[: first + 1]
    assert stream[-1].finish_reason == "stop" and stream[-1].text == ""
    assert "".join(o.text for o in stream) == engine.tokenizer.decode(free_tokens[:first])


def test_eos_stops_unless_ignored(tiny_model_dir):
    # Make the greedy continuation's 3rd token an "EOS" by naming it in generation_config-independent
    # stop_token_ids, and check ignore_eos only concerns the model's own EOS ids.
    eng = LLMEngine(tiny_model_dir)
    eos = sorted(eng.tokenizer.eos_token_ids)
    assert eos == sorted({eng.tokenizer.token_to_id("<|im_end|>"), eng.tokenizer.token_to_id("<|endoftext|>")})
    assert eng._is_stop_token(eos[0], SamplingParams(max_tokens=5))
    assert not eng._is_stop_token(eos[0], SamplingParams(max_tokens=5, ignore_eos=True))


def test_seeded_sampling_does_not_depend_on_the_batch(engine):
    params = SamplingParams(max_tokens=16, temperature=1.0, seed=1234, ignore_eos=True)
    engine.add_request("alone", _prompt(6, 13), params)
    alone = _tokens(_run(engine)["alone"])
    engine.add_request("other1", _prompt(9, 14), SamplingParams(max_tokens=20, temperature=0.7, ignore_eos=True))
    engine.add_request("with-others", _prompt(6, 13), params)
    engine.add_request("other2", _prompt(3, 15), SamplingParams(max_tokens=5, temperature=1.3, seed=9))
    batched = _tokens(_run(engine)["with-others"])
    assert batched == alone
    engine.add_request("other-seed", _prompt(6, 13), params.model_copy(update={"seed": 4321}))
    assert _tokens(_run(engine)["other-seed"]) != alone


def test_top_k_one_and_tiny_top_p_are_greedy(engine):
    prompt = _prompt(8, 16)
    engine.add_request("greedy", prompt, _greedy(12))
    greedy = _tokens(_run(engine)["greedy"])
    engine.add_request("k1", prompt, SamplingParams(max_tokens=12, temperature=1.5, top_k=1, ignore_eos=True))
    engine.add_request("p0", prompt, SamplingParams(max_tokens=12, temperature=1.5, top_p=1e-6, ignore_eos=True))
    outs = _run(engine)
    assert _tokens(outs["k1"]) == greedy and _tokens(outs["p0"]) == greedy


def test_sampled_tokens_respect_top_k_and_top_p_and_report_true_logprobs(engine):
    prompt = _prompt(8, 17)
    checks = {"topk": SamplingParams(max_tokens=24, temperature=1.8, top_k=5, seed=3, ignore_eos=True,
                                     logprobs=True),
              "topp": SamplingParams(max_tokens=24, temperature=1.8, top_p=0.6, seed=4, ignore_eos=True,
                                     logprobs=True)}
    for rid, params in checks.items():
        engine.add_request(rid, prompt, params)
        num_distinct = set()
        while engine.has_unfinished():
            for out in engine.step():
                logits = engine.last_logits[rid]
                token = out.token_ids[0]
                num_distinct.add(token)
                assert out.logprobs[0] == pytest.approx(torch.log_softmax(logits, -1)[token].item(), abs=1e-5)
                if rid == "topk":
                    assert token in logits.topk(5).indices.tolist()
                else:
                    probs = torch.softmax(logits / 1.8, -1)
                    order = probs.argsort(descending=True)
                    mass_before = probs[order].cumsum(0) - probs[order]
                    nucleus = order[mass_before <= 0.6].tolist()
                    assert token in nucleus
        assert len(num_distinct) > 1  # really sampled


def test_abort_running_and_waiting_requests(tiny_model_dir):
    eng = LLMEngine(tiny_model_dir, config=EngineConfig(max_num_seqs=1))
    eng.add_request("running", _prompt(5, 18), _greedy(50))
    eng.add_request("waiting", _prompt(5, 19), _greedy(50))
    eng.step()
    eng.step()
    assert eng.stats().num_running == 1 and eng.stats().num_waiting == 1
    assert eng.stats().num_kv_blocks_used > 0
    eng.abort("running")
    eng.abort("waiting")
    eng.abort("unknown")
    outs = eng.step()
    assert {(o.request_id, o.finish_reason) for o in outs} == {("running", "abort"), ("waiting", "abort")}
    assert all(o.is_finished and o.token_ids == () for o in outs)
    assert not eng.has_unfinished() and eng.stats().num_kv_blocks_used == 0
    eng.add_request("running", _prompt(5, 18), _greedy(2))  # the id is free again
    assert len(_run(eng)["running"]) == 2


def test_max_model_len_caps_generation(tiny_model_dir):
    eng = LLMEngine(tiny_model_dir, config=EngineConfig(max_model_len=20))
    eng.add_request("capped", _prompt(15, 20), _greedy(100))
    stream = _run(eng)["capped"]
    assert len(_tokens(stream)) == 5 and stream[-1].finish_reason == "length"
    with pytest.raises(ValueError):
        eng.add_request("dup", _prompt(3, 1), _greedy(2)) or eng.add_request("dup", _prompt(3, 1), _greedy(2))


def test_requests_added_from_another_thread_while_stepping(tiny_model_dir):
    eng = LLMEngine(tiny_model_dir)
    num_requests = 12
    done = threading.Event()

    def producer():
        for i in range(num_requests):
            eng.add_request(f"t{i}", _prompt(4 + i, 30 + i), _greedy(6))
        done.set()

    thread = threading.Thread(target=producer)
    thread.start()
    finished: dict[str, int] = {}
    while not done.is_set() or eng.has_unfinished():
        for out in eng.step():
            if out.is_finished:
                finished[out.request_id] = out.num_output_tokens
    thread.join()
    assert finished == {f"t{i}": 6 for i in range(num_requests)}


class _GarbagePageSource:
    """A KV page source whose memory starts as NaN bit patterns, as recycled device pages can."""

    def __init__(self, num_pages: int, page_size_bytes: int) -> None:
        from worker.engine import PlainKVPageSource

        self._inner = PlainKVPageSource(num_pages, page_size_bytes)
        self.page_size_bytes = page_size_bytes

    def reserve_kv(self, owner, max_num_pages, device):
        raw = self._inner.reserve_kv(owner, max_num_pages, device)
        raw.view(torch.float32).fill_(float("nan"))
        return raw

    def acquire_kv_pages(self, owner, num_pages):
        return self._inner.acquire_kv_pages(owner, num_pages)

    def release_kv_pages(self, owner, page_indices):
        self._inner.release_kv_pages(owner, page_indices)

    def kv_page_global_offset(self, owner, page_index):
        return self._inner.kv_page_global_offset(owner, page_index)


def test_garbage_in_fresh_kv_pages_never_reaches_attention(tiny_model_dir, engine):
    from worker.engine.memory import KVPageSource

    source = _GarbagePageSource(8, 8 << 10)
    assert isinstance(source, KVPageSource)
    eng = LLMEngine(tiny_model_dir, kv_source=source,
                    config=EngineConfig(block_size=4, kv_cache_bytes=64 << 10))
    prompt = _prompt(9, 40)
    eng.add_request("g", prompt, _greedy(20))
    engine.add_request("g", prompt, _greedy(20))
    assert _tokens(_run(eng)["g"]) == _tokens(_run(engine)["g"])

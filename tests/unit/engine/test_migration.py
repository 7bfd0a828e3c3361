"""Moving a running decode between two engines of the same model (worker/engine/migration.py): the source detaches
it mid-stream, its KV blocks are written into the target's reservation, and the target continues. The joined stream
must equal one engine's, token for token and character for character, and a failed move must lose nothing."""
from __future__ import annotations

import pytest

from contracts.requests import SamplingParams
from worker.engine import EngineConfig, LLMEngine, PlainKVPageSource

from .pd_helpers import PROMPT
from .pd_helpers import greedy as _greedy
from .pd_helpers import run_to_end as _run


def _tokens(outs) -> list[int]:
    return [t for o in outs for t in o.token_ids]


def _text(outs) -> str:
    return "".join(o.text for o in outs)


@pytest.fixture(scope="module")
def engines(tiny_model_dir):
    source = PlainKVPageSource(num_pages_total=16, page_size_bytes=8 << 10)
    config = EngineConfig(block_size=4, kv_cache_bytes=64 << 10)
    return (LLMEngine(tiny_model_dir, config=config, kv_source=source, owner="from"),
            LLMEngine(tiny_model_dir, config=config, kv_source=source, owner="to"),
            LLMEngine(tiny_model_dir, config=config))


def _decode_until(engine, rid, num_outputs: int) -> list:
    """Step until the request has emitted `num_outputs` tokens; its outputs so far."""
    outs = []
    while len(_tokens(outs)) < num_outputs:
        step = [o for o in engine.step() if o.request_id == rid]
        assert not any(o.is_finished for o in step), "the request ended before the move"
        outs += step
    return outs


def _detach(engine, rid):
    future = engine.detach_decode(rid)
    outs = [o for o in engine.step() if o.request_id == rid]  # taken out before the step's forward pass
    detached = future.result(timeout=0)
    assert [(o.detached, o.token_ids, o.is_finished) for o in outs] == [(detached, (), False)]
    return detached


def _move(source, target, rid, params, num_before: int):
    """Decode `num_before` tokens on `source`, move the request to `target`, and run it there."""
    source.add_request(rid, PROMPT, params)
    before = _decode_until(source, rid, num_before)
    detached = _detach(source, rid)
    assert list(detached.output_token_ids) == _tokens(before)
    assert detached.num_kv_tokens == len(PROMPT) + num_before - 1
    blocks = target.reserve_kv_blocks(rid, detached.num_kv_tokens)
    target.write_kv_blocks(blocks, source.read_kv_blocks(detached.kv_block_ids))
    source.release_kv_blocks(rid)
    assert source.stats().num_kv_blocks_used == 0 and not source.has_unfinished()
    target.add_migrated_decode(rid, detached.prompt_token_ids, detached.output_token_ids, params, blocks)
    return before, _run(target)


@pytest.mark.parametrize("num_before", [1, 2, 7])
def test_a_moved_decode_continues_the_same_stream(engines, num_before):
    source, target, single = engines
    params = _greedy(16)
    single.add_request("ref", PROMPT, params)
    ref = _run(single)
    target.reserve_kv_blocks("other", 9)  # so the target's block ids differ from the source's
    before, after = _move(source, target, f"move-{num_before}", params, num_before)
    target.release_kv_blocks("other")
    assert _tokens(before) + _tokens(after) == _tokens(ref)
    assert _text(before) + _text(after) == _text(ref)
    assert after[-1].finish_reason == "length" and after[-1].num_output_tokens == 16  # max_tokens counts both sides
    assert target.stats().num_kv_blocks_used == 0


def test_seeded_sampling_continues_across_the_move(engines):
    source, target, single = engines
    params = SamplingParams(max_tokens=16, temperature=0.8, top_p=0.9, seed=123, ignore_eos=True)
    single.add_request("seeded-ref", PROMPT, params)
    ref = _run(single)
    before, after = _move(source, target, "seeded", params, 5)
    assert _tokens(before) + _tokens(after) == _tokens(ref)
    other = params.model_copy(update={"seed": 124})  # the draws are really random: another seed, another path
    single.add_request("seeded-other", PROMPT, other)
    assert _tokens(_run(single)) != _tokens(ref)


def test_a_stop_string_straddling_the_move_is_held_back_and_matched(engines):
    source, target, single = engines
    single.add_request("free", PROMPT, _greedy(16))
    free = _run(single)
    text3, text4 = _text(free[:3]), _text(free[:4])
    assert text3 and len(text4) > len(text3), "these tokens should decode to visible text for this prompt"
    # starts in the third token and runs past the fourth, the last one moved: the held-back tail spans two tokens,
    # so the target must rebuild it from all the tokens it inherits, not only the last
    stop = _text(free)[len(text3) - 1: len(text4) + 2]
    expected = _text(free)[: _text(free).find(stop)]
    before, after = _move(source, target, "straddle", _greedy(16, stop=(stop,)), 4)
    assert _text(before) == text3[:-1]
    assert _text(before) + _text(after) == expected
    assert after[-1].finish_reason == "stop"


def test_a_move_that_ends_at_once_emits_the_held_back_tail(engines):
    source, target, single = engines
    params = _greedy(4)
    single.add_request("ends-ref", PROMPT, params)
    ref = _run(single)
    source.add_request("ends", PROMPT, _greedy(8))
    before = _decode_until(source, "ends", 4)
    detached = _detach(source, "ends")
    blocks = target.reserve_kv_blocks("ends", detached.num_kv_tokens)
    target.write_kv_blocks(blocks, source.read_kv_blocks(detached.kv_block_ids))
    source.release_kv_blocks("ends")
    target.add_migrated_decode("ends", PROMPT, detached.output_token_ids, params, blocks)  # max_tokens reached
    after = target.step()
    assert [(o.token_ids, o.finish_reason, o.num_output_tokens) for o in after] == [((), "length", 4)]
    assert _tokens(before) == _tokens(ref) and _text(before) + _text(after) == _text(ref)
    assert target.stats().num_kv_blocks_used == 0


def test_a_failed_move_reattaches_and_the_stream_goes_on(engines):
    source, _, single = engines
    params = _greedy(12)
    single.add_request("back-ref", PROMPT, params)
    ref = _run(single)
    source.add_request("back", PROMPT, params)
    source.add_request("bystander", PROMPT[:9], _greedy(10))  # keeps decoding while "back" is held
    before = _decode_until(source, "back", 3)
    detached = _detach(source, "back")
    assert source.stats().num_held_prefills == 1
    held_steps = [o for o in source.step() if o.request_id == "back"]
    assert held_steps == []  # held: it does not decode
    source.reattach_decode("back")
    after = [o for o in _run(source) if o.request_id == "back"]
    assert list(detached.output_token_ids) == _tokens(before)
    assert _tokens(before) + _tokens(after) == _tokens(ref) and _text(before) + _text(after) == _text(ref)
    assert after[-1].num_output_tokens == 12 and source.stats().num_kv_blocks_used == 0


def test_what_cannot_move_is_refused_and_keeps_running(engines):
    source, target, _ = engines
    with pytest.raises(ValueError, match="not decoding"):
        _detach(source, "nobody")
    source.add_request("fresh", PROMPT, _greedy(4))
    future = source.detach_decode("fresh")  # queued behind its own add: it has not been prefilled
    source.step()
    with pytest.raises(ValueError, match="decode phase"):
        future.result(timeout=0)
    source.add_request("pair", PROMPT, SamplingParams(max_tokens=4, temperature=0.7, n=2))
    _decode_until(source, "pair", 2)
    with pytest.raises(ValueError, match="n > 1"):
        _detach(source, "pair")
    done = _run(source)
    assert {o.request_id for o in done if o.is_finished} == {"fresh", "pair"}
    assert source.stats().num_kv_blocks_used == 0
    blocks = target.reserve_kv_blocks("bad", 24)
    with pytest.raises(ValueError, match="at least one output"):
        target.add_migrated_decode("bad", PROMPT, [], _greedy(8), blocks)
    with pytest.raises(ValueError, match="cannot hold"):
        small = target.reserve_kv_blocks("small", 8)
        target.add_migrated_decode("small", PROMPT, [5, 6, 7], _greedy(8), small)
    with pytest.raises(ValueError, match="vocabulary"):
        target.add_migrated_decode("bad", PROMPT, [10 ** 9], _greedy(8), blocks)
    for rid in ("bad", "small"):
        target.release_kv_blocks(rid)
    assert target.stats().num_kv_blocks_used == 0

"""Prefill/decode disaggregation: a prefill-only engine hands its KV blocks and first token to a decode engine
that continues from blocks another instance wrote; the stream equals a colocated run."""
from __future__ import annotations

import ctypes

import pytest

from contracts.requests import SamplingParams
from worker.engine import EngineConfig, LLMEngine, PlainKVPageSource

from .pd_helpers import PROMPT
from .pd_helpers import greedy as _greedy
from .pd_helpers import run_to_end as _run


@pytest.fixture(scope="module")
def shared_source():
    # Both engines address KV in one (synthetic) global region, as two models on one device would.
    return PlainKVPageSource(num_pages_total=16, page_size_bytes=8 << 10)


@pytest.fixture(scope="module")
def engines(tiny_model_dir, shared_source):
    config = EngineConfig(block_size=4, kv_cache_bytes=64 << 10)
    prefill = LLMEngine(tiny_model_dir, config=config, kv_source=shared_source, owner="prefill")
    decode = LLMEngine(tiny_model_dir, config=config, kv_source=shared_source, owner="decode")
    colocated = LLMEngine(tiny_model_dir, config=config)
    return prefill, decode, colocated


def _prefill(prefill, rid, params):
    prefill.add_prefill_request(rid, PROMPT, params)
    outs = _run(prefill)
    assert len(outs) == 1
    return outs[0]


def _hand_over(prefill, decode, rid, params, *, by_address: bool):
    decode_blocks = decode.reserve_kv_blocks(rid, len(PROMPT))
    done = _prefill(prefill, rid, params)
    assert done.is_prefill_done and not done.is_finished and done.finish_reason is None
    assert len(done.kv_block_ids) == len(decode_blocks) == 6  # 21 tokens in 4-token blocks
    assert prefill.stats().num_held_prefills == 1 and not prefill.has_unfinished()
    assert prefill.kv_block_num_bytes == decode.kv_block_num_bytes
    if by_address:  # what a transfer engine does: bytes from local addresses to the peer's blocks
        for src, dst in zip(prefill.kv_block_data_ptrs(done.kv_block_ids), decode.kv_block_data_ptrs(decode_blocks)):
            ctypes.memmove(dst, src, prefill.kv_block_num_bytes)
    else:
        decode.write_kv_blocks(decode_blocks, prefill.read_kv_blocks(done.kv_block_ids))
    prefill.release_kv_blocks(rid)
    assert prefill.stats().num_held_prefills == 0 and prefill.stats().num_kv_blocks_used == 0
    decode.add_decode_request(rid, PROMPT, done.token_ids[0], params, decode_blocks)
    return done, _run(decode)


@pytest.mark.parametrize("by_address", [False, True])
def test_decode_continues_from_blocks_written_elsewhere(engines, by_address):
    prefill, decode, colocated = engines
    params = _greedy(16)
    colocated.add_request("ref", PROMPT, params)
    ref = _run(colocated)
    decode.reserve_kv_blocks("other", 9)  # so the decode side's block ids differ from the prefill side's
    rid = f"pd-{by_address}"
    done, rest = _hand_over(prefill, decode, rid, params, by_address=by_address)
    decode.release_kv_blocks("other")
    tokens = list(done.token_ids) + [t for o in rest for t in o.token_ids]
    assert tokens == [t for o in ref for t in o.token_ids]
    assert done.text + "".join(o.text for o in rest) == "".join(o.text for o in ref)
    assert rest[-1].is_finished and rest[-1].finish_reason == "length" and rest[-1].num_output_tokens == 16
    assert decode.stats().num_kv_blocks_used == 0


def test_stop_string_straddling_the_hand_over(engines):
    prefill, decode, colocated = engines
    colocated.add_request("free", PROMPT, _greedy(16))
    free = _run(colocated)
    first_text = free[0].text
    assert first_text, "the first token should decode to visible text for this prompt"
    free_text = "".join(o.text for o in free)
    stop = free_text[len(first_text) - 1 : len(first_text) + 2]  # starts inside the first token's text
    expected = free_text[: free_text.find(stop)]
    colocated.add_request("ref", PROMPT, _greedy(16, stop=(stop,)))
    assert "".join(o.text for o in _run(colocated)) == expected
    done, rest = _hand_over(prefill, decode, "pd-stop", _greedy(16, stop=(stop,)), by_address=False)
    assert done.text == first_text[:-1]  # the tail that may start the stop string is held back
    assert done.text + "".join(o.text for o in rest) == expected
    assert rest[-1].finish_reason == "stop"


def test_prefill_that_already_finishes_frees_its_blocks(engines):
    prefill, _, _ = engines
    done = _prefill(prefill, "one-token", _greedy(1))
    assert done.is_finished and done.finish_reason == "length" and done.kv_block_ids is None
    assert prefill.stats().num_held_prefills == 0 and prefill.stats().num_kv_blocks_used == 0


def test_global_offsets_match_the_page_source(engines, shared_source):
    _, decode, _ = engines
    blocks = decode.reserve_kv_blocks("offsets", 30)
    offsets = decode.kv_block_global_offsets(blocks)
    ptrs = decode.kv_block_data_ptrs(blocks)
    kv = decode.kv_cache
    for block, offset in zip(blocks, offsets):
        page, slot = divmod(block, kv.blocks_per_page)
        assert offset == shared_source.kv_page_global_offset("decode", page) + slot * kv.block_num_bytes
    same_page = [(o, p) for b, o, p in zip(blocks, offsets, ptrs) if b // kv.blocks_per_page == blocks[0] // kv.blocks_per_page]
    assert all(o - same_page[0][0] == p - same_page[0][1] for o, p in same_page)
    decode.release_kv_blocks("offsets")


def test_misuse_is_refused(engines):
    prefill, decode, _ = engines
    blocks = decode.reserve_kv_blocks("misuse", 8)
    with pytest.raises(ValueError):
        decode.reserve_kv_blocks("misuse", 8)
    with pytest.raises(ValueError):
        decode.add_decode_request("misuse", PROMPT[:8], 5, _greedy(4), list(blocks)[::-1])
    with pytest.raises(ValueError):
        decode.add_decode_request("misuse", PROMPT, 5, _greedy(4), blocks)  # 21 tokens do not fit 2 blocks
    with pytest.raises(ValueError):
        prefill.read_kv_blocks([1, 2])  # no held prefill owns them
    decode.abort("misuse")  # an unused reservation is freed by abort too
    decode.step()
    assert decode.stats().num_kv_blocks_used == 0


def test_abort_of_a_held_prefill_frees_its_blocks(engines):
    prefill, _, _ = engines
    done = _prefill(prefill, "held", _greedy(8))
    assert done.is_prefill_done and prefill.stats().num_kv_blocks_used == len(done.kv_block_ids)
    prefill.abort("held")
    outs = prefill.step()
    assert [(o.request_id, o.finish_reason) for o in outs] == [("held", "abort")]
    assert prefill.stats().num_kv_blocks_used == 0


def _tokens(outs) -> list[int]:
    return [t for o in outs for t in o.token_ids]


@pytest.mark.parametrize("params", [
    SamplingParams(max_tokens=16, temperature=1.0, seed=7, ignore_eos=True),
    SamplingParams(max_tokens=16, temperature=0.8, top_p=0.9, top_k=50, seed=123, ignore_eos=True),
])
def test_seeded_sampling_continues_the_same_random_stream_across_the_hand_over(engines, params):
    prefill, decode, colocated = engines
    colocated.add_request("seeded-ref", PROMPT, params)
    colocated.add_request("seeded-noise", PROMPT[:9], SamplingParams(max_tokens=8, temperature=1.0))  # shares the batch
    ref = [o for o in _run(colocated) if o.request_id == "seeded-ref"]
    done, rest = _hand_over(prefill, decode, f"pd-seeded-{params.seed}", params, by_address=False)
    assert list(done.token_ids) + _tokens(rest) == _tokens(ref)
    # and the draws are really random: another seed takes another path
    other = params.model_copy(update={"seed": params.seed + 1})
    colocated.add_request("seeded-other", PROMPT, other)
    assert _tokens(_run(colocated)) != _tokens(ref)


def test_a_hand_over_that_ends_at_its_first_token_finishes_cleanly(engines):
    prefill, decode, _ = engines
    decode.add_request("bystander", PROMPT[:7], _greedy(6))  # the decode instance keeps serving it throughout
    outcomes = {}
    for rid, adjust in (("ends-length", lambda p, first: p.model_copy(update={"max_tokens": 1})),
                        ("ends-stop-token", lambda p, first: p.model_copy(update={"stop_token_ids": (first,)}))):
        blocks = decode.reserve_kv_blocks(rid, len(PROMPT))
        done = _prefill(prefill, rid, _greedy(8))
        decode.write_kv_blocks(blocks, prefill.read_kv_blocks(done.kv_block_ids))
        prefill.release_kv_blocks(rid)
        first = done.token_ids[0]
        decode.add_decode_request(rid, PROMPT, first, adjust(_greedy(8), first), blocks)
        outcomes[rid] = [o for o in decode.step() if o.request_id == rid]
    assert [(o.token_ids, o.is_finished, o.finish_reason, o.num_output_tokens) for o in outcomes["ends-length"]] \
        == [((), True, "length", 1)]
    assert [(o.is_finished, o.finish_reason) for o in outcomes["ends-stop-token"]] == [(True, "stop")]
    bystander = _run(decode)
    assert bystander[-1].request_id == "bystander" and bystander[-1].finish_reason == "length"
    assert decode.stats().num_kv_blocks_used == 0 and decode.stats().num_running == 0
    with pytest.raises(ValueError):  # the id is free again, and the reservation is gone with the request
        decode.add_decode_request("ends-length", PROMPT, 5, _greedy(4), blocks)


def test_the_held_back_tail_is_emitted_when_the_decode_side_ends_at_once(engines):
    prefill, decode, colocated = engines
    colocated.add_request("tail-free", PROMPT, _greedy(16))
    free = _run(colocated)
    first_text = free[0].text
    free_text = "".join(o.text for o in free)
    stop = free_text[len(first_text) - 1 : len(first_text) + 2]  # starts with the first token's last character
    colocated.add_request("tail-ref", PROMPT, _greedy(1, stop=(stop,)))
    assert "".join(o.text for o in _run(colocated)) == first_text
    blocks = decode.reserve_kv_blocks("tail", len(PROMPT))
    done = _prefill(prefill, "tail", _greedy(16, stop=(stop,)))
    assert done.text == first_text[:-1]
    decode.write_kv_blocks(blocks, prefill.read_kv_blocks(done.kv_block_ids))
    prefill.release_kv_blocks("tail")
    decode.add_decode_request("tail", PROMPT, done.token_ids[0], _greedy(1, stop=(stop,)), blocks)
    (end,) = _run(decode)
    assert end.finish_reason == "length" and done.text + end.text == first_text

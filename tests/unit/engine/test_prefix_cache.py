"""Automatic prefix caching: block keys chained on their prefix, reuse of cached blocks, LRU eviction, sharing with
forks, pages going back with their cached blocks; and in the engine, identical greedy outputs with fewer prefill
tokens on a multi-turn chat."""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.requests import SamplingParams
from worker.engine import EngineConfig, LLMEngine
from worker.engine.block_manager import BlockManager, hash_block_tokens

from .test_block_manager import PagePool


@dataclass(eq=False)
class Seq:
    token_ids: list[int]
    block_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    block_hashes: list[bytes] = field(default_factory=list)
    num_registered_blocks: int = 0


def _manager(pool: PagePool, *, max_pages=2, bpp=4, block_size=4, cached=1, enabled=True) -> BlockManager:
    return BlockManager(block_size=block_size, blocks_per_page=bpp, max_num_pages=max_pages,
                        acquire_pages=pool.acquire, release_pages=pool.release, num_free_pages_cached=cached,
                        enable_prefix_caching=enabled)


def _compute(bm: BlockManager, seq: Seq) -> Seq:
    """Admit `seq` as the scheduler does, 'compute' all its tokens and register its full blocks."""
    seq.num_computed_tokens = bm.take_cached_prefix(seq)
    assert bm.grow(seq, len(seq.token_ids))
    seq.num_computed_tokens = len(seq.token_ids)
    bm.cache_computed_blocks(seq)
    return seq


def test_a_block_key_depends_on_its_tokens_and_on_every_token_before_it():
    root = hash_block_tokens(b"", [1, 2, 3, 4])
    assert root == hash_block_tokens(b"", [1, 2, 3, 4])
    assert root != hash_block_tokens(b"", [1, 2, 3, 5])
    child = hash_block_tokens(root, [5, 6, 7, 8])
    assert child != hash_block_tokens(hash_block_tokens(b"", [9, 2, 3, 4]), [5, 6, 7, 8]), "same tokens, other prefix"
    bm = _manager(PagePool(4))
    seq = _compute(bm, Seq(list(range(1, 10))))  # 9 tokens: two full blocks and a partial one
    assert seq.block_hashes == [root, child] and seq.num_registered_blocks == 2


def test_a_released_prefix_is_taken_by_the_next_request_and_its_last_token_is_always_computed():
    bm = _manager(PagePool(4))
    first = _compute(bm, Seq(list(range(1, 10))))
    full_blocks = first.block_ids[:2]
    bm.release(first)
    assert bm.num_cached_blocks == 2 and bm.num_used_blocks == 0, "cached blocks count as free"
    follow_up = Seq(list(range(1, 9)) + [42, 43])
    assert bm.take_cached_prefix(follow_up) == 8 and follow_up.block_ids == full_blocks
    assert bm.num_cached_blocks == 0 and bm.num_holders(full_blocks[0]) == 1
    bm.release(follow_up)
    block_aligned = Seq(list(range(1, 9)))  # both its blocks are cached, but its last token must give logits
    assert bm.take_cached_prefix(block_aligned) == 4 and block_aligned.block_ids == full_blocks[:1]
    other = Seq([7] + list(range(2, 10)))
    assert bm.take_cached_prefix(other) == 0 and other.block_ids == [], "a different first block: no hit at all"


def test_the_least_recently_used_cached_block_is_evicted_first_and_only_when_no_free_block_is_left():
    pool = PagePool(1)
    bm = _manager(pool, max_pages=1, bpp=4)  # 4 blocks in all
    first = _compute(bm, Seq(list(range(1, 10))))  # blocks 0, 1 full (registered), 2 partial
    head, tail = first.block_ids[:2]
    bm.release(first)
    assert bm.allocate([], 4) == [2] and bm.allocate([], 4) == [3], "plain free blocks go first"
    assert bm.num_cached_blocks == 2
    assert bm.allocate([], 4) == [tail], "the tail of a prefix is evicted before its head"
    again = Seq(list(range(1, 10)))
    assert bm.take_cached_prefix(again) == 4 and again.block_ids == [head], "the evicted key is gone"
    assert bm.allocate([], 4) is None, "a held cached block is not evictable"


def test_shared_blocks_count_every_holder_forks_and_hits_alike():
    bm = _manager(PagePool(4))
    parent = _compute(bm, Seq(list(range(1, 11))))  # 2 full blocks + 2 tokens
    child = Seq(list(range(1, 11)))
    assert bm.fork(parent, child, 10, lambda src, dst: None)
    shared = parent.block_ids[:2]
    assert child.block_ids[:2] == shared and bm.num_holders(shared[0]) == 2
    newcomer = Seq(list(range(1, 9)) + [99, 98, 97])
    assert bm.take_cached_prefix(newcomer) == 8 and newcomer.block_ids == shared
    assert bm.num_holders(shared[0]) == 3 and bm.num_cached_blocks == 0
    for seq in (parent, newcomer):
        bm.release(seq)
    assert bm.num_holders(shared[1]) == 1 and bm.num_cached_blocks == 0, "the fork still holds them"
    bm.cache_computed_blocks(child)  # already registered: nothing changes
    bm.release(child)
    assert bm.num_cached_blocks == 2 and bm.num_used_blocks == 0
    with pytest.raises(ValueError):
        bm.free([shared[0]])  # a cached block is not allocated


def test_pages_that_empty_go_back_with_their_cached_blocks():
    pool = PagePool(4)
    bm = _manager(pool, max_pages=4, bpp=2, cached=0)
    seq = _compute(bm, Seq(list(range(1, 18))))  # 5 blocks over 3 pages
    assert pool.held == {0, 1, 2}
    bm.release(seq)
    assert pool.held == set() and bm.num_cached_blocks == 0, "memory comes back to the page source as before"
    again = Seq(list(range(1, 18)))
    assert bm.take_cached_prefix(again) == 0, "the keys left with the pages"


def test_pages_kept_by_the_page_cache_keep_their_cached_blocks():
    pool = PagePool(4)
    bm = _manager(pool, max_pages=4, bpp=4, cached=1)
    seq = _compute(bm, Seq(list(range(1, 18))))  # 5 blocks: page 0 full, one block on page 1
    bm.release(seq)
    assert pool.held == {0}, "the higher empty page went back, the lower one is the kept one"
    assert bm.take_cached_prefix(Seq(list(range(1, 18)))) == 16


def test_with_caching_off_nothing_is_kept_or_counted():
    bm = _manager(PagePool(4), enabled=False)
    seq = _compute(bm, Seq(list(range(1, 10))))
    bm.release(seq)
    again = Seq(list(range(1, 10)))
    assert bm.take_cached_prefix(again) == 0 and bm.num_cached_blocks == 0
    bm.record_prefix_query(9, 0)
    assert bm.num_prefix_cache_queries == 0


def test_dropping_the_cache_frees_cached_blocks_and_forgets_keys():
    bm = _manager(PagePool(4))
    bm.release(_compute(bm, Seq(list(range(1, 10)))))
    assert bm.num_cached_blocks == 2
    bm.drop_cached_blocks()
    assert bm.num_cached_blocks == 0 and bm.take_cached_prefix(Seq(list(range(1, 10)))) == 0


# ---- the engine ---------------------------------------------------------------------------------------------------
def _greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)


def _chat_replay(engine: LLMEngine, num_conversations: int, num_turns: int) -> dict[str, list[int]]:
    """Conversations whose every turn's prompt is the previous prompt, the reply and a new user message, token by
    token (as a chat client resending its history); the conversations' turns run concurrently."""
    tok = engine.tokenizer
    prompts = {c: tok.encode(tok.apply_chat_template([{"role": "system", "content": "You are a terse helper."},
                                                      {"role": "user", "content": f"Question {c}: what is {c}?"}]))
               for c in range(num_conversations)}
    replies: dict[str, list[int]] = {}
    for turn in range(num_turns):
        for c, prompt in prompts.items():
            engine.add_request(f"c{c}t{turn}", prompt, _greedy(12))
        outs: dict[str, list[int]] = {}
        while engine.has_unfinished():
            for out in engine.step():
                outs.setdefault(out.request_id, []).extend(out.token_ids)
        replies.update(outs)
        for c in prompts:
            follow_up = tok.encode(f"<|im_end|>\n<|im_start|>user\nAnd turn {turn} of {c}?<|im_end|>\n"
                                   "<|im_start|>assistant\n")
            prompts[c] = prompts[c] + outs[f"c{c}t{turn}"] + follow_up
    return replies


def test_multi_turn_chat_gives_identical_greedy_outputs_with_fewer_prefill_tokens(tiny_model_dir):
    cfg = dict(block_size=8, max_num_batched_tokens=64)  # chunked prefill with cached context, mixed batches
    cached = LLMEngine(tiny_model_dir, config=EngineConfig(**cfg))
    plain = LLMEngine(tiny_model_dir, config=EngineConfig(enable_prefix_caching=False, **cfg))
    with_cache = _chat_replay(cached, num_conversations=2, num_turns=4)
    without = _chat_replay(plain, num_conversations=2, num_turns=4)
    assert with_cache == without and len(with_cache) == 8
    assert cached.num_prefill_tokens_computed < 0.6 * plain.num_prefill_tokens_computed
    stats, plain_stats = cached.stats(), plain.stats()
    assert stats.prefix_cache_queries > stats.prefix_cache_hits > 0
    # every token not found cached was computed: queries - hits = prefill tokens (no preemption here)
    assert stats.prefix_cache_queries - stats.prefix_cache_hits == cached.num_prefill_tokens_computed
    assert plain_stats.prefix_cache_queries == plain_stats.prefix_cache_hits == 0
    assert stats.num_kv_blocks_used == 0 and stats.num_kv_blocks_cached > 0
    assert cached.verify_weights() and cached.stats().num_kv_blocks_cached == 0, "verified after a wake: cache gone"


def test_a_cached_prefix_survives_preemption_pressure_with_identical_outputs(tiny_model_dir):
    # 92 tokens of KV (block_size 4) for 4 requests of a shared 24-token prefix growing to 40 tokens: preemption,
    # eviction and reuse of cached blocks all happen.
    small = dict(block_size=4, page_size_bytes=8 << 10, kv_cache_bytes=48 << 10)
    prefix = [(i * 37) % 900 + 5 for i in range(24)]
    prompts = {f"p{i}": prefix + [(i * 53 + 7) % 900 + 5, 11 + i] for i in range(4)}
    results = {}
    for enabled in (True, False):
        engine = LLMEngine(tiny_model_dir, config=EngineConfig(enable_prefix_caching=enabled, **small))
        for rid, prompt in prompts.items():
            engine.add_request(rid, prompt, _greedy(14))
        outs: dict[str, list[int]] = {}
        while engine.has_unfinished():
            for out in engine.step():
                outs.setdefault(out.request_id, []).extend(out.token_ids)
        assert engine.stats().num_kv_blocks_used == 0
        results[enabled] = (outs, engine.num_prefill_tokens_computed, engine.num_preemptions)
    assert results[True][0] == results[False][0]
    assert results[True][1] < results[False][1]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 3), st.integers(1, 14)), min_size=1, max_size=50))
def test_invariants_hold_when_requests_share_prefixes_at_random(ops):
    """Requests whose prompts are prefixes of a few token streams come and go: a held block is never cached or
    handed out twice, every token KV a request holds is its own tokens' (by key), pages stay accounted."""
    pool = PagePool(4)
    bm = _manager(pool, max_pages=4, bpp=3, block_size=2, cached=1)
    streams = [[s * 100 + i for i in range(40)] for s in range(4)]
    live: list[Seq] = []
    for is_admit, stream, num_tokens in ops:
        if is_admit or not live:
            seq = Seq(streams[stream][:num_tokens])
            seq.num_computed_tokens = bm.take_cached_prefix(seq)
            if not bm.grow(seq, num_tokens):
                bm.release(seq)
                continue
            seq.num_computed_tokens = num_tokens
            bm.cache_computed_blocks(seq)
            live.append(seq)
        else:
            bm.release(live.pop(num_tokens % len(live)))
        held = [b for seq in live for b in seq.block_ids]
        assert not set(held) & set(bm._cached), "a held block is never evictable"
        assert len(set(held)) == bm.num_used_blocks
        assert all(held.count(b) == bm.num_holders(b) for b in set(held))
        assert all(b // 3 in pool.held for b in held + list(bm._cached))
        for seq in live:  # a registered block's key is the key of the tokens its holder put there
            for index, block_id in enumerate(seq.block_ids[: len(seq.token_ids) // 2]):
                key = bm._hash_of_block.get(block_id)
                assert key is None or key == seq.block_hashes[index]


def test_the_worker_exports_queries_hits_and_hit_rate_per_model_and_drops_models_that_left():
    from runtime.metrics import REGISTRY
    from worker.engine.outputs import EngineStats
    from worker.shell.metrics import observe_prefix_cache

    def stats(queries: int, hits: int) -> EngineStats:
        return EngineStats(0, 0, 0, 0, None, None, None, None, prefix_cache_queries=queries, prefix_cache_hits=hits)

    def value(name: str, model: str):
        return REGISTRY.get_sample_value(name, {"worker": "w-prefix", "model": model})

    observe_prefix_cache("w-prefix", [("m", stats(100, 60)), ("m", stats(50, 15)), ("n", stats(0, 0))])
    assert value("janus_worker_prefix_cache_queries_tokens", "m") == 150
    assert value("janus_worker_prefix_cache_hits_tokens", "m") == 75
    assert value("janus_worker_prefix_cache_hit_rate", "m") == 0.5
    assert value("janus_worker_prefix_cache_hit_rate", "n") == 0.0
    observe_prefix_cache("w-prefix", [("m", stats(200, 60))])
    assert value("janus_worker_prefix_cache_hit_rate", "m") == pytest.approx(0.3)
    assert value("janus_worker_prefix_cache_queries_tokens", "n") is None


def test_p_d_the_prefill_side_reuses_its_cache_and_the_decode_side_registers_nothing(tiny_model_dir):
    from worker.engine import PlainKVPageSource

    from .test_pd import PROMPT, _hand_over

    source = PlainKVPageSource(num_pages_total=16, page_size_bytes=8 << 10)
    config = EngineConfig(block_size=4, kv_cache_bytes=64 << 10)
    prefill = LLMEngine(tiny_model_dir, config=config, kv_source=source, owner="prefill")
    decode = LLMEngine(tiny_model_dir, config=config, kv_source=source, owner="decode")
    colocated = LLMEngine(tiny_model_dir, config=EngineConfig(block_size=4, enable_prefix_caching=False))
    colocated.add_request("ref", PROMPT, _greedy(8))
    expected = []
    while colocated.has_unfinished():
        expected += [t for out in colocated.step() for t in out.token_ids]
    for rid in ("first", "second"):
        done, outs = _hand_over(prefill, decode, rid, _greedy(8), by_address=False)
        assert list(done.token_ids) + [t for out in outs for t in out.token_ids] == expected
    assert prefill.stats().prefix_cache_hits == 20, "the second prefill found its 5 full blocks but the last token's"
    assert decode.stats().num_kv_blocks_cached == 0 and decode.stats().prefix_cache_queries == 0


def test_each_request_reports_the_prompt_tokens_it_found_cached(tiny_model_dir):
    """The usage's prompt_tokens_details.cached_tokens comes from here (RequestDone.num_cached_tokens)."""
    engine = LLMEngine(tiny_model_dir, config=EngineConfig(block_size=8))
    prompt = engine.tokenizer.encode("A system prompt that every turn of this chat repeats, word for word, again.")

    def run(request_id: str, tokens: list[int], n: int = 1) -> list[int]:
        hits_before = engine.stats().prefix_cache_hits
        engine.add_request(request_id, tokens, SamplingParams(max_tokens=3, temperature=0, ignore_eos=True, n=n))
        finals = []
        while engine.has_unfinished():
            finals += [out.num_cached_tokens for out in engine.step() if out.is_finished]
        assert finals == [engine.stats().prefix_cache_hits - hits_before]  # one final output, the engine's count
        return finals

    assert len(prompt) > 16 and run("first", prompt) == [0]
    (cached,) = run("second", prompt + engine.tokenizer.encode(" And a new question?"))
    assert cached >= 8 * (len(prompt) // 8) - 8 and cached % 8 == 0
    assert run("forked", prompt + [1, 2, 3], n=3)[0] == cached  # n > 1: the choices share the one prompt

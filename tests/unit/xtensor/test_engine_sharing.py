"""Two real engines (worker/engine LLMEngine) on one xTensor pool trade KV memory, and serve the same greedy
outputs as the same engines on the engine's plain pools, while the pool compacts their pages between steps.

Model B's burst takes most of the KV pages; once it is done its pages go back, model A's burst takes them (A could
not have fit beside B's burst), gives them back, and B's second burst takes them again. Each engine also serves a
light request while the other one bursts. Sizes: 128 KiB pages; a demo-tiny KV block (16 tokens) is 8 KiB, 16 per
page; a demo-small one 32 KiB, 4 per page.
"""
from __future__ import annotations

import pytest

from contracts.requests import SamplingParams
from worker.xtensor import XTensor, XTensorConfig

PAGE = 128 * 1024
NUM_KV_PAGES = 14  # B's burst needs ~10 pages, A's ~8: either fits alone, not both at once


def prompts(seed: int, num: int, length: int) -> list[list[int]]:
    return [[(seed * 131 + i * 17 + j * 7) % 900 + 3 for j in range(length)] for i in range(num)]


def run_phase(burst_engine, burst_prompts, light_engine, light_prompt, tag, observe, between_steps=None):
    """Add a burst to one engine and one light request to the other, step both to completion (same order of calls
    in every run, so batches are identical), return {request_id: token ids}. `between_steps(engine)` runs after each
    of an engine's steps (the xTensor run compacts there)."""
    for i, prompt in enumerate(burst_prompts):
        # Different lengths: requests finish at different steps, freeing pages below ones still in use.
        greedy = SamplingParams(max_tokens=3 + 5 * (i % 4), temperature=0, ignore_eos=True)
        burst_engine.add_request(f"{tag}-burst-{i}", prompt, greedy)
    light_engine.add_request(f"{tag}-light", light_prompt, SamplingParams(max_tokens=12, temperature=0,
                                                                          ignore_eos=True))
    tokens: dict[str, list[int]] = {}
    while burst_engine.has_unfinished() or light_engine.has_unfinished():
        for engine in (burst_engine, light_engine):
            for out in engine.step():
                tokens.setdefault(out.request_id, []).extend(out.token_ids)
            if between_steps is not None:
                between_steps(engine)
        observe()
    return tokens


def serve_scenario(engine_a, engine_b, observe, between_steps=None):
    """B bursts (A light), A bursts (B light), B bursts again (A light)."""
    outputs = {}
    for burst, light, seed, num, length, tag in ((engine_b, engine_a, 1, 8, 60, "p1"),
                                                 (engine_a, engine_b, 3, 16, 120, "p2"),
                                                 (engine_b, engine_a, 5, 8, 60, "p3")):
        outputs |= run_phase(burst, prompts(seed, num, length), light, prompts(seed + 1, 1, 20)[0], tag,
                             observe(burst.owner.lower()), between_steps)
    return outputs


def test_two_models_trade_kv_pages_and_serve_the_plain_pool_outputs(demo_model_dirs):
    from worker.engine import LLMEngine
    from worker.engine.config import EngineConfig

    engine_config = EngineConfig(kv_cache_bytes=32 * PAGE, max_num_seqs=32, use_cuda_graphs=False)

    # Reference: each model on the engine's own plain pools.
    plain_a = LLMEngine(demo_model_dirs["demo-tiny"], config=engine_config, owner="A")
    plain_b = LLMEngine(demo_model_dirs["demo-small"], config=engine_config, owner="B")
    expected = serve_scenario(plain_a, plain_b, lambda phase: (lambda: None))

    num_weight_pages = sum(-(-e.weight_layout.total_bytes // PAGE) for e in (plain_a, plain_b))
    # Cache maintenance runs between steps here, not on the refill thread: where the thread's passes fall against
    # the engines' steps decides whether a hole exists when compaction looks, and the test must not hang on that.
    pool_config = XTensorConfig(page_size_bytes=PAGE, kv_low_watermark_pages=1, kv_high_watermark_pages=2,
                                is_background_refill=False)
    with XTensor.open("cpu", (num_weight_pages + NUM_KV_PAGES) * PAGE, pool_config) as pool:
        engine_a = LLMEngine(demo_model_dirs["demo-tiny"], config=engine_config, kv_source=pool,
                             weight_source=pool, owner="A")
        engine_b = LLMEngine(demo_model_dirs["demo-small"], config=engine_config, kv_source=pool,
                             weight_source=pool, owner="B")
        assert pool.counters().pages_by_model["B"]["weights"] == -(-plain_b.weight_layout.total_bytes // PAGE)
        peak_pages: dict[str, set[int]] = {}  # phase's bursting owner -> physical KV pages at its peak

        def observe(bursting: str):
            owner = bursting.upper()
            key = f"{owner}{len([k for k in peak_pages if k.startswith(owner)])}"

            def record():
                table = pool.page_table_snapshot()
                held = {page for page, entry in enumerate(table) if entry == (owner, "kv")}
                if len(held) > len(peak_pages.get(key, ())):
                    peak_pages[key] = held
                counters = pool.counters()
                assert counters.num_pages_free + sum(sum(k.values()) for k in counters.pages_by_model.values()) \
                    == counters.num_pages_total
            return record

        # Between an engine's steps, the pool may move that engine's pages (KV with live contents) to close holes.
        def maintain_and_compact(engine) -> None:
            pool.run_kv_maintenance()
            pool.compact(engine.owner, max_moves=4)

        got = serve_scenario(engine_a, engine_b, observe, maintain_and_compact)
        stats = pool.stats()

    assert got == expected  # same greedy tokens for every request, burst and light, in every phase
    b_first, a_burst, b_second = peak_pages["B0"], peak_pages["A0"], peak_pages["B1"]
    assert len(a_burst) + len(b_first) > NUM_KV_PAGES  # A's burst could not have fit beside B's
    assert a_burst & b_first, "A's burst ran on pages B had freed"
    assert b_second & a_burst, "and B's second burst ran on pages A gave back"
    assert stats.num_kv_cache_hits > 0
    assert stats.num_pages_compacted > 0  # pages did move mid-generation, and the tokens did not change


def test_a_sleeping_engine_wakes_under_the_same_views_and_serves_again(demo_model_dirs):
    from worker.engine import LLMEngine
    from worker.engine.config import EngineConfig
    from worker.engine.weights import load_checkpoint

    engine_config = EngineConfig(kv_cache_bytes=16 * PAGE, use_cuda_graphs=False)
    greedy = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)

    def generate(engine, request_id):
        engine.add_request(request_id, prompts(9, 1, 40)[0], greedy)
        tokens = []
        while engine.has_unfinished():
            tokens += [t for out in engine.step() for t in out.token_ids]
        return tokens

    # Cache maintenance runs between steps here, not on the refill thread: where the thread's passes fall against
    # the engines' steps decides whether a hole exists when compaction looks, and the test must not hang on that.
    pool_config = XTensorConfig(page_size_bytes=PAGE, kv_low_watermark_pages=1, kv_high_watermark_pages=2,
                                is_background_refill=False)
    with XTensor.open("cpu", 160 * PAGE, pool_config) as pool:
        engine = LLMEngine(demo_model_dirs["demo-small"], config=engine_config, kv_source=pool, weight_source=pool,
                           owner="B")
        num_weight_pages = pool.counters().pages_by_model["B"]["weights"]
        assert num_weight_pages > 80
        before = generate(engine, "before")
        weight_ptr = engine.weight_buffer.data_ptr()
        pool.sleep("B")
        assert sum(pool.counters().pages_by_model["B"].values()) == 0
        # The memory is really usable by another model: more than half the pool, so not beside B's weights.
        other = pool.allocate_weights("other", (160 - num_weight_pages + 1) * PAGE, "cpu")
        other.fill_(1)
        pool.release_weights("other")
        pool.wake("B")
        # Lifecycle's job on wake: copy the weights back into the same buffer (here: from disk).
        load_checkpoint(demo_model_dirs["demo-small"], engine.weight_layout, engine.weight_buffer)
        assert engine.weight_buffer.data_ptr() == weight_ptr
        assert engine.verify_weights()
        assert generate(engine, "after") == before


@pytest.mark.parametrize("owner_count", [3])
def test_several_engines_register_as_owners_of_one_pool(demo_model_dirs, owner_count):
    from worker.engine import LLMEngine
    from worker.engine.config import EngineConfig

    engine_config = EngineConfig(kv_cache_bytes=8 * PAGE, use_cuda_graphs=False)
    with XTensor.open("cpu", 48 * PAGE, XTensorConfig(page_size_bytes=PAGE)) as pool:
        engines = [LLMEngine(demo_model_dirs["demo-tiny"], config=engine_config, kv_source=pool, weight_source=pool,
                             owner=f"tiny-{i}") for i in range(owner_count)]
        counters = pool.counters()
        assert sorted(counters.pages_by_model) == [e.owner for e in engines]
        segments = [pool.weight_segments(e.owner) for e in engines]
        starts = sorted(offset for segs in segments for offset, _ in segs)
        assert len(set(starts)) == len(starts)  # disjoint weight regions, each reported by global offset
        assert all(e.weight_checksums() == engines[0].weight_checksums() for e in engines)  # same checkpoint

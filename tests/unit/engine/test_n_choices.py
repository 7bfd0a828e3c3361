"""`n` > 1 in the engine: the prompt is computed once, its KV blocks shared by the n samples (the partly filled last
block copied), each sample streams under the request's id with its index, and the request ends once."""
from __future__ import annotations

import pytest

from contracts.requests import SamplingParams
from worker.engine import EngineConfig, LLMEngine

PROMPT = [(i * 31) % 900 + 3 for i in range(13)]  # 13 tokens: three full blocks of 4 and a partial one


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return LLMEngine(tiny_model_dir, config=EngineConfig(block_size=4))


def _run(engine: LLMEngine) -> list:
    outs = []
    while engine.has_unfinished():
        outs.extend(engine.step())
    return outs


def _by_choice(outs) -> dict[int, list[int]]:
    choices: dict[int, list[int]] = {}
    for out in outs:
        choices.setdefault(out.index, []).extend(out.token_ids)
    return choices


def test_n_samples_come_from_one_prompt_computation(engine):
    used_before = engine.block_manager.num_used_blocks
    computed_before = engine.num_prefill_tokens_computed
    engine.add_request("r", PROMPT, SamplingParams(max_tokens=6, n=4, seed=3, ignore_eos=True))
    outs = _run(engine)
    assert engine.num_prefill_tokens_computed - computed_before == len(PROMPT)  # not 4 x 13
    choices = _by_choice(outs)
    assert sorted(choices) == [0, 1, 2, 3] and all(len(t) == 6 for t in choices.values())
    assert len({tuple(t) for t in choices.values()}) > 1  # seed + i per sample: they differ
    assert {o.request_id for o in outs} == {"r"}
    ends = [o for o in outs if o.choice_finish_reason is not None]
    assert sorted(o.index for o in ends) == [0, 1, 2, 3] and all(o.choice_finish_reason == "length" for o in ends)
    assert [o.is_finished for o in outs].count(True) == 1 and outs[-1].is_finished
    assert engine.block_manager.num_used_blocks == used_before  # shared blocks went back with their last holder


def test_greedy_samples_equal_a_single_greedy_run(engine):
    """The forks decode from the shared and copied KV: any error there would change their tokens."""
    engine.add_request("one", PROMPT, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    single = _by_choice(_run(engine))[0]
    engine.add_request("three", PROMPT, SamplingParams(max_tokens=8, n=3, temperature=0, ignore_eos=True))
    choices = _by_choice(_run(engine))
    assert [choices[i] for i in range(3)] == [single] * 3


def test_a_seeded_request_is_reproducible(engine):
    runs = []
    for rid in ("a", "b"):
        engine.add_request(rid, PROMPT, SamplingParams(max_tokens=5, n=2, seed=11, ignore_eos=True))
        runs.append(_by_choice(_run(engine)))
    assert runs[0] == runs[1]


def test_abort_ends_every_sample_and_frees_the_blocks(engine):
    used_before = engine.block_manager.num_used_blocks
    engine.add_request("x", PROMPT, SamplingParams(max_tokens=50, n=3, ignore_eos=True))
    for _ in range(3):
        engine.step()
    engine.abort("x")
    outs = _run(engine)
    assert [(o.request_id, o.finish_reason) for o in outs if o.is_finished] == [("x", "abort")]
    assert engine.block_manager.num_used_blocks == used_before
    engine.add_request("x", PROMPT, SamplingParams(max_tokens=1))  # the id is free again
    _run(engine)


def test_prefill_decode_split_refuses_n(engine):
    with pytest.raises(ValueError, match="colocated"):
        engine.add_prefill_request("p", PROMPT, SamplingParams(max_tokens=2, n=2))

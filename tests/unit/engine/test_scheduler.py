"""Scheduler: continuous batching, chunked prefill under the token budget, preemption by recompute."""
from __future__ import annotations

from contracts.requests import SamplingParams
from worker.engine.block_manager import BlockManager
from worker.engine.scheduler import Scheduler
from worker.engine.sequence import Sequence, SequenceStatus

from .test_block_manager import PagePool


def _seq(rid: str, num_prompt: int, max_tokens: int = 100) -> Sequence:
    return Sequence(request_id=rid, token_ids=list(range(num_prompt)), num_prompt_tokens=num_prompt,
                    sampling=SamplingParams(max_tokens=max_tokens), arrival_s=0.0)


def _scheduler(num_pages=16, bpp=4, block_size=4, budget=16, max_seqs=8) -> Scheduler:
    pool = PagePool(num_pages)
    bm = BlockManager(block_size=block_size, blocks_per_page=bpp, max_num_pages=num_pages,
                      acquire_pages=pool.acquire, release_pages=pool.release)
    return Scheduler(bm, max_num_seqs=max_seqs, max_num_batched_tokens=budget)


def _commit(batch, sampled_token=7):
    """What the engine does after a step: KV now exists; requests that reached their end get a token."""
    for seq, n in zip(batch.seqs, batch.num_new_tokens):
        seq.num_computed_tokens += n
        if seq.num_computed_tokens == seq.num_tokens:
            seq.token_ids.append(sampled_token)


def test_long_prompt_is_chunked_under_the_token_budget_while_others_decode():
    s = _scheduler(budget=10)
    short, long = _seq("short", 3), _seq("long", 25)
    s.add(short)
    s.add(long)
    chunks = []
    for _ in range(5):
        batch = s.schedule()
        assert batch.num_tokens <= 10
        chunks.append(dict(zip([q.request_id for q in batch.seqs], batch.num_new_tokens)))
        _commit(batch)
    assert chunks[0] == {"short": 3, "long": 7}
    assert chunks[1] == {"short": 1, "long": 9}  # short decodes while long keeps prefilling
    assert chunks[2] == {"short": 1, "long": 9}
    assert chunks[3] == chunks[4] == {"short": 1, "long": 1}  # long's prompt done: both decode
    assert long.num_computed_tokens == 27 and long.num_output_tokens == 3


def test_max_num_seqs_limits_the_running_batch():
    s = _scheduler(max_seqs=2, budget=100)
    for i in range(4):
        s.add(_seq(f"r{i}", 2))
    batch = s.schedule()
    assert [q.request_id for q in batch.seqs] == ["r0", "r1"]
    assert len(s.waiting) == 2


def test_preemption_frees_the_latest_request_and_requeues_it_first():
    # 2 pages x 4 blocks x 4 tokens = 32 tokens of KV in all.
    s = _scheduler(num_pages=2, budget=64)
    a, b = _seq("a", 12), _seq("b", 12)
    s.add(a)
    s.add(b)
    _commit(s.schedule())  # a: 3 blocks + b: 3 blocks of 8 -> 2 free
    for _ in range(10):  # decode until blocks run out: a needs a 5th block at 17 tokens
        batch = s.schedule()
        if batch.preempted:
            break
        _commit(batch)
    assert batch.preempted == [b]
    assert b.status == SequenceStatus.WAITING and b.block_ids == [] and b.num_computed_tokens == 0
    assert s.waiting[0] is b and b.num_preemptions == 1
    assert [q.request_id for q in batch.seqs] == ["a"]
    # b keeps its output tokens: they are recomputed with the prompt once a finishes.
    num_b_tokens = b.num_tokens
    assert num_b_tokens > 12
    s.remove(a)
    s.block_manager.free(a.block_ids)
    batch = s.schedule()
    assert batch.seqs == [b] and batch.num_new_tokens == [num_b_tokens]


def test_a_request_that_cannot_grow_preempts_itself_when_alone():
    s = _scheduler(num_pages=1, budget=64)  # 16 tokens of KV
    a = _seq("a", 16)
    s.add(a)
    _commit(s.schedule())  # 16 tokens of KV in 4 blocks, plus a sampled 17th token
    batch = s.schedule()  # its KV needs a 5th block
    assert batch.preempted == [a] and batch.seqs == []

"""Continuous batching with chunked prefill under a token budget and preemption by recompute. Torch-free.

Each step every running request asks for the tokens it has no KV for yet (one for a decoding request, the rest
of the prompt, capped by the budget, for a prefilling one), then waiting requests are admitted while the budget,
the batch size and the blocks allow. The only question asked of memory is `allocate(...) -> blocks | None`; when
it says None for a running request, the most recently admitted running request is preempted: its blocks are freed
and it goes back to the front of the queue, to be recomputed from its tokens later (vLLM v1's policy).
A request admitted with no KV first takes the cached blocks of its longest cached prefix (prefix caching, in the
block manager) and computes from there.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .block_manager import BlockManager
from .sequence import Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    """One step's work: `num_new_tokens[i]` tokens of `seqs[i]`, starting at its `num_computed_tokens`."""

    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.seqs

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)


class Scheduler:
    def __init__(self, block_manager: BlockManager, *, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, seq: Sequence) -> None:
        """Take a request out of the waiting or running queue (finished, aborted or held). Its KV blocks stay with
        it: the engine releases them (`BlockManager.release`), or keeps them until a P/D hand-over has sent them
        (pd.py)."""
        if seq.status == SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status == SequenceStatus.WAITING:
            self.waiting.remove(seq)

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            num_new = min(seq.num_uncomputed_tokens, budget)
            if num_new <= 0:
                index += 1
                continue
            if not self._grow(seq, num_new, batch):
                break  # seq itself was preempted: it was the last running request
            batch.seqs.append(seq)
            batch.num_new_tokens.append(num_new)
            budget -= num_new
            index += 1
        # No admissions in a step that had to preempt: memory is short, admitting would only thrash.
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not batch.preempted:
            seq = self.waiting[0]
            is_lookup = not seq.block_ids and not seq.num_computed_tokens  # no KV yet (not a P/D hand-over)
            num_cached_tokens = self._take_cached_prefix(seq) if is_lookup else 0
            num_new = min(seq.num_uncomputed_tokens, budget)
            if not self.block_manager.grow(seq, seq.num_computed_tokens + num_new):
                if num_cached_tokens:  # let the cached blocks go again: they stay cached for the next try
                    self.block_manager.release(seq)
                    seq.num_computed_tokens = 0
                break
            if is_lookup:
                self.block_manager.record_prefix_query(seq.num_tokens, num_cached_tokens)
                if seq.first_token_s is None:  # the first admission, not a recompute after preemption
                    seq.num_cached_prompt_tokens = num_cached_tokens
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            batch.seqs.append(seq)
            batch.num_new_tokens.append(num_new)
            budget -= num_new
        return batch

    def _take_cached_prefix(self, seq: Sequence) -> int:
        """Tokens of `seq` whose KV is found cached, now held in its table and counted as computed."""
        num_cached_tokens = self.block_manager.take_cached_prefix(seq)
        seq.num_computed_tokens = num_cached_tokens
        return num_cached_tokens

    def _grow(self, seq: Sequence, num_new: int, batch: ScheduledBatch) -> bool:
        """Blocks for `num_new` more tokens of `seq`, preempting from the back of the running list as needed.
        False when `seq` itself had to go."""
        while True:
            if self.block_manager.grow(seq, seq.num_computed_tokens + num_new):
                return True
            victim = self.running.pop()
            self._preempt(victim)
            batch.preempted.append(victim)
            if victim is seq:
                return False

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.release(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)

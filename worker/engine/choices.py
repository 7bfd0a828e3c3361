"""`n` > 1 in `LLMEngine` (a mixin; the engine's state lives there): one prompt computation, n samples.

A request with `n` > 1 enters as one sequence (index 0). The step in which it samples its first token forks the
other n - 1 from it: each holds the prompt's full KV blocks together with it (BlockManager.share: freed when the
last holder goes), gets its own copy of the partly filled last block (its decode writes there), and samples its
first token from the same logits row. So the prompt's prefill runs once (`num_prefill_tokens_computed` says so).
When no block is free for the copy, the fork waits at the front of the queue and recomputes the prompt itself.

Each sample streams under the client's request id with its `index`; a sample that ends while others go on says so
in `choice_finish_reason`, and the last one to end is the request's end (`is_finished`). A seeded request's
sample i draws from seed + i, so the samples differ yet the request is reproducible.
"""
from __future__ import annotations

import torch

from contracts.requests import SEED_LIMIT

from .sequence import Sequence, SequenceStatus


class ChoicesMixin:
    def _fork_pending(self, sampled: list[Sequence], logits: torch.Tensor | None):
        """Fork the n - 1 samples of every request in `sampled` whose first token is due; returns the rows to
        sample (the forks added, each on its parent's logits row) and those logits."""
        parents = [k for k, seq in enumerate(sampled) if seq.num_forks_pending]
        if not parents:
            return sampled, logits
        rows, extra = list(sampled), []
        for k in parents:
            for child in self._fork(sampled[k]):
                if child.status == SequenceStatus.RUNNING:
                    rows.append(child)
                    extra.append(k)
        if extra:
            logits = torch.cat([logits, logits[extra]])
        return rows, logits

    def _fork(self, parent: Sequence) -> list[Sequence]:
        bm = self.block_manager
        n_prompt = parent.num_prompt_tokens
        children = []
        for index in range(1, parent.num_forks_pending + 1):
            sampling = parent.sampling
            if sampling.seed is not None:
                sampling = sampling.model_copy(update={"seed": (sampling.seed + index) % SEED_LIMIT})
            child = Sequence(request_id=f"{parent.request_id}#{index}", token_ids=list(parent.token_ids[:n_prompt]),
                             num_prompt_tokens=n_prompt, sampling=sampling, arrival_s=parent.arrival_s,
                             group_id=parent.request_id, index=index,
                             num_cached_prompt_tokens=parent.num_cached_prompt_tokens)  # one prompt: its usage
            self._register(child)
            self._groups[parent.request_id].append(child)
            if not bm.fork(parent, child, n_prompt, self.kv_cache.copy_block):
                # no block for the copy: recompute the prompt later, as a preempted request does
                child.status = SequenceStatus.WAITING
                self.scheduler.waiting.appendleft(child)
            else:
                child.num_computed_tokens = n_prompt
                child.status = SequenceStatus.RUNNING
                self.scheduler.running.append(child)
            children.append(child)
        parent.num_forks_pending = 0
        return children

    def _group_end(self, seq: Sequence, finish_reason: str) -> str | None:
        """A sample ended with `finish_reason`: the request's finish reason, None while another sample goes on."""
        return None if self._siblings(seq) or seq.num_forks_pending else finish_reason

    def _siblings(self, seq: Sequence) -> list[Sequence]:
        group = self._groups.get(seq.client_id)
        return [s for s in group if s is not seq and s.status != SequenceStatus.FINISHED] if group else []

    def _end_group(self, seq: Sequence) -> None:
        """Abort or failure of one sample ends its request: every other sample goes too."""
        for other in self._siblings(seq):
            self._finish(other)

    def _forget_member(self, seq: Sequence) -> bool:
        """Take a finished sample out of its group; True when the request has no sample left (its id is free)."""
        group = self._groups.get(seq.client_id)
        if group is None:
            return True
        if seq in group:
            group.remove(seq)
        if group:
            return False
        del self._groups[seq.client_id]
        return True

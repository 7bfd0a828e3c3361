"""A request inside the engine: its tokens, how many have KV computed, its blocks. Torch-free."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from contracts.requests import SamplingParams


class SequenceStatus(enum.Enum):
    NEW = "new"  # not in the scheduler yet (queued in the engine's inbox)
    WAITING = "waiting"
    RUNNING = "running"
    HELD = "held"  # P/D prefill done: KV blocks kept for transfer, no more compute
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """One request. `token_ids` is prompt + output; KV exists for the first `num_computed_tokens` of them.

    Preemption by recompute only resets `num_computed_tokens` (and frees the blocks): the output so far stays
    and is recomputed as if it were prompt, so the stream continues where it stopped.
    """

    request_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    sampling: SamplingParams
    arrival_s: float
    is_prefill_only: bool = False
    status: SequenceStatus = SequenceStatus.NEW
    num_computed_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    first_token_s: float | None = None
    last_token_s: float | None = None
    num_preemptions: int = 0
    # Output tokens that exist before this engine's first sample (P/D decode: the prefill instance's first token).
    num_inherited_output_tokens: int = 0
    # n > 1: the samples of one request are sequences of one group. The first (index 0, its request_id the client's)
    # computes the prompt; when it samples its first token, the others are forked from it (choices.py).
    group_id: str = ""  # the client's request id ("" for index 0: request_id is)
    index: int = 0
    num_forks_pending: int = 0
    # Prefix caching (block_manager): keys of the full token blocks, and how many leading blocks were offered to the
    # cache. False for a P/D decode side's request, whose prompt KV another instance wrote: it registers nothing.
    block_hashes: list[bytes] = field(default_factory=list)
    num_registered_blocks: int = 0
    is_prefix_cacheable: bool = True
    num_cached_prompt_tokens: int = 0  # found cached at its first admission (reported in the usage)

    @property
    def client_id(self) -> str:
        return self.group_id or self.request_id

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def last_token_id(self) -> int:
        return self.token_ids[-1]

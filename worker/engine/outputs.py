"""What `LLMEngine.step()` and `LLMEngine.stats()` return. Torch-free, so shells can type against them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from contracts.requests import SamplingParams

FinishReason = Literal["stop", "length", "abort", "error"]


@dataclass(frozen=True)
class EngineOutput:
    """One request's progress in one step.

    `token_ids` are the tokens new this step (usually one), `text` the text they add (stop strings and text that
    could still become one are held back). `is_finished` is True exactly once per request, with its reason.

    Prefill/decode disaggregation: a request added with `add_prefill_request` ends with one output where
    `is_prefill_done` is True and `kv_block_ids` lists the blocks holding its prompt's KV (kept until
    `release_kv_blocks`); `is_finished` stays False there unless the request already ended at its first token.

    Moving a running decode (`migration`): `detach_decode` yields one output with `detached` set and no tokens, in
    order after the request's last tokens here; its blocks are held until `release_kv_blocks` or `reattach_decode`.

    finish_reason "error": something failed while serving this one request (setting up its sampler or stop
    matching, detokenising its token); it ended alone with `error` saying what, and the engine goes on.
    """

    request_id: str
    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[float, ...] | None
    is_finished: bool
    finish_reason: FinishReason | None
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int = 0  # of the prompt, found in the prefix cache when the request was first admitted
    is_prefill_done: bool = False
    kv_block_ids: tuple[int, ...] | None = None
    error: str | None = None  # finish_reason "error": what failed while serving this request (it alone ended)
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] | None = None  # per token: (id, logprob) alternatives
    index: int = 0  # n > 1: which sample (choice) of the request
    choice_finish_reason: FinishReason | None = None  # this sample ended (the request only once all have)
    detached: "DetachedDecode | None" = None


@dataclass(frozen=True)
class DetachedDecode:
    """A decode taken off its engine to move (`LLMEngine.detach_decode`), its KV held until `release_kv_blocks` or
    `reattach_decode`."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    output_token_ids: tuple[int, ...]  # every token sampled so far; the last one has no KV yet
    kv_block_ids: tuple[int, ...]
    sampling: SamplingParams

    @property
    def num_kv_tokens(self) -> int:
        """Tokens whose KV the blocks hold (and a target must reserve): the prompt and all outputs but the last."""
        return len(self.prompt_token_ids) + len(self.output_token_ids) - 1


@dataclass(frozen=True)
class EngineStats:
    """The engine's load, for the worker's heartbeat. Latencies and rates are measured over a recent window
    (EngineConfig.stats_window_s); None until there is a sample."""

    num_waiting: int
    num_running: int
    num_kv_blocks_used: int
    num_kv_blocks_free: int
    ttft_ms_p50: float | None
    tpot_ms_p50: float | None
    prefill_tokens_per_s: float | None
    decode_tokens_per_s: float | None
    num_held_prefills: int = 0  # P/D: finished prefills whose KV blocks wait for transfer
    num_preemptions: int = 0  # since start: requests recomputed because KV blocks ran out
    prefix_cache_queries: int = 0  # since start: prompt tokens of admitted requests looked up in the prefix cache
    prefix_cache_hits: int = 0  # since start: of those, tokens whose KV was found cached (not computed)
    num_kv_blocks_cached: int = 0  # free blocks keeping a prefix's KV (counted in num_kv_blocks_free)

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else None


@dataclass(frozen=True)
class StepRecord:
    """What the last `step()` computed (profilers and cost models read it: `LLMEngine.last_step`)."""

    num_prefill_tokens: int  # prompt tokens (and recomputed tokens of preempted requests)
    num_decode_tokens: int
    num_seqs: int
    duration_s: float  # model forward + sampling

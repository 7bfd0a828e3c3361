"""Weight verification after a restore or a fork: per-segment checksums and a one-step canary, plus
`bind_weights` (a mixin of `LLMEngine`).

The canary runs a fixed prompt through a cache-free forward pass (no KV block is touched, so it is safe while
requests are parked) and greedily extends it a few tokens. The engine records its canary right after loading from
disk (`reference_canary`); after new pages are filled, `verify_weights()` runs it again and compares. Call these
from the engine thread while it is not stepping (the lifecycle's VERIFYING state).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .checksum import segment_checksums

_CANARY_PROMPT_LEN = 8
_CANARY_NUM_TOP = 8


@dataclass(frozen=True)
class CanaryResult:
    token_ids: tuple[int, ...]  # the greedy continuation
    top_logits: tuple[float, ...]  # the largest logits after the last step
    dtype: str

    def matches(self, other: "CanaryResult", rtol: float | None = None) -> bool:
        """Same tokens and top logits within a relative tolerance (bf16 kernels may differ in the last bits)."""
        if self.token_ids != other.token_ids or len(self.top_logits) != len(other.top_logits):
            return False
        if rtol is None:
            rtol = 1e-4 if self.dtype == "torch.float32" else 2e-2
        return all(abs(a - b) <= rtol * max(1.0, abs(b)) for a, b in zip(self.top_logits, other.top_logits))


def canary_prompt(vocab_size: int) -> list[int]:
    return [(i * 7919 + 13) % vocab_size for i in range(_CANARY_PROMPT_LEN)]


def run_canary(runner, vocab_size: int, dtype: torch.dtype, num_steps: int = 2) -> CanaryResult:
    ids = canary_prompt(vocab_size)
    generated: list[int] = []
    logits = None
    for _ in range(num_steps):
        logits = runner.dense_logits(ids)[-1]
        token = int(logits.argmax())
        ids.append(token)
        generated.append(token)
    top = logits.topk(min(_CANARY_NUM_TOP, logits.numel())).values.tolist()
    return CanaryResult(tuple(generated), tuple(top), str(dtype))


class WeightVerificationMixin:
    def canary(self, num_steps: int = 2) -> CanaryResult:
        """Run the canary now (engine thread, not while stepping)."""
        with torch.inference_mode(), self._stream_context():
            result = run_canary(self.runner, self.model_config.vocab_size, self.dtype, num_steps)
        return result

    def verify_weights(self, reference: CanaryResult | None = None) -> bool:
        """The canary matches `reference` (default: the one recorded right after the load from disk, or handed to
        the constructor). Raises ValueError when there is none (an engine built with `load_weights=False`).
        The prefix cache is dropped: an engine is verified after a wake, restore or fork, when its KV pages may have
        been unmapped and backed again, so no cached block's KV can be trusted."""
        self.drop_prefix_cache()
        reference = reference or self.reference_canary
        if reference is None:
            raise ValueError("no reference canary to verify against: built without weights; prove the bytes another "
                             "way (checksums against a verified copy), then record_reference_canary()")
        return self.canary(len(reference.token_ids)).matches(reference)

    def record_reference_canary(self, num_steps: int = 2) -> CanaryResult:
        """Run the canary now and keep it as the reference: for weights whose bytes are already proven (read from
        disk, or checksums equal to a verified replica's). Raises ValueError when its logits are not finite.
        Drops the prefix cache, as `verify_weights` does."""
        self.drop_prefix_cache()
        result = self.canary(num_steps)
        if not all(math.isfinite(x) for x in result.top_logits):
            raise ValueError("the canary's logits are not finite: these weights cannot be a model")
        self.reference_canary = result
        return result

    def weight_checksums(self) -> list[str]:
        """One checksum per weight segment the weight source reports (its contiguous page runs, in order), over
        the engine's weight buffer. Compare with the source replica's or the host copy's."""
        lengths, total = [], self.weight_buffer.numel()
        for _, num_bytes in self.weight_source.weight_segments(self.owner):
            num_bytes = min(num_bytes, total - sum(lengths))
            if num_bytes > 0:
                lengths.append(num_bytes)
        with self._stream_context():
            return segment_checksums(self.weight_buffer, lengths or [total])

    def bind_weights(self, buffer: torch.Tensor) -> None:
        """Point every weight at `buffer` (same layout: `weight_layout`), e.g. a region the lifecycle layer
        filled. Not while stepping. Captured CUDA graphs are recaptured (they hold the old addresses); refilling
        the current `weight_buffer` in place needs no call at all."""
        with self._lock:
            self.model.weights = self.weight_layout.bind(buffer)
            self.weight_buffer = buffer
            self.block_manager.drop_cached_blocks()  # KV computed with other weights must not be served as a hit
            if self.runner.graphs is not None:
                with self._stream_context():
                    self.runner.graphs.recapture()

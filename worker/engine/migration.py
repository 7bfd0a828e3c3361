"""Moving a running decode to another instance of the same model (a mixin of `LLMEngine`; its state lives there).

Why: a draining decode instance keeps its devices until its longest sequence ends, minutes for long outputs
(docs/bench/sim.md, run 56). Moving its last sequences to an active instance frees the devices at once.

The flow, with a source instance S and a target T of the same model (same block size and dtype):

1. S: `detach_decode(rid)`; at its next step the engine takes the request out of its batch and holds its blocks,
   exactly as a finished prefill's are in P/D, and says so twice: an `EngineOutput` with `detached` set (in
   order after the request's last tokens: what a worker streaming the outputs waits for) and the future
   `detach_decode` returned, holding the same `DetachedDecode` (prompt, every output token so far, the blocks
   holding the KV of all tokens but the last) or the reason it cannot move.
2. T: `reserve_kv_blocks(rid, detached.num_kv_tokens)`.
3. S writes its held blocks into T's (Mooncake by global offset, or `read_kv_blocks` / `write_kv_blocks`), then
   `release_kv_blocks(rid)`.
4. T: `add_migrated_decode(rid, prompt, outputs, sampling, blocks)`. T's outputs continue the stream after the
   last token S emitted; `num_output_tokens` counts S's tokens too, so `max_tokens` and the usage stay exact.

If anything between 1 and 4 fails, S calls `reattach_decode(rid)` and decodes on from its own blocks: the request
never notices. The stream stays the one a single instance would have produced: the sampler's seeded generator is
advanced past S's draws, a grammar replays S's tokens, and the stop-string matcher, fed S's text, holds back the
same tail S held back (it is a function of the text so far).
"""
from __future__ import annotations

from concurrent.futures import Future
from typing import Sequence as Seq

from contracts.requests import SamplingParams

from .outputs import DetachedDecode, EngineOutput
from .pd import _colocated_only
from .sequence import Sequence, SequenceStatus


class MigrationMixin:
    # ---- source side --------------------------------------------------------------------------------------
    def detach_decode(self, request_id: str) -> Future:
        """Take a running decode off the engine at its next step, keeping its KV blocks for a transfer. The future
        holds a `DetachedDecode` (also in that step's outputs), or a ValueError when the request cannot move:
        unknown here, not decoding yet (prefill pending, preempted), one of n > 1 samples (they share blocks), or
        a prefill-only request."""
        future: Future = Future()
        self._inbox.append(("detach", request_id, future))
        return future

    def reattach_decode(self, request_id: str) -> None:
        """Decode a detached request here again (its move failed); a no-op for an id no longer held."""
        self._inbox.append(("reattach", request_id))

    def _detach_now(self, request_id: str, future: Future) -> list[EngineOutput]:
        seq = self._seqs.get(request_id)
        why = _why_not_detachable(seq, self._groups)
        if why:
            future.set_exception(ValueError(f"request {request_id!r} cannot move: {why}"))
            return []
        self._park_held(seq)
        detached = DetachedDecode(
            request_id=request_id, prompt_token_ids=tuple(seq.token_ids[: seq.num_prompt_tokens]),
            output_token_ids=tuple(seq.token_ids[seq.num_prompt_tokens:]), kv_block_ids=tuple(seq.block_ids),
            sampling=seq.sampling)
        future.set_result(detached)
        return [self._output(seq, (), "", None, None, detached=detached)]

    def _reattach_now(self, request_id: str) -> list[EngineOutput]:
        seq = self._held.get(request_id)
        if seq is None or seq.is_prefill_only:
            return []
        del self._held[request_id]
        seq.status = SequenceStatus.NEW
        seq.num_inherited_output_tokens = seq.num_output_tokens  # the sampler replays them all
        try:
            return self._admit_decode(seq)
        except Exception as exc:  # noqa: BLE001 - this request's own setup failed: it alone ends
            return [self._fail_request(seq, exc)]

    # ---- target side --------------------------------------------------------------------------------------
    def add_migrated_decode(
        self,
        request_id: str,
        prompt_token_ids: Seq[int],
        output_token_ids: Seq[int],
        sampling: SamplingParams,
        block_ids: Seq[int],
    ) -> None:
        """Continue a request another instance decoded so far: `output_token_ids` are its tokens (streamed
        there), and the KV of the prompt and of all of them but the last was written into `block_ids` (as
        `reserve_kv_blocks` returned them for this request). P/D's hand-over is the case of one output token."""
        _colocated_only(sampling)
        prompt = self._validate(request_id, prompt_token_ids, sampling)
        outputs = [int(t) for t in output_token_ids]
        if not outputs:
            raise ValueError("a moved decode has at least one output token")
        vocab = self.model_config.vocab_size
        if min(outputs) < 0 or max(outputs) >= vocab:
            raise ValueError("output token ids must lie in [0, vocabulary size)")
        num_kv_tokens = len(prompt) + len(outputs) - 1
        if num_kv_tokens + 1 > self.max_model_len:
            raise ValueError(f"{num_kv_tokens + 1} tokens exceed max_model_len {self.max_model_len}")
        with self._lock:
            reserved = self._reserved.get(request_id)
            if reserved is None or list(block_ids) != reserved:
                raise ValueError("block_ids must be the blocks reserve_kv_blocks returned for this request")
            if len(reserved) < self.block_manager.num_blocks_for(num_kv_tokens):
                raise ValueError(f"{len(reserved)} blocks cannot hold the KV of {num_kv_tokens} tokens")
            self._claim_id(request_id)
            del self._reserved[request_id]
        seq = Sequence(
            request_id=request_id, token_ids=prompt + outputs, num_prompt_tokens=len(prompt), sampling=sampling,
            arrival_s=0.0, num_computed_tokens=num_kv_tokens, block_ids=list(reserved),
            num_inherited_output_tokens=len(outputs),
            # its KV came over the wire: a faulty transfer must not be served to other requests as a hit
            is_prefix_cacheable=False,
        )
        self._inbox.append(("add_decode", seq))


def _why_not_detachable(seq: Sequence | None, groups: dict) -> str:
    if seq is None:
        return "not decoding on this engine"
    if seq.is_prefill_only:
        return "a prefill-only request"
    if seq.sampling.n > 1 or seq.group_id or seq.request_id in groups:
        return "one of n > 1 samples sharing blocks"
    if seq.status is not SequenceStatus.RUNNING or seq.num_output_tokens < 1 or seq.num_uncomputed_tokens != 1:
        return "not in its decode phase (prefill pending or preempted)"
    return ""

"""Prefill/decode disaggregation entry points of `LLMEngine` (a mixin; the engine's state lives there).

The flow, with a prefill instance P and a decode instance D of the same model (same block size and dtype, so
blocks have the same byte size):

1. D: `blocks = reserve_kv_blocks(rid, num_prompt_tokens)`; D sends `kv_block_global_offsets(blocks)` (and
   `kv_block_num_bytes`) to P, e.g. as `contracts.KVTarget`.
2. P: `add_prefill_request(rid, prompt, sampling)`; `step()` eventually yields an output with
   `is_prefill_done=True`, the first token, and `kv_block_ids` (P's blocks holding the prompt's KV).
3. P writes its blocks into D's: with Mooncake, local addresses `kv_block_data_ptrs(P's blocks)` to D's global
   offsets, `kv_block_num_bytes` each; without it, `read_kv_blocks` on P and `write_kv_blocks` on D.
   Then P calls `release_kv_blocks(rid)`.
4. D: `add_decode_request(rid, prompt, first_token_id, sampling, blocks)`; D's outputs continue the stream from
   the second token (`num_output_tokens` counts the first one too).

Stop strings stay exact across the hand-over: P emits the first token's text minus any tail that could start a
stop string, and D, fed the same first token, holds back the same tail and emits it (or drops it) later.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Sequence as Seq

import torch

from contracts.requests import SamplingParams

from .outputs import EngineOutput
from .sequence import Sequence, SequenceStatus


def _colocated_only(sampling: SamplingParams) -> None:
    if sampling.n > 1:
        raise ValueError("n > 1 is served by colocated instances only (its samples share the prompt's KV blocks)")


class PrefillDecodeMixin:
    # ---- prefill side -------------------------------------------------------------------------------------
    def add_prefill_request(self, request_id: str, prompt_token_ids: Seq[int], sampling: SamplingParams) -> None:
        """Queue a prefill-only request: it computes the prompt's KV and samples the first token, then holds its
        blocks (`EngineOutput.is_prefill_done`, `kv_block_ids`) until `release_kv_blocks(request_id)`."""
        _colocated_only(sampling)
        seq = self._new_sequence(request_id, prompt_token_ids, sampling, is_prefill_only=True)
        self._inbox.append(("add", seq))

    def _hold(self, seq: Sequence, token: int, text: str, logprobs, **extra) -> EngineOutput:
        self._park_held(seq)
        return self._output(seq, (token,), text, logprobs, None, is_prefill_done=True,
                            kv_block_ids=tuple(seq.block_ids), **extra)

    def _park_held(self, seq: Sequence) -> None:
        """Out of the batch, its blocks kept for a transfer (a finished prefill, or a decode that moves)."""
        rid = seq.request_id
        self.scheduler.remove(seq)
        seq.status = SequenceStatus.HELD
        self._held[rid] = seq
        self._seqs.pop(rid, None)
        self._streams.pop(rid, None)
        self.sampler.remove_request(rid)

    def release_kv_blocks(self, request_id: str) -> None:
        """Free a held prefill's blocks (after the transfer) or an unused reservation. Unknown ids are ignored."""
        with self._lock:
            seq = self._held.get(request_id)
            if seq is not None:
                self._finish(seq)
                return
            blocks = self._reserved.pop(request_id, None)
            if blocks:
                self.block_manager.free(blocks)

    # ---- decode side --------------------------------------------------------------------------------------
    def reserve_kv_blocks(self, request_id: str, num_tokens: int) -> tuple[int, ...] | None:
        """Blocks for `num_tokens` tokens of KV that another instance will write, or None when memory is short."""
        if not 1 <= num_tokens < self.max_model_len:
            raise ValueError(f"num_tokens must be in [1, {self.max_model_len})")
        with self._lock:
            with self._ids_lock:
                is_live = request_id in self._live_ids
            if is_live or request_id in self._reserved:
                raise ValueError(f"request {request_id!r} already has KV blocks here")
            blocks = self.block_manager.allocate([], num_tokens)
            if blocks is None:
                return None
            self._reserved[request_id] = blocks
            return tuple(blocks)

    def add_decode_request(
        self,
        request_id: str,
        prompt_token_ids: Seq[int],
        first_token_id: int,
        sampling: SamplingParams,
        block_ids: Seq[int],
    ) -> None:
        """Continue a request whose prompt KV another instance wrote into `block_ids` (as returned by
        `reserve_kv_blocks` for this request) and whose first token it sampled (`migration`'s one-token case)."""
        if not 0 <= int(first_token_id) < self.model_config.vocab_size:
            raise ValueError("first_token_id is outside the vocabulary")
        self.add_migrated_decode(request_id, prompt_token_ids, [int(first_token_id)], sampling, block_ids)

    def _admit_decode(self, seq: Sequence) -> list[EngineOutput]:
        """Start decoding a handed-over (or moved, or reattached) request, or end it here when its last inherited
        token already ends it (max_tokens, a stop token or string, max_model_len): then it never enters the
        scheduler. The inherited tokens were streamed where they were sampled; the text stream is rebuilt from
        them so that it holds back what that instance held back."""
        seq.arrival_s = time.monotonic()
        self._register(seq)
        inherited = seq.token_ids[seq.num_prompt_tokens:]
        last = inherited[-1]
        stream = self._streams[seq.request_id]
        is_stop_token = self._is_stop_token(last, seq.sampling)
        fed = inherited if not is_stop_token else inherited[:-1]  # a stop token's text is never streamed
        if fed:
            stream.stop.push(stream.detokenizer.feed(fed))
        reason = None
        if is_stop_token or stream.stop.is_stopped:
            reason = "stop"
        elif seq.num_output_tokens >= seq.sampling.max_tokens or seq.num_tokens >= self.max_model_len:
            reason = "length"
        if reason is None:
            self.scheduler.add(seq)
            return []
        text = ""
        if reason == "length":
            # the prefill instance held back a tail that might have started a stop string; it ends here, so it
            # is text after all (as on a single instance, which flushes at the last token)
            text = stream.stop.push(stream.detokenizer.flush()) + stream.stop.flush()
            if stream.stop.is_stopped:
                reason = "stop"
        self._finish(seq)
        return [self._output(seq, (), text, None, reason)]

    # ---- KV pages leaving the engine's hands ---------------------------------------------------------------
    def is_kv_exported(self) -> bool:
        """True while blocks of this engine may be written or read by global offset from outside its steps:
        reserved for a decode another instance prefills, or held after a prefill for transfer. Their pages must
        not move (compaction) meanwhile. Ask under `kv_layout_lock`."""
        with self._lock:
            return bool(self._reserved or self._held)

    @contextmanager
    def kv_layout_lock(self):
        """Hold while moving this engine's KV pages between steps: no reservation (whose global offsets would be
        handed out) can be made meanwhile. The step holds it only outside the forward pass."""
        with self._lock:
            yield

    # ---- raw KV access ------------------------------------------------------------------------------------
    def _check_transferable(self, block_ids: Seq[int]) -> list[int]:
        with self._lock:
            allowed = {b for blocks in self._reserved.values() for b in blocks}
            allowed.update(b for seq in self._held.values() for b in seq.block_ids)
        ids = [int(b) for b in block_ids]
        if not set(ids) <= allowed:
            raise ValueError("only blocks of held prefills or of reservations can be read or written")
        return ids

    def kv_block_global_offsets(self, block_ids: Seq[int]) -> tuple[int, ...]:
        """Each block's byte offset in the device's global region (`KVPageSource.kv_page_global_offset`)."""
        return tuple(self.kv_cache.block_global_offset(b) for b in self._check_transferable(block_ids))

    def kv_block_data_ptrs(self, block_ids: Seq[int]) -> tuple[int, ...]:
        """Each block's address in this process (the local side of a Mooncake transfer)."""
        return tuple(self.kv_cache.block_data_ptr(b) for b in self._check_transferable(block_ids))

    def read_kv_blocks(self, block_ids: Seq[int]) -> torch.Tensor:
        """A CPU uint8 copy `[n, kv_block_num_bytes]` of held or reserved blocks."""
        ids = self._check_transferable(block_ids)
        with self._stream_context():
            data = self.kv_cache.read_blocks(ids)
            if self._stream is not None:
                self._stream.synchronize()
        return data

    def write_kv_blocks(self, block_ids: Seq[int], data: torch.Tensor) -> None:
        """Overwrite reserved (or held) blocks with raw bytes as `read_kv_blocks` returns them."""
        ids = self._check_transferable(block_ids)
        with self._stream_context():
            self.kv_cache.write_blocks(ids, data)
            if self._stream is not None:
                self._stream.synchronize()

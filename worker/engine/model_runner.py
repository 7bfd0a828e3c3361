"""Turns a scheduled batch into tensors, runs the model, returns the logits of the requests that sample.

Tokens are laid out decode-first: every request with exactly one new token (a decode step) forms the batched
decode group, then each prefill chunk follows. A request samples when its chunk reaches the end of its known
tokens; a prefill chunk that stops short of that only fills KV.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence as Seq

import torch

from .attention import AttentionBatch, PrefillSpan
from .kv_cache import PagedKVCache
from .model import CausalLM
from .sequence import Sequence


@dataclass
class PreparedBatch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    attention: AttentionBatch
    sample_token_indices: torch.Tensor  # flat token index whose logits are sampled, one per sampling request
    sample_seq_indices: list[int]  # index into the scheduled seqs of each sampling request


class ModelRunner:
    def __init__(self, model: CausalLM, kv_cache: PagedKVCache, *, null_block_id: int, device: torch.device):
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = kv_cache.layout.block_size
        self.dtype = kv_cache.layout.dtype
        num_layers = kv_cache.layout.num_layers
        self._layer_offsets = torch.arange(num_layers, dtype=torch.long)[:, None]  # units of a block's layers
        self._layer_row_offsets = self._layer_offsets * (2 * self.block_size)  # K rows of a token's layers
        self.null_block_id = null_block_id  # a block no request owns: padding rows read and write it
        self.device = device
        self.graphs = None  # a CudaGraphRunner, set by the engine on CUDA

    @torch.inference_mode()
    def execute(self, seqs: Seq[Sequence], num_new_tokens: Seq[int]) -> tuple[list[int], torch.Tensor | None]:
        """Run one step. Returns (indices into `seqs` that sample, their logits [N, vocab] float32)."""
        bucket = None
        if self.graphs is not None and all(n == 1 for n in num_new_tokens):
            num_blocks = max(seq.num_computed_tokens // self.block_size + 1 for seq in seqs)
            bucket = self.graphs.bucket_for(len(seqs), num_blocks)
        prepared = self.prepare(seqs, num_new_tokens, pad_to=bucket)
        if bucket is not None:
            hidden = self.graphs.replay(bucket, prepared)
        else:
            hidden = self.model.forward(prepared.input_ids, prepared.positions, prepared.attention, self.kv_cache)
        if not prepared.sample_seq_indices:
            return [], None
        return prepared.sample_seq_indices, self.model.compute_logits(hidden[prepared.sample_token_indices])

    @torch.inference_mode()
    def dense_logits(self, token_ids: Seq[int]) -> torch.Tensor:
        """Logits [len, vocab] of one sequence from scratch, touching no KV block (canary, verification)."""
        n = len(token_ids)
        ids = torch.tensor(list(token_ids), dtype=torch.long, device=self.device)
        positions = torch.arange(n, dtype=torch.long, device=self.device)
        attention = AttentionBatch(prefills=[PrefillSpan(start=0, num_tokens=n, num_context=0)])
        hidden = self.model.forward(ids, positions, attention, kv_cache=None)
        return self.model.compute_logits(hidden)

    def _units(self, block_ids: list[int]) -> torch.Tensor:
        """[layers, len(block_ids)] unit index of each block in each layer (CPU)."""
        return torch.tensor(self.kv_cache.first_units(block_ids), dtype=torch.long)[None, :] + self._layer_offsets

    def _additive_mask(self, allowed: torch.Tensor) -> torch.Tensor:
        mask = torch.zeros(allowed.shape, dtype=self.dtype)
        return mask.masked_fill_(~allowed, float("-inf")).to(self.device)

    def prepare(
        self, seqs: Seq[Sequence], num_new_tokens: Seq[int], pad_to: tuple[int, int] | None = None
    ) -> PreparedBatch:
        """Tensors for one step. `pad_to` = (batch, blocks): a decode-only batch padded to a captured CUDA graph's
        shape; padding rows read and write only the null block and attend to one position."""
        bs = self.block_size
        decode = [i for i, n in enumerate(num_new_tokens) if n == 1]
        prefill = [i for i, n in enumerate(num_new_tokens) if n != 1]
        input_ids: list[int] = []
        positions: list[int] = []
        write_blocks: list[int] = []
        write_offsets: list[int] = []
        sample_token_indices: list[int] = []
        sample_seq_indices: list[int] = []

        decode_tables: list[list[int]] = []
        decode_kv_lens: list[int] = []
        for i in decode:
            seq = seqs[i]
            pos = seq.num_computed_tokens
            input_ids.append(seq.token_ids[pos])
            positions.append(pos)
            write_blocks.append(seq.block_ids[pos // bs])
            write_offsets.append(pos % bs)
            decode_kv_lens.append(pos + 1)
            decode_tables.append(seq.block_ids[: pos // bs + 1])
            if pos + 1 == seq.num_tokens:
                sample_token_indices.append(len(input_ids) - 1)
                sample_seq_indices.append(i)
        num_blocks = max((len(t) for t in decode_tables), default=0)
        if pad_to is not None:
            num_rows, num_blocks = pad_to
            for _ in range(num_rows - len(decode)):
                input_ids.append(0)
                positions.append(0)
                write_blocks.append(self.null_block_id)
                write_offsets.append(0)
                decode_kv_lens.append(1)
                decode_tables.append([self.null_block_id])

        spans: list[tuple[int, int, int, list[int]]] = []
        for i in prefill:
            seq, n = seqs[i], num_new_tokens[i]
            start_pos = seq.num_computed_tokens
            start = len(input_ids)
            input_ids.extend(seq.token_ids[start_pos : start_pos + n])
            positions.extend(range(start_pos, start_pos + n))
            table = seq.block_ids[: (start_pos + n - 1) // bs + 1]
            write_blocks.extend(table[p // bs] for p in range(start_pos, start_pos + n))
            write_offsets.extend(p % bs for p in range(start_pos, start_pos + n))
            spans.append((start, n, start_pos, table))
            if start_pos + n == seq.num_tokens:
                sample_token_indices.append(len(input_ids) - 1)
                sample_seq_indices.append(i)

        dev = self.device
        attention = AttentionBatch(num_decode=len(decode_tables))
        first_rows = [2 * (u * bs + o) for u, o in zip(self.kv_cache.first_units(write_blocks), write_offsets)]
        k_rows = torch.tensor(first_rows, dtype=torch.long)[None, :] + self._layer_row_offsets  # [layers, T]
        attention.write_rows, attention.write_rows_v = k_rows.to(dev), (k_rows + 1).to(dev)
        if decode:
            padded = [b for t in decode_tables for b in t + [self.null_block_id] * (num_blocks - len(t))]
            attention.decode_units = self._units(padded).to(dev)
            lens = torch.tensor(decode_kv_lens, dtype=torch.long)
            allowed = torch.arange(num_blocks * bs)[None, :] < lens[:, None]
            attention.decode_mask = self._additive_mask(allowed)[:, None, None, :]
        for start, n, start_pos, table in spans:
            span = PrefillSpan(start=start, num_tokens=n, num_context=start_pos)
            if start_pos > 0:
                span.units = self._units(table).to(dev)
                length = start_pos + n
                allowed = torch.arange(length)[None, :] <= torch.arange(start_pos, length)[:, None]
                span.mask = self._additive_mask(allowed)
            attention.prefills.append(span)
        return PreparedBatch(
            input_ids=torch.tensor(input_ids, dtype=torch.long, device=dev),
            positions=torch.tensor(positions, dtype=torch.long, device=dev),
            attention=attention,
            sample_token_indices=torch.tensor(sample_token_indices, dtype=torch.long, device=dev),
            sample_seq_indices=sample_seq_indices,
        )

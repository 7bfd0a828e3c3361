"""Decode steps replayed from captured CUDA graphs (GPU only).

A decode step of a small model is a few hundred short kernels: launching them one by one from Python costs more
than running them. Each graph is captured once per (batch, blocks) bucket over its own static input tensors, on the
engine's CUDA stream, sharing one memory pool (replays never overlap: one engine thread, one stream). A step pads
its decode batch to the smallest bucket that fits (`ModelRunner.prepare(pad_to=...)`: padding rows touch only the
null block), copies its inputs into the graph's tensors and replays. The graph stops at the final hidden states;
the head runs eagerly on the rows that sample, so no graph holds a [batch, vocab] buffer.

Graphs bake in the addresses of weights and KV: a KV page source keeps its views fixed (the `worker.engine.memory`
contract); after `bind_weights` to a new buffer the engine recaptures.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .attention import AttentionBatch

_BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
_MIN_BLOCK_BUCKET = 8


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    input_ids: torch.Tensor
    positions: torch.Tensor
    write_rows: torch.Tensor
    write_rows_v: torch.Tensor
    decode_units: torch.Tensor
    decode_mask: torch.Tensor
    hidden: torch.Tensor  # the output


class CudaGraphRunner:
    def __init__(self, runner, *, max_batch_size: int, max_model_len: int, stream: torch.cuda.Stream) -> None:
        self.runner = runner
        self.stream = stream
        self.batch_buckets = [b for b in _BATCH_BUCKETS if b < max_batch_size] + [max_batch_size]
        max_blocks = -(-max_model_len // runner.block_size)
        buckets, size = [], _MIN_BLOCK_BUCKET
        while size < max_blocks:
            buckets.append(size)
            size *= 2
        self.block_buckets = buckets + [max_blocks]
        self._pool = None
        self._graphs: dict[tuple[int, int], _Graph] = {}
        self.capture_all()

    def bucket_for(self, num_seqs: int, num_blocks: int) -> tuple[int, int] | None:
        batch = next((b for b in self.batch_buckets if b >= num_seqs), None)
        blocks = next((b for b in self.block_buckets if b >= num_blocks), None)
        if batch is None or blocks is None:
            return None
        return batch, blocks

    def capture_all(self) -> None:
        """Capture every bucket, largest first (later, smaller graphs reuse the pool's memory)."""
        self._graphs.clear()
        self._pool = torch.cuda.graph_pool_handle()
        for batch in reversed(self.batch_buckets):
            for blocks in reversed(self.block_buckets):
                self._graphs[(batch, blocks)] = self._capture(batch, blocks)
        self.stream.synchronize()

    def recapture(self) -> None:
        self.capture_all()

    @torch.inference_mode()
    def _capture(self, batch: int, blocks: int) -> _Graph:
        r = self.runner
        device = r.device
        num_layers = r.kv_cache.layout.num_layers
        null_units = torch.tensor(r.kv_cache.first_units([r.null_block_id]), dtype=torch.long)
        null_row = 2 * null_units * r.block_size
        layer_units = null_units + torch.arange(num_layers)[:, None]
        mask = torch.full((batch, 1, 1, blocks * r.block_size), float("-inf"), dtype=r.dtype)
        mask[..., 0] = 0.0
        g = _Graph(
            graph=torch.cuda.CUDAGraph(),
            input_ids=torch.zeros(batch, dtype=torch.long, device=device),
            positions=torch.zeros(batch, dtype=torch.long, device=device),
            write_rows=(null_row + r._layer_row_offsets).expand(num_layers, batch).contiguous().to(device),
            write_rows_v=(null_row + 1 + r._layer_row_offsets).expand(num_layers, batch).contiguous().to(device),
            decode_units=layer_units.expand(num_layers, batch * blocks).contiguous().to(device),
            decode_mask=mask.to(device),
            hidden=torch.empty(0),
        )
        attention = AttentionBatch(num_decode=batch, decode_units=g.decode_units, decode_mask=g.decode_mask,
                                   write_rows=g.write_rows, write_rows_v=g.write_rows_v)

        def body() -> torch.Tensor:
            return r.model.forward(g.input_ids, g.positions, attention, r.kv_cache)

        with torch.cuda.stream(self.stream):
            body()  # warm-up: lazy initialisation (cuBLAS workspaces) must not happen during capture
            self.stream.synchronize()
            with torch.cuda.graph(g.graph, pool=self._pool, stream=self.stream, capture_error_mode="thread_local"):
                g.hidden = body()
        return g

    def replay(self, bucket: tuple[int, int], prepared) -> torch.Tensor:
        """Copy a batch prepared with `pad_to=bucket` into the graph's inputs and replay; returns the hidden
        states [batch, hidden] (valid until the next replay)."""
        g = self._graphs[bucket]
        a = prepared.attention
        g.input_ids.copy_(prepared.input_ids, non_blocking=True)
        g.positions.copy_(prepared.positions, non_blocking=True)
        g.write_rows.copy_(a.write_rows, non_blocking=True)
        g.write_rows_v.copy_(a.write_rows_v, non_blocking=True)
        g.decode_units.copy_(a.decode_units, non_blocking=True)
        g.decode_mask.copy_(a.decode_mask, non_blocking=True)
        g.graph.replay()
        return g.hidden

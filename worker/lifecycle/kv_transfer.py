"""P/D: the prefill instance writes a request's KV blocks into the blocks the decode instance reserved for it.

Both sides address blocks by global offset in their own device's region (`LLMEngine.kv_block_global_offsets`), so
the write is one batch of (local global offset -> remote global offset, block bytes) pieces, adjacent blocks merged.
A decode instance on the same worker is written with a copy inside the page pool.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

from contracts import KVTarget

from .segments import block_pieces


class KVTransferError(RuntimeError):
    """The KV blocks could not be written; the request stays with the prefill instance."""


@dataclass(frozen=True)
class KVWriteReport:
    num_blocks: int
    num_bytes: int
    num_pieces: int
    write_ms: float


def write_kv_blocks(pages: Any, engine: Any, block_ids: Sequence[int], target: KVTarget, transfer: Any | None,
                    *, is_local: bool) -> KVWriteReport:
    """Write the prefill engine's held `block_ids` into `target` (the decode side's reserved blocks, in order)."""
    if target.block_num_bytes != engine.kv_block_num_bytes:
        raise KVTransferError(f"KV blocks are {engine.kv_block_num_bytes} bytes here and {target.block_num_bytes} "
                              "at the decode instance: not the same model or block size")
    local_offsets = engine.kv_block_global_offsets(block_ids)
    try:
        pieces = block_pieces(local_offsets, target.block_offsets_bytes, target.block_num_bytes)
    except ValueError as exc:
        raise KVTransferError(str(exc)) from None
    started = time.perf_counter()
    if is_local:
        for lo, ro, n in pieces:
            pages.global_view(ro, n).copy_(pages.global_view(lo, n))
    else:
        if transfer is None:
            raise KVTransferError(f"no transfer engine here to reach {target.transfer_session}")
        base = pages.global_region.base_address
        try:
            transfer.write(target.transfer_session, [base + lo for lo, _, _ in pieces], [ro for _, ro, _ in pieces],
                           [n for _, _, n in pieces])
        except Exception as exc:  # noqa: BLE001 - the caller decides what happens to the request
            raise KVTransferError(f"KV write to {target.transfer_session} failed: {exc}") from None
    return KVWriteReport(len(local_offsets), sum(n for _, _, n in pieces), len(pieces),
                         (time.perf_counter() - started) * 1e3)

"""Byte-range arithmetic for transfers by global offset. Pure (no torch): the fork and the P/D KV write both reduce
to lists of (local offset, remote offset, length) pieces.

A model's weight region is one byte stream [0, total) laid over one or more contiguous runs of pages (its
*segments*, in order). Source and target of a fork hold the same stream over different runs, so a pull pairs the
two segment lists piece by piece.
"""
from __future__ import annotations

from typing import Sequence

Piece = tuple[int, int, int]  # (local offset, remote offset, num bytes)


def total_bytes(segments: Sequence[tuple[int, int]]) -> int:
    return sum(n for _, n in segments)


def pair_segments(local: Sequence[tuple[int, int]], remote: Sequence[tuple[int, int]]) -> list[Piece]:
    """Pieces that copy the remote stream onto the local one. Both are (offset, num bytes) lists describing
    streams of the same total length; raises ValueError otherwise."""
    if total_bytes(local) != total_bytes(remote):
        raise ValueError(f"the segments hold {total_bytes(local)} bytes here and {total_bytes(remote)} bytes at "
                         "the source: not the same weight layout")
    if any(n <= 0 for _, n in local) or any(n <= 0 for _, n in remote):
        raise ValueError("segments must have positive lengths")
    pieces: list[Piece] = []
    i = j = 0
    used_local = used_remote = 0  # bytes already consumed of local[i] and remote[j]
    while i < len(local) and j < len(remote):
        lo, ln = local[i]
        ro, rn = remote[j]
        n = min(ln - used_local, rn - used_remote)
        pieces.append((lo + used_local, ro + used_remote, n))
        used_local += n
        used_remote += n
        if used_local == ln:
            i, used_local = i + 1, 0
        if used_remote == rn:
            j, used_remote = j + 1, 0
    return pieces


def coalesce(pieces: Sequence[Piece]) -> list[Piece]:
    """Merge neighbours whose local and remote ranges both continue each other (adjacent KV blocks in adjacent
    pages): fewer, longer transfer requests."""
    out: list[Piece] = []
    for lo, ro, n in pieces:
        if out:
            plo, pro, pn = out[-1]
            if plo + pn == lo and pro + pn == ro:
                out[-1] = (plo, pro, pn + n)
                continue
        out.append((lo, ro, n))
    return out


def block_pieces(local_offsets: Sequence[int], remote_offsets: Sequence[int], block_num_bytes: int) -> list[Piece]:
    """One piece per KV block (local block i to remote block i), coalesced."""
    if len(local_offsets) > len(remote_offsets):
        raise ValueError(f"{len(local_offsets)} KV blocks to write but only {len(remote_offsets)} reserved")
    if block_num_bytes <= 0:
        raise ValueError("block_num_bytes must be > 0")
    return coalesce([(lo, ro, block_num_bytes) for lo, ro in zip(local_offsets, remote_offsets)])


def chunk_ranges(num_bytes: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """[start, end) chunks covering [0, num_bytes)."""
    if chunk_bytes <= 0:
        raise ValueError("chunk_bytes must be > 0")
    return [(start, min(num_bytes, start + chunk_bytes)) for start in range(0, num_bytes, chunk_bytes)]

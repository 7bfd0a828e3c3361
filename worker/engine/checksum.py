"""One fingerprint of raw bytes for every copy of a model's weights: host memory, device pages, a peer's pages.

`bytes_checksum(data)` gives the same 32-hex-digit value for the same bytes on any device, so a pinned host copy, a
device copy and a replica's pages can be compared directly. It is fast on a CPU (numpy, ~4 GB/s a core here: faster
than zlib's CRC-32) and runs on the device without copying the weights out (torch int64 ops).

The function ("w64"): the bytes, zero-padded to a multiple of 8, are little-endian 64-bit words w_i. With rows of
K = 2**14 words (i = j*K + k), a fixed table T of K odd 64-bit multipliers and an odd constant C:

    plain    = sum_i w_i                      + num_bytes * L     (mod 2**64)
    weighted = sum_i w_i * (T[k] + j * C)                          (mod 2**64)

Sums mod 2**64 do not depend on the reduction order, so any device and any chunking agree bit for bit. The plain
sum catches any change of one word, the weighted one changes in word order (within a row through T, between rows,
e.g. two swapped 2 MiB pages, through j * C). It is a corruption check (a bad page, a short copy), not a MAC.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

WORDS_PER_ROW = 1 << 14
_ROWS_PER_CHUNK = 64  # 8 MiB of words per pass: bounded temporaries, large enough to run at memory speed
_MASK = (1 << 64) - 1
_ROW_MULTIPLIER = 0x9E3779B97F4A7C15
_LENGTH_MULTIPLIER = 0x2545F4914F6CDD1D


def _splitmix64_table(num: int) -> np.ndarray:
    """A fixed table of odd 64-bit constants (splitmix64 of 1..num): the same on every machine and version."""
    with np.errstate(over="ignore"):
        z = (np.arange(1, num + 1, dtype=np.uint64) * np.uint64(_ROW_MULTIPLIER))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return z | np.uint64(1)


_TABLE = _splitmix64_table(WORDS_PER_ROW)
_device_tables: dict[torch.device, torch.Tensor] = {}


def bytes_checksum(data: torch.Tensor) -> str:
    """The "w64" fingerprint of a 1-D uint8 tensor on any device (module docstring), as 32 hex digits."""
    if data.dtype != torch.uint8 or data.dim() != 1:
        raise ValueError("checksum needs a 1-D uint8 tensor")
    if data.device.type == "cpu":
        plain, weighted = _host_sums(data.contiguous().numpy())
    else:
        plain, weighted = _device_sums(data)
    plain = (plain + data.numel() * _LENGTH_MULTIPLIER) & _MASK
    return f"{plain:016x}{weighted:016x}"


def segment_checksums(buffer: torch.Tensor, segment_num_bytes: Sequence[int]) -> list[str]:
    """One checksum per consecutive segment of `buffer` (e.g. the weight region's contiguous page runs, in order)."""
    sums, start = [], 0
    for num_bytes in segment_num_bytes:
        if num_bytes <= 0 or start + num_bytes > buffer.numel():
            raise ValueError("segments must be positive and lie inside the buffer")
        sums.append(bytes_checksum(buffer[start : start + num_bytes]))
        start += num_bytes
    return sums


def _host_sums(data: np.ndarray) -> tuple[int, int]:
    """(sum of words, weighted sum) mod 2**64 with numpy's unsigned arithmetic (wraps by definition)."""
    row_bytes = 8 * WORDS_PER_ROW
    num_full_rows = data.size // row_bytes
    plain = weighted = 0
    chunk_rows = _ROWS_PER_CHUNK
    with np.errstate(over="ignore"):
        for first_row in range(0, num_full_rows, chunk_rows):
            rows = min(chunk_rows, num_full_rows - first_row)
            words = data[first_row * row_bytes : (first_row + rows) * row_bytes].view("<u8").reshape(rows, -1)
            row_sums = words.sum(axis=1, dtype=np.uint64)
            row_index = np.arange(first_row, first_row + rows, dtype=np.uint64)
            plain += int(row_sums.sum(dtype=np.uint64))
            weighted += int((words @ _TABLE).sum(dtype=np.uint64))
            weighted += _ROW_MULTIPLIER * int((row_index * row_sums).sum(dtype=np.uint64))
        tail = data[num_full_rows * row_bytes :]
        if tail.size:
            padded = np.zeros(-(-tail.size // 8) * 8, dtype=np.uint8)
            padded[: tail.size] = tail
            words = padded.view("<u8")
            row_sum = int(words.sum(dtype=np.uint64))
            plain += row_sum
            weighted += int((words * _TABLE[: words.size]).sum(dtype=np.uint64))
            weighted += _ROW_MULTIPLIER * num_full_rows * row_sum
    return plain & _MASK, weighted & _MASK


def _device_sums(data: torch.Tensor) -> tuple[int, int]:
    """The same sums with torch int64 ops where the bytes are (two's complement wraps like unsigned arithmetic);
    only two integers per chunk leave the device."""
    table = _device_tables.get(data.device)
    if table is None:
        table = torch.from_numpy(_TABLE.view(np.int64).copy()).to(data.device)
        _device_tables[data.device] = table
    row_bytes = 8 * WORDS_PER_ROW
    num_full_rows = data.numel() // row_bytes
    plain = weighted = 0
    for first_row in range(0, num_full_rows, _ROWS_PER_CHUNK):
        rows = min(_ROWS_PER_CHUNK, num_full_rows - first_row)
        words = _as_words(data[first_row * row_bytes : (first_row + rows) * row_bytes]).view(rows, -1)
        row_sums = words.sum(dim=1)
        row_index = torch.arange(first_row, first_row + rows, dtype=torch.int64, device=data.device)
        plain += int(row_sums.sum())
        weighted += int((words * table).sum())
        weighted += _ROW_MULTIPLIER * (int((row_index * row_sums).sum()) & _MASK)
    tail = data[num_full_rows * row_bytes :]
    if tail.numel():
        padded = torch.zeros(-(-tail.numel() // 8) * 8, dtype=torch.uint8, device=data.device)
        padded[: tail.numel()] = tail
        words = padded.view(torch.int64)
        row_sum = int(words.sum()) & _MASK
        plain += row_sum
        weighted += int((words * table[: words.numel()]).sum())
        weighted += _ROW_MULTIPLIER * num_full_rows * row_sum
    return plain & _MASK, weighted & _MASK


def _as_words(chunk: torch.Tensor) -> torch.Tensor:
    # a dtype view needs an 8-byte aligned start; a segment that starts elsewhere is copied (rare: pages align)
    if chunk.storage_offset() % 8 or not chunk.is_contiguous():
        chunk = chunk.clone()
    return chunk.view(torch.int64)

"""Per-segment weight checksums, tagged with their algorithm ("crc32:..." or "sum:..."), so a verifier always
recomputes with the reference's algorithm.

Host memory (the CPU backend, or a pinned host copy) uses CRC-32 over the bytes in place (zlib, GIL released, about
1 GB/s per core here); device memory uses the engine's position-weighted sum (`worker.engine.weights.bytes_checksum`),
which runs on the device without copying the weights out (it is ~12 MB/s on a CPU, far too slow there).
"""
from __future__ import annotations

import zlib
from typing import Sequence

import torch

CRC32, SUM = "crc32", "sum"
_HOST_CHUNK_BYTES = 256 << 20  # copies a device tensor out in pieces when crc32 must run on device bytes


def algorithm_for(buffer: torch.Tensor) -> str:
    return CRC32 if buffer.device.type == "cpu" else SUM


def algorithm_of(checksum: str) -> str:
    name, sep, _ = checksum.partition(":")
    if not sep or name not in (CRC32, SUM):
        raise ValueError(f"checksum {checksum!r} does not name its algorithm (crc32: or sum:)")
    return name


def checksum(data: torch.Tensor, algorithm: str) -> str:
    """The tagged checksum of a 1-D uint8 tensor."""
    if data.dtype != torch.uint8 or data.dim() != 1:
        raise ValueError("checksums are over 1-D uint8 tensors")
    if algorithm == SUM:
        from worker.engine.weights import bytes_checksum

        return f"{SUM}:{bytes_checksum(data)}"
    if algorithm != CRC32:
        raise ValueError(f"unknown checksum algorithm {algorithm!r}")
    value = 0
    for start in range(0, data.numel(), _HOST_CHUNK_BYTES):
        piece = data[start:start + _HOST_CHUNK_BYTES]
        host = piece if piece.device.type == "cpu" else piece.cpu()
        value = zlib.crc32(memoryview(host.contiguous().numpy()), value)
    return f"{CRC32}:{value:08x}"


def segment_checksums(buffer: torch.Tensor, lengths: Sequence[int], algorithm: str | None = None) -> list[str]:
    """One checksum per consecutive byte range of `buffer` (the weight stream's segments, in order)."""
    algorithm = algorithm or algorithm_for(buffer)
    out, start = [], 0
    for n in lengths:
        if n <= 0 or start + n > buffer.numel():
            raise ValueError("segments must be positive and lie inside the buffer")
        out.append(checksum(buffer[start:start + n], algorithm))
        start += n
    return out

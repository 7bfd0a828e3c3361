"""Per-segment weight checksums, tagged with their algorithm ("w64:..."), so that a verifier meeting a checksum from a
peer running another version says so instead of reporting a mismatch.

There is one algorithm for host and device memory alike: the engine's `bytes_checksum` (worker/engine/checksum.py),
the same value for the same bytes on any device, ~4 GB/s a core on a CPU (numpy) and computed on the device without
copying the weights out. So a pinned host copy, fresh device pages and a peer's pages compare directly.
"""
from __future__ import annotations

from typing import Sequence

import torch

from worker.engine.checksum import bytes_checksum

W64 = "w64"
ALGORITHMS = (W64,)


def algorithm_of(checksum: str) -> str:
    name, sep, _ = checksum.partition(":")
    if not sep or name not in ALGORITHMS:
        raise ValueError(f"checksum {checksum!r} does not name a known algorithm ({', '.join(ALGORITHMS)})")
    return name


def checksum(data: torch.Tensor, algorithm: str = W64) -> str:
    """The tagged checksum of a 1-D uint8 tensor (host or device)."""
    if data.dtype != torch.uint8 or data.dim() != 1:
        raise ValueError("checksums are over 1-D uint8 tensors")
    if algorithm != W64:
        raise ValueError(f"unknown checksum algorithm {algorithm!r}")
    return f"{W64}:{bytes_checksum(data)}"


def segment_checksums(buffer: torch.Tensor, lengths: Sequence[int], algorithm: str | None = None) -> list[str]:
    """One checksum per consecutive byte range of `buffer` (the weight stream's segments, in order)."""
    algorithm = algorithm or W64
    out, start = [], 0
    for n in lengths:
        if n <= 0 or start + n > buffer.numel():
            raise ValueError("segments must be positive and lie inside the buffer")
        out.append(checksum(buffer[start:start + n], algorithm))
        start += n
    return out

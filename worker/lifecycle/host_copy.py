"""The Warm state's weights: one pinned host buffer per instance, filled from the device (Active -> Warm) and copied
back into freshly mapped device pages (Warm -> Active) in large overlapped chunks.

On CUDA the buffer is page-locked (what makes a host -> device copy asynchronous and full speed) and each chunk goes
on the next of a few streams, so one chunk's launch and completion overlap the next one's transfer. On the CPU
backend "device" pages are host memory: the chunks are copied by a few threads at once (torch releases the GIL in
`copy_`), which is what overlapping means without a DMA engine.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from .segments import chunk_ranges

DEFAULT_CHUNK_BYTES = 64 << 20
DEFAULT_NUM_LANES = 2  # CUDA streams, or CPU copy threads


@dataclass(frozen=True)
class CopyReport:
    num_bytes: int
    copy_ms: float

    @property
    def gbps(self) -> float:
        """Decimal GB/s."""
        return self.num_bytes / (self.copy_ms * 1e6) if self.copy_ms > 0 else float("inf")


def chunked_copy(dst: torch.Tensor, src: torch.Tensor, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 num_lanes: int = DEFAULT_NUM_LANES) -> CopyReport:
    """dst[:] = src[:] for two 1-D uint8 tensors of one length, in chunks spread over `num_lanes` streams (CUDA)
    or threads (CPU). Returns when every byte has landed."""
    if dst.dtype != torch.uint8 or src.dtype != torch.uint8 or dst.dim() != 1 or src.dim() != 1:
        raise ValueError("chunked_copy takes 1-D uint8 tensors")
    if dst.numel() != src.numel():
        raise ValueError(f"cannot copy {src.numel()} bytes into {dst.numel()}")
    if num_lanes < 1:
        raise ValueError("num_lanes must be >= 1")
    chunks = chunk_ranges(src.numel(), chunk_bytes)
    started = time.perf_counter()
    cuda_device = dst.device if dst.is_cuda else (src.device if src.is_cuda else None)
    if cuda_device is not None:
        _copy_on_streams(dst, src, chunks, num_lanes, cuda_device)
    elif num_lanes == 1 or len(chunks) == 1:
        for a, b in chunks:
            dst[a:b].copy_(src[a:b])
    else:
        with ThreadPoolExecutor(max_workers=num_lanes, thread_name_prefix="janus-copy") as pool:
            list(pool.map(lambda ab: dst[ab[0]:ab[1]].copy_(src[ab[0]:ab[1]]), chunks))
    return CopyReport(src.numel(), (time.perf_counter() - started) * 1e3)


def _copy_on_streams(dst: torch.Tensor, src: torch.Tensor, chunks: list[tuple[int, int]], num_lanes: int,
                     device: torch.device) -> None:
    current = torch.cuda.current_stream(device)
    streams = [torch.cuda.Stream(device) for _ in range(num_lanes)]
    for stream in streams:
        stream.wait_stream(current)  # whatever wrote the source (or mapped the pages) comes first
    for k, (a, b) in enumerate(chunks):
        with torch.cuda.stream(streams[k % num_lanes]):
            dst[a:b].copy_(src[a:b], non_blocking=True)
    for stream in streams:
        stream.synchronize()


class HostWeights:
    """A pinned host copy of one instance's weight buffer (the same bytes, so the engine's layout applies)."""

    def __init__(self, buffer: torch.Tensor) -> None:
        self.buffer = buffer

    @classmethod
    def allocate(cls, num_bytes: int, *, pin: bool) -> "HostWeights":
        """`pin`: page-locked (needs CUDA; what a device restore wants). The CPU backend needs no pinning."""
        if num_bytes <= 0:
            raise ValueError("num_bytes must be > 0")
        return cls(torch.empty(num_bytes, dtype=torch.uint8, pin_memory=pin))

    @property
    def num_bytes(self) -> int:
        return self.buffer.numel()

    @property
    def data_ptr(self) -> int:
        return self.buffer.data_ptr()

    def snapshot_from(self, device_buffer: torch.Tensor, **copy_options) -> CopyReport:
        """Device -> host: keep the weights while their pages go back to the pool."""
        return chunked_copy(self.buffer, _flat(device_buffer, self.num_bytes), **copy_options)

    def restore_into(self, device_buffer: torch.Tensor, **copy_options) -> CopyReport:
        """Host -> device, into freshly mapped pages under the engine's weight view."""
        return chunked_copy(_flat(device_buffer, self.num_bytes), self.buffer, **copy_options)


def _flat(buffer: torch.Tensor, num_bytes: int) -> torch.Tensor:
    if buffer.dtype != torch.uint8 or buffer.dim() != 1 or buffer.numel() < num_bytes:
        raise ValueError(f"expected a 1-D uint8 buffer of at least {num_bytes} bytes")
    return buffer[:num_bytes]

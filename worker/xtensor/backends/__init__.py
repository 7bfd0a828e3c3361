"""Device backends behind one interface; `open_backend` picks one from the worker's device string."""
from __future__ import annotations

from .base import (DEFAULT_PAGE_SIZE_BYTES, BackendError, BackendUnavailableError, DeviceSpec, PageBackend,
                   parse_device)


def open_backend(device: str, num_pages: int, page_size_bytes: int = DEFAULT_PAGE_SIZE_BYTES) -> PageBackend:
    """Open the physical pool of `device` ("cpu", "cuda:N", "npu:N") with num_pages pages.

    Raises BackendUnavailableError when the device's driver stack is missing here (no GPU: cuInit fails; no
    torch_npu), ValueError for a malformed device string or sizes."""
    spec = parse_device(device)
    if spec.kind == "cpu":
        from .cpu import CpuBackend

        return CpuBackend.open(num_pages, page_size_bytes)
    if spec.kind == "cuda":
        from .cuda import CudaBackend

        return CudaBackend.open(spec.index, num_pages, page_size_bytes)
    from .npu import NpuBackend

    return NpuBackend.open(spec.index, num_pages, page_size_bytes)


def best_available_device() -> str:
    """"cuda:0" where the CUDA driver initialises, else "cpu": the fallback a GPU-less host (CI) takes."""
    from .cuda import cuda_unavailable_reason

    return "cuda:0" if cuda_unavailable_reason(0) is None else "cpu"


__all__ = ["DEFAULT_PAGE_SIZE_BYTES", "BackendError", "BackendUnavailableError", "DeviceSpec", "PageBackend",
           "best_available_device", "open_backend", "parse_device"]

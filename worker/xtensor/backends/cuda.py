"""CUDA backend: physical pages are cuMemCreate allocations, mapped with cuMemMap + cuMemSetAccess (cuda-bindings).

Every page's physical handle is created when the pool opens (cuMemCreate costs ~14 us on an H200; it never sits on
a request's path) and mapped once into the global region, which stays mapped for the pool's life. A map into an
owner's view is then cuMemMap of a prepared handle plus cuMemSetAccess; an unmap is cuMemUnmap per page (the driver
cannot unmap part of a mapping, so pages are mapped and unmapped one handle at a time). Freed pages stay in the pool
as device memory of this process (that is the pool's purpose); `close()` releases them all.

Written from the CUDA driver API documentation; this repository's CI machine has no GPU, so it runs only on a GPU
host (tests marked `gpu`). The context is the device's primary context, the one torch uses.
"""
from __future__ import annotations

import threading
from typing import Any

import torch

from .base import DEFAULT_PAGE_SIZE_BYTES, BackendError, BackendUnavailableError, DeviceSpec


def _driver() -> Any:
    from cuda.bindings import driver  # imported lazily: cuda-bindings is optional on CPU hosts

    return driver


def checked(result: tuple, call: str) -> Any:
    """cuda-bindings returns (CUresult, *values); raise on an error, return the value(s)."""
    cu = _driver()
    err = result[0]
    if err != cu.CUresult.CUDA_SUCCESS:
        name_err, name = cu.cuGetErrorName(err)
        label = name.decode() if name_err == cu.CUresult.CUDA_SUCCESS and name else str(err)
        raise BackendError(f"{call} failed: {label}")
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


def cuda_unavailable_reason(index: int = 0) -> str | None:
    """None when CUDA device `index` can be driven here, else why not (cuInit raises on hosts without a driver)."""
    try:
        cu = _driver()
    except ImportError as exc:
        return f"cuda-bindings is not installed ({exc}); pip install cuda-bindings"
    try:
        (err,) = cu.cuInit(0)
    except Exception as exc:  # no libcuda: cuda-bindings raises from its loader, not a CUresult
        return f"cuInit failed: {exc}"
    if err != cu.CUresult.CUDA_SUCCESS:
        return f"cuInit returned {err}"
    err, count = cu.cuDeviceGetCount()
    if err != cu.CUresult.CUDA_SUCCESS or count <= index:
        return f"CUDA device {index} not present ({count if err == cu.CUresult.CUDA_SUCCESS else err} devices)"
    return None


class _CudaArray:
    """The minimal __cuda_array_interface__ (v3) torch.as_tensor needs to wrap device memory without a copy."""

    def __init__(self, address: int, num_bytes: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (num_bytes,),
            "typestr": "|u1",
            "data": (address, False),
            "version": 3,
            "strides": None,
            "stream": None,
        }


class CudaBackend:
    """Device pages of one CUDA device. Build with `CudaBackend.open(index, num_pages, page_size_bytes)`."""

    def __init__(self, index: int, device_handle: Any, context: Any, prop: Any, access: Any, handles: list,
                 num_pages: int, page_size_bytes: int, global_base_address: int) -> None:
        self.device = DeviceSpec("cuda", index)
        self._device_handle = device_handle
        self.num_pages = num_pages
        self.page_size_bytes = page_size_bytes
        self.global_base_address = global_base_address
        self._context = context
        self.allocation_prop = prop  # what cuMemCreate is given (benchmarks create raw pages with it)
        self.access_desc = access
        self._access = access
        self._handles = handles
        self._reservations: dict[int, int] = {}
        self._lock = threading.Lock()
        self._thread_state = threading.local()
        self._is_closed = False

    @classmethod
    def open(cls, index: int, num_pages: int, page_size_bytes: int = DEFAULT_PAGE_SIZE_BYTES) -> "CudaBackend":
        reason = cuda_unavailable_reason(index)
        if reason is not None:
            raise BackendUnavailableError(f"CUDA backend unavailable for cuda:{index}: {reason}")
        if num_pages <= 0:
            raise ValueError(f"num_pages must be > 0, got {num_pages}")
        cu = _driver()
        device = checked(cu.cuDeviceGet(index), "cuDeviceGet")
        context = checked(cu.cuDevicePrimaryCtxRetain(device), "cuDevicePrimaryCtxRetain")
        checked(cu.cuCtxSetCurrent(context), "cuCtxSetCurrent")

        prop = cu.CUmemAllocationProp()
        prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = index
        rdma_attr = cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED
        if checked(cu.cuDeviceGetAttribute(rdma_attr, device), "cuDeviceGetAttribute"):
            prop.allocFlags.gpuDirectRDMACapable = 1  # so the transfer engine can register the region for RDMA
        granularity = checked(
            cu.cuMemGetAllocationGranularity(prop,
                                             cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            "cuMemGetAllocationGranularity")
        if page_size_bytes <= 0 or page_size_bytes % granularity:
            raise ValueError(f"page_size_bytes={page_size_bytes} must be a multiple of the granularity {granularity}")

        access = cu.CUmemAccessDesc()
        access.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        access.location.id = index
        access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE

        handles: list = []
        total_bytes = num_pages * page_size_bytes
        base = None
        try:
            for _ in range(num_pages):  # every physical page prepared here, off any request's path
                handles.append(checked(cu.cuMemCreate(page_size_bytes, prop, 0), "cuMemCreate"))
            base = int(checked(cu.cuMemAddressReserve(total_bytes, page_size_bytes, 0, 0), "cuMemAddressReserve"))
            for page_id, handle in enumerate(handles):
                checked(cu.cuMemMap(base + page_id * page_size_bytes, page_size_bytes, 0, handle, 0), "cuMemMap")
            checked(cu.cuMemSetAccess(base, total_bytes, [access], 1), "cuMemSetAccess")
        except BaseException:
            if base is not None:
                for page_id in range(len(handles)):
                    cu.cuMemUnmap(base + page_id * page_size_bytes, page_size_bytes)
                cu.cuMemAddressFree(base, total_bytes)
            for handle in handles:
                cu.cuMemRelease(handle)
            cu.cuDevicePrimaryCtxRelease(device)
            raise
        return cls(index, device, context, prop, access, handles, num_pages, page_size_bytes, base)

    def _ensure_context(self) -> None:
        # The refill thread calls in too; each thread needs the primary context current once.
        if not getattr(self._thread_state, "is_current", False):
            checked(_driver().cuCtxSetCurrent(self._context), "cuCtxSetCurrent")
            self._thread_state.is_current = True

    def reserve(self, num_pages: int) -> int:
        self._ensure_context()
        num_bytes = num_pages * self.page_size_bytes
        base = int(checked(_driver().cuMemAddressReserve(num_bytes, self.page_size_bytes, 0, 0), "cuMemAddressReserve"))
        with self._lock:
            self._reservations[base] = num_bytes
        return base

    def free_reservation(self, base_address: int, num_pages: int) -> None:
        self._ensure_context()
        with self._lock:
            num_bytes = self._reservations.pop(base_address, None)
        if num_bytes is None:
            raise BackendError(f"no reservation at {base_address:#x}")
        checked(_driver().cuMemAddressFree(base_address, num_bytes), "cuMemAddressFree")

    def map_pages(self, address: int, first_page_id: int, num_pages: int, *, is_populate: bool) -> None:
        del is_populate  # device pages are backed at cuMemCreate; nothing to fault in
        self._ensure_context()
        cu, page = _driver(), self.page_size_bytes
        for i in range(num_pages):
            checked(cu.cuMemMap(address + i * page, page, 0, self._handles[first_page_id + i], 0), "cuMemMap")
        checked(cu.cuMemSetAccess(address, num_pages * page, [self._access], 1), "cuMemSetAccess")

    def unmap_pages(self, address: int, num_pages: int) -> None:
        self._ensure_context()
        cu, page = _driver(), self.page_size_bytes
        for i in range(num_pages):
            checked(cu.cuMemUnmap(address + i * page, page), "cuMemUnmap")

    def remap_pages(self, address: int, first_page_id: int, num_pages: int) -> None:
        # The driver cannot map over a mapping: unmap, then map. The caller guarantees no kernel touches the range.
        self.unmap_pages(address, num_pages)
        self.map_pages(address, first_page_id, num_pages, is_populate=False)

    def copy_pages(self, dst_page_id: int, src_page_id: int, num_pages: int) -> None:
        self._ensure_context()
        cu, page, base = _driver(), self.page_size_bytes, self.global_base_address
        checked(cu.cuCtxSynchronize(), "cuCtxSynchronize")  # kernels still reading or writing the source finish
        checked(cu.cuMemcpyDtoD(base + dst_page_id * page, base + src_page_id * page, num_pages * page), "cuMemcpyDtoD")
        checked(cu.cuCtxSynchronize(), "cuCtxSynchronize")

    def discard_pages(self, first_page_id: int, num_pages: int) -> None:
        """Device pages stay allocated to the pool (they are the pool); nothing to return per page."""

    def tensor(self, address: int, num_bytes: int) -> torch.Tensor:
        return torch.as_tensor(_CudaArray(address, num_bytes), device=torch.device("cuda", self.device.index))

    def close(self) -> None:
        if self._is_closed:
            return
        self._is_closed = True
        self._ensure_context()
        cu, page = _driver(), self.page_size_bytes
        torch.cuda.synchronize(self.device.index)  # no kernel may still read a page we release
        with self._lock:
            reservations, self._reservations = self._reservations, {}
        for base, num_bytes in reservations.items():
            for i in range(num_bytes // page):
                cu.cuMemUnmap(base + i * page, page)  # pages an owner left mapped; errors on unmapped ones are expected
            cu.cuMemAddressFree(base, num_bytes)
        for page_id in range(self.num_pages):
            cu.cuMemUnmap(self.global_base_address + page_id * page, page)
        cu.cuMemAddressFree(self.global_base_address, self.num_pages * page)
        for handle in self._handles:
            cu.cuMemRelease(handle)
        cu.cuDevicePrimaryCtxRelease(self._device_handle)

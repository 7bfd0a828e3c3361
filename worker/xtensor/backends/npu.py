"""NPU (Ascend) backend: the ACL virtual-memory calls (aclrtMallocPhysical / aclrtReserveMemAddress / aclrtMapMem /
aclrtUnmapMem / aclrtFreePhysical), reached through ctypes in the libascendcl that torch_npu loads.

Only usable where `import torch_npu` works (an Ascend host with CANN); anywhere else `open` raises
BackendUnavailableError naming what is missing. torch_npu is never installed by this project: on hosts without CANN
it breaks `import torch` unless TORCH_DEVICE_BACKEND_AUTOLOAD=0. Written from the CANN runtime documentation and
never run here (no Ascend device on the development machine).
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any

import torch

from .base import DEFAULT_PAGE_SIZE_BYTES, BackendError, BackendUnavailableError, DeviceSpec

_ACL_MEM_HANDLE_TYPE_NONE = 0
_ACL_MEM_ALLOCATION_TYPE_PINNED = 0
_ACL_HBM_MEM_HUGE = 4  # 2 MiB granularity, matching the default page
_ACL_MEM_LOCATION_TYPE_DEVICE = 1
_ACL_MEMCPY_DEVICE_TO_DEVICE = 3


class _MemLocation(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint32), ("type", ctypes.c_int)]


class _PhysicalMemProp(ctypes.Structure):
    _fields_ = [("handleType", ctypes.c_int), ("allocationType", ctypes.c_int), ("memAttr", ctypes.c_int),
                ("location", _MemLocation), ("reserve", ctypes.c_uint64)]


def _import_torch_npu() -> Any:
    try:
        import torch_npu  # noqa: F401  (registers the "npu" device with torch)
    except Exception as exc:  # ImportError, or CANN libraries missing underneath it
        raise BackendUnavailableError(
            "NPU backend needs torch_npu (Ascend's PyTorch adapter, matching this torch) and the CANN toolkit it "
            f"loads (libascendcl.so); `import torch_npu` failed: {exc!r}") from exc
    return torch_npu


class NpuBackend:
    """Device pages of one Ascend NPU. Build with `NpuBackend.open(index, num_pages, page_size_bytes)`."""

    def __init__(self, index: int, acl: ctypes.CDLL, handles: list[ctypes.c_void_p], num_pages: int,
                 page_size_bytes: int, global_base_address: int) -> None:
        self.device = DeviceSpec("npu", index)
        self.num_pages = num_pages
        self.page_size_bytes = page_size_bytes
        self.global_base_address = global_base_address
        self._acl = acl
        self._handles = handles
        self._reservations: dict[int, int] = {}
        self._lock = threading.Lock()
        self._thread_state = threading.local()
        self._is_closed = False

    @classmethod
    def open(cls, index: int, num_pages: int, page_size_bytes: int = DEFAULT_PAGE_SIZE_BYTES) -> "NpuBackend":
        torch_npu = _import_torch_npu()
        if num_pages <= 0:
            raise ValueError(f"num_pages must be > 0, got {num_pages}")
        torch_npu.npu.set_device(index)
        try:
            acl = ctypes.CDLL("libascendcl.so")
        except OSError as exc:
            raise BackendUnavailableError(f"NPU backend: libascendcl.so not loadable ({exc})") from exc
        prop = _PhysicalMemProp(_ACL_MEM_HANDLE_TYPE_NONE, _ACL_MEM_ALLOCATION_TYPE_PINNED, _ACL_HBM_MEM_HUGE,
                                _MemLocation(index, _ACL_MEM_LOCATION_TYPE_DEVICE), 0)
        handles: list[ctypes.c_void_p] = []
        for _ in range(num_pages):
            handle = ctypes.c_void_p()
            _acl_check(acl.aclrtMallocPhysical(ctypes.byref(handle), ctypes.c_size_t(page_size_bytes),
                                               ctypes.byref(prop), ctypes.c_uint64(0)), "aclrtMallocPhysical")
            handles.append(handle)
        base = _reserve(acl, num_pages * page_size_bytes)
        for page_id, handle in enumerate(handles):
            _acl_check(acl.aclrtMapMem(ctypes.c_void_p(base + page_id * page_size_bytes),
                                       ctypes.c_size_t(page_size_bytes), ctypes.c_size_t(0), handle,
                                       ctypes.c_uint64(0)), "aclrtMapMem")
        return cls(index, acl, handles, num_pages, page_size_bytes, base)

    def _ensure_context(self) -> None:
        if not getattr(self._thread_state, "is_current", False):
            _import_torch_npu().npu.set_device(self.device.index)
            self._thread_state.is_current = True

    def reserve(self, num_pages: int) -> int:
        self._ensure_context()
        num_bytes = num_pages * self.page_size_bytes
        base = _reserve(self._acl, num_bytes)
        with self._lock:
            self._reservations[base] = num_bytes
        return base

    def free_reservation(self, base_address: int, num_pages: int) -> None:
        self._ensure_context()
        with self._lock:
            if self._reservations.pop(base_address, None) is None:
                raise BackendError(f"no reservation at {base_address:#x}")
        _acl_check(self._acl.aclrtReleaseMemAddress(ctypes.c_void_p(base_address)), "aclrtReleaseMemAddress")

    def map_pages(self, address: int, first_page_id: int, num_pages: int, *, is_populate: bool) -> None:
        del is_populate
        self._ensure_context()
        page = self.page_size_bytes
        for i in range(num_pages):
            _acl_check(self._acl.aclrtMapMem(ctypes.c_void_p(address + i * page), ctypes.c_size_t(page),
                                             ctypes.c_size_t(0), self._handles[first_page_id + i],
                                             ctypes.c_uint64(0)), "aclrtMapMem")

    def unmap_pages(self, address: int, num_pages: int) -> None:
        self._ensure_context()
        for i in range(num_pages):
            _acl_check(self._acl.aclrtUnmapMem(ctypes.c_void_p(address + i * self.page_size_bytes)), "aclrtUnmapMem")

    def remap_pages(self, address: int, first_page_id: int, num_pages: int) -> None:
        self.unmap_pages(address, num_pages)
        self.map_pages(address, first_page_id, num_pages, is_populate=False)

    def copy_pages(self, dst_page_id: int, src_page_id: int, num_pages: int) -> None:
        self._ensure_context()
        page, base = self.page_size_bytes, self.global_base_address
        num_bytes = ctypes.c_size_t(num_pages * page)
        _acl_check(self._acl.aclrtSynchronizeDevice(), "aclrtSynchronizeDevice")
        _acl_check(self._acl.aclrtMemcpy(ctypes.c_void_p(base + dst_page_id * page), num_bytes,
                                         ctypes.c_void_p(base + src_page_id * page), num_bytes,
                                         _ACL_MEMCPY_DEVICE_TO_DEVICE), "aclrtMemcpy")

    def discard_pages(self, first_page_id: int, num_pages: int) -> None:
        """Device pages stay allocated to the pool; nothing to return per page."""

    def tensor(self, address: int, num_bytes: int) -> torch.Tensor:
        # torch has no public "wrap this device pointer" for PrivateUse1 devices; this private constructor builds a
        # non-owning storage on any registered device.
        device = torch.device("npu", self.device.index)
        storage = torch._C._construct_storage_from_data_pointer(address, device, num_bytes)
        return torch.empty(0, dtype=torch.uint8, device=device).set_(storage)

    def close(self) -> None:
        if self._is_closed:
            return
        self._is_closed = True
        self._ensure_context()
        with self._lock:
            reservations, self._reservations = self._reservations, {}
        for base in reservations:
            self._acl.aclrtReleaseMemAddress(ctypes.c_void_p(base))
        for page_id in range(self.num_pages):
            self._acl.aclrtUnmapMem(ctypes.c_void_p(self.global_base_address + page_id * self.page_size_bytes))
        self._acl.aclrtReleaseMemAddress(ctypes.c_void_p(self.global_base_address))
        for handle in self._handles:
            self._acl.aclrtFreePhysical(handle)


def _reserve(acl: ctypes.CDLL, num_bytes: int) -> int:
    pointer = ctypes.c_void_p()
    _acl_check(acl.aclrtReserveMemAddress(ctypes.byref(pointer), ctypes.c_size_t(num_bytes), ctypes.c_size_t(0),
                                          None, ctypes.c_uint64(0)), "aclrtReserveMemAddress")
    return int(pointer.value)


def _acl_check(code: int, call: str) -> None:
    if code != 0:
        raise BackendError(f"{call} failed: aclError {code}")

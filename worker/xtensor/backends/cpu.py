"""CPU backend: a memfd is the physical pool; pages are mapped with mmap(MAP_FIXED) into reserved ranges.

- physical page p = bytes [p * page_size, (p + 1) * page_size) of one memfd (sparse: untouched pages cost nothing);
- the global region is one shared mapping of the whole memfd, so a page written through an owner's view is read
  back through the global region (and what a transfer engine writes there lands in the owner's view);
- a reserved range is an anonymous PROT_NONE mapping; mapping a page lays a MAP_SHARED|MAP_FIXED mapping of the
  memfd over part of it, unmapping lays PROT_NONE back (so the range stays reserved and a stale access faults);
- fallocate(PUNCH_HOLE) really returns a page's memory to the kernel.

Everything goes through libc via ctypes; ctypes releases the GIL during each call, so the pool's refill thread can
map while the request path runs.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import threading
from typing import TYPE_CHECKING

from .base import DEFAULT_PAGE_SIZE_BYTES, BackendError, DeviceSpec

PROT_NONE, PROT_READ, PROT_WRITE = 0x0, 0x1, 0x2
MAP_SHARED, MAP_PRIVATE, MAP_FIXED, MAP_ANONYMOUS = 0x01, 0x02, 0x10, 0x20
MAP_NORESERVE, MAP_POPULATE = 0x4000, 0x8000  # same values on x86_64 and aarch64 (asm-generic)
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 0x01, 0x02
_MAP_FAILED = ctypes.c_void_p(-1).value

if TYPE_CHECKING:
    import torch

_RESERVE_FLAGS = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE
_UNMAP_FLAGS = _RESERVE_FLAGS | MAP_FIXED
_PROT_RW = PROT_READ | PROT_WRITE
_MAP_SHARED_FIXED = MAP_SHARED | MAP_FIXED
_MAP_SHARED_FIXED_POPULATE = _MAP_SHARED_FIXED | MAP_POPULATE


def _load_libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64]
    libc.munmap.restype = ctypes.c_int
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.fallocate.restype = ctypes.c_int
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    return libc


libc = _load_libc()


def _raise_errno(call: str) -> None:
    code = ctypes.get_errno()
    raise BackendError(f"{call} failed: [{errno.errorcode.get(code, code)}] {os.strerror(code)}")


def raw_map(address: int, num_bytes: int, fd: int, offset_bytes: int, flags: int = 0) -> None:
    """mmap(address, num_bytes, RW, MAP_SHARED|MAP_FIXED|flags, fd, offset): the raw call a page map costs."""
    result = libc.mmap(address, num_bytes, _PROT_RW, _MAP_SHARED_FIXED | flags, fd, offset_bytes)
    if result == _MAP_FAILED:
        _raise_errno("mmap(MAP_FIXED, memfd)")


def raw_unmap_keep_reserved(address: int, num_bytes: int) -> None:
    """Lay an anonymous PROT_NONE mapping over the range: the raw call a page unmap costs."""
    result = libc.mmap(address, num_bytes, PROT_NONE, _UNMAP_FLAGS, -1, 0)
    if result == _MAP_FAILED:
        _raise_errno("mmap(PROT_NONE, MAP_FIXED)")


def raw_reserve(num_bytes: int) -> int:
    result = libc.mmap(None, num_bytes, PROT_NONE, _RESERVE_FLAGS, -1, 0)
    if result == _MAP_FAILED or result is None:
        _raise_errno("mmap(PROT_NONE) reserve")
    return int(result)


def raw_munmap(address: int, num_bytes: int) -> None:
    if libc.munmap(address, num_bytes) != 0:
        _raise_errno("munmap")


class CpuBackend:
    """Host memory pages over one memfd. Build with `CpuBackend.open(num_pages, page_size_bytes)`."""

    def __init__(self, fd: int, num_pages: int, page_size_bytes: int, global_base_address: int) -> None:
        self.device = DeviceSpec("cpu", 0)
        self.fd = fd
        self.num_pages = num_pages
        self.page_size_bytes = page_size_bytes
        self.global_base_address = global_base_address
        self._reservations: dict[int, int] = {}  # base -> num bytes, so close() can release what owners left
        self._reservations_lock = threading.Lock()
        self._is_closed = False

    @classmethod
    def open(cls, num_pages: int, page_size_bytes: int = DEFAULT_PAGE_SIZE_BYTES) -> "CpuBackend":
        os_page = os.sysconf("SC_PAGE_SIZE")
        if page_size_bytes <= 0 or page_size_bytes % os_page:
            raise ValueError(f"page_size_bytes={page_size_bytes} must be a positive multiple of the OS page "
                             f"({os_page})")
        if num_pages <= 0:
            raise ValueError(f"num_pages must be > 0, got {num_pages}")
        total_bytes = num_pages * page_size_bytes
        fd = os.memfd_create("janus-xtensor", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, total_bytes)  # sparse: no memory is used until a page is touched
            base = libc.mmap(None, total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0)
            if base == _MAP_FAILED or base is None:
                _raise_errno("mmap(global region)")
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, num_pages, page_size_bytes, int(base))

    def reserve(self, num_pages: int) -> int:
        num_bytes = num_pages * self.page_size_bytes
        base = raw_reserve(num_bytes)
        with self._reservations_lock:
            self._reservations[base] = num_bytes
        return base

    def free_reservation(self, base_address: int, num_pages: int) -> None:
        with self._reservations_lock:
            num_bytes = self._reservations.pop(base_address, None)
        if num_bytes is None:
            raise BackendError(f"no reservation at {base_address:#x}")
        raw_munmap(base_address, num_bytes)

    def map_pages(self, address: int, first_page_id: int, num_pages: int, *, is_populate: bool) -> None:
        page = self.page_size_bytes
        flags = _MAP_SHARED_FIXED_POPULATE if is_populate else _MAP_SHARED_FIXED
        if libc.mmap(address, num_pages * page, _PROT_RW, flags, self.fd, first_page_id * page) == _MAP_FAILED:
            _raise_errno("mmap(MAP_FIXED, memfd)")

    def unmap_pages(self, address: int, num_pages: int) -> None:
        if libc.mmap(address, num_pages * self.page_size_bytes, PROT_NONE, _UNMAP_FLAGS, -1, 0) == _MAP_FAILED:
            _raise_errno("mmap(PROT_NONE, MAP_FIXED)")

    def remap_pages(self, address: int, first_page_id: int, num_pages: int) -> None:
        # MAP_FIXED replaces the old mapping in one step: a concurrent reader sees the old page or the new one.
        self.map_pages(address, first_page_id, num_pages, is_populate=False)

    def copy_pages(self, dst_page_id: int, src_page_id: int, num_pages: int) -> None:
        page = self.page_size_bytes
        base = self.global_base_address
        ctypes.memmove(base + dst_page_id * page, base + src_page_id * page, num_pages * page)

    def discard_pages(self, first_page_id: int, num_pages: int) -> None:
        page = self.page_size_bytes
        mode = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
        if libc.fallocate(self.fd, mode, first_page_id * page, num_pages * page) != 0:
            _raise_errno("fallocate(PUNCH_HOLE)")

    def tensor(self, address: int, num_bytes: int) -> "torch.Tensor":
        import torch  # here, not at module import: the pool's bookkeeping runs (and is tested) without torch

        # torch.frombuffer keeps the ctypes array alive; neither copies nor touches the memory.
        return torch.frombuffer((ctypes.c_uint8 * num_bytes).from_address(address), dtype=torch.uint8)

    def resident_bytes(self) -> int:
        """Bytes of the memfd that hold memory now (st_blocks), to check that freed pages really came back."""
        return os.fstat(self.fd).st_blocks * 512

    def close(self) -> None:
        if self._is_closed:
            return
        self._is_closed = True
        with self._reservations_lock:
            reservations, self._reservations = self._reservations, {}
        for base, num_bytes in reservations.items():
            raw_munmap(base, num_bytes)
        raw_munmap(self.global_base_address, self.num_pages * self.page_size_bytes)
        os.close(self.fd)

"""The interface every device backend implements, and the device-string parsing the worker uses to pick one.

A backend owns the physical pages of one device (page ids 0..num_pages-1) and the *global region*: one virtual range
where page p always sits at base + p * page_size_bytes, registered once with the transfer engine. It also reserves
further virtual ranges (one per owner view) and maps physical pages into them. It keeps no policy: which page goes
where is the pool's business.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

DEFAULT_PAGE_SIZE_BYTES = 2 * 1024 * 1024


class BackendUnavailableError(RuntimeError):
    """The device's backend cannot run here (no driver, no GPU, torch_npu missing); the message says what is missing."""


class BackendError(RuntimeError):
    """A driver or system call failed; the message carries the call and its error."""


@dataclass(frozen=True)
class DeviceSpec:
    """A parsed device string: kind "cpu" | "cuda" | "npu" and an ordinal (0 for "cpu")."""

    kind: str
    index: int

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"{self.kind}:{self.index}"


def parse_device(device: str) -> DeviceSpec:
    """"cpu", "cuda", "cuda:1", "npu:0" -> DeviceSpec. Anything else raises ValueError naming the accepted forms."""
    text = str(device).strip().lower()
    kind, _, ordinal = text.partition(":")
    if kind not in ("cpu", "cuda", "npu"):
        raise ValueError(f"unknown device {device!r}: expected 'cpu', 'cuda[:N]' or 'npu[:N]'")
    if ordinal == "":
        return DeviceSpec(kind, 0)
    if not ordinal.isdigit():
        raise ValueError(f"bad device ordinal in {device!r}: expected a non-negative integer after ':'")
    if kind == "cpu" and int(ordinal) != 0:
        raise ValueError(f"device {device!r}: the CPU backend has a single device, 'cpu'")
    return DeviceSpec(kind, int(ordinal))


class PageBackend(Protocol):
    """Physical pages + virtual ranges of one device. Addresses are plain ints (host or device virtual addresses)."""

    device: DeviceSpec
    page_size_bytes: int
    num_pages: int
    global_base_address: int  # page p is mapped at global_base_address + p * page_size_bytes for the pool's life

    def reserve(self, num_pages: int) -> int:
        """Reserve a virtual range of num_pages pages with nothing mapped (touching it faults); returns its base."""
        ...

    def free_reservation(self, base_address: int, num_pages: int) -> None: ...

    def map_pages(self, address: int, first_page_id: int, num_pages: int, *, is_populate: bool) -> None:
        """Map physical pages first_page_id.. (consecutive) at address.. (consecutive), read-write.
        `is_populate`: the caller will touch the pages at once, so pay the page faults now (CPU MAP_POPULATE)."""
        ...

    def unmap_pages(self, address: int, num_pages: int) -> None:
        """Unmap num_pages pages at address; the range stays reserved (touching it faults)."""
        ...

    def remap_pages(self, address: int, first_page_id: int, num_pages: int) -> None:
        """Replace whatever is mapped at address.. with physical pages first_page_id.. (page migration)."""
        ...

    def copy_pages(self, dst_page_id: int, src_page_id: int, num_pages: int) -> None:
        """Copy page contents through the global region, completed when this returns (waits for the device)."""
        ...

    def discard_pages(self, first_page_id: int, num_pages: int) -> None:
        """The pages' contents are no longer needed: return their memory where the backend can (CPU: punch a hole
        in the memfd). The page ids stay valid and map again as zero-filled (or undefined) memory."""
        ...

    def tensor(self, address: int, num_bytes: int) -> "torch.Tensor":
        """A zero-copy uint8 tensor over [address, address + num_bytes) on this device."""
        ...

    def close(self) -> None:
        """Unmap and release everything. Tensors over this backend's ranges must not be used afterwards."""
        ...

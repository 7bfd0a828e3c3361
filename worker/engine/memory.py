"""The seam between the engine and the device memory layer (xTensor).

The engine's block manager asks for KV *pages* through `KVPageSource` and carves each page into KV blocks; the
model loader asks for one weight region through `WeightPageSource`. xTensor (worker/xtensor) implements both over
one physical page pool per device shared by every model on the worker; worker/engine ships a plain pool behind the
same interface for engines that run without xTensor.

Tensors handed out are zero-copy views that stay valid for the owner's lifetime: pages are mapped into them and
unmapped from them, the views themselves never move.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:  # torch only for type checkers: this module is imported by pure code too
    import torch


@runtime_checkable
class KVPageSource(Protocol):
    """Pages for KV cache and activations, taken from the low end of the pool, mapped on demand."""

    @property
    def page_size_bytes(self) -> int: ...

    def reserve_kv(self, owner: str, max_num_pages: int, device: str) -> "torch.Tensor":
        """A uint8 tensor of max_num_pages * page_size_bytes over a reserved virtual range. Only the pages
        returned by `acquire_kv_pages` are backed; touching any other page is an error (on the CPU backend, a
        fault). Page i of the owner is bytes [i * page_size_bytes, (i + 1) * page_size_bytes) of this tensor."""
        ...

    def acquire_kv_pages(self, owner: str, num_pages: int) -> list[int] | None:
        """Page indices (into the owner's reserved tensor) that are now backed and owned by `owner`, or None when
        the pool cannot supply them all (nothing is taken then). Must not call the driver on the hot path."""
        ...

    def release_kv_pages(self, owner: str, page_indices: Sequence[int]) -> None:
        """Give pages back to the pool; any model on the device may take them next."""
        ...

    def kv_page_global_offset(self, owner: str, page_index: int) -> int:
        """Byte offset of the owner's page in the device's global region (remote peers write KV there)."""
        ...


@runtime_checkable
class WeightPageSource(Protocol):
    """Pages for weights, taken from the high end of the pool as contiguous runs when possible."""

    def allocate_weights(self, owner: str, num_bytes: int, device: str) -> "torch.Tensor":
        """A contiguous uint8 view of at least num_bytes, backed by pages owned by `owner`."""
        ...

    def release_weights(self, owner: str) -> None: ...

    def weight_segments(self, owner: str) -> list[tuple[int, int]]:
        """(global offset, num bytes) of each contiguous run of the owner's weight pages."""
        ...

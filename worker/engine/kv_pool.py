"""Plain page pools behind the `worker.engine.memory` interfaces, for engines that run without xTensor.

`PlainKVPageSource` hands out page indices of one preallocated tensor per owner, with a shared page budget;
`PlainWeightPageSource` allocates an ordinary tensor. Neither maps memory on demand (that is xTensor's job);
"global offsets" here are offsets in a per-source synthetic address space (owner base + page offset), enough for
tests and for peers that address KV the same way, not a device's real global region.
"""
from __future__ import annotations

import threading
from typing import Sequence

import torch

# Owners get disjoint synthetic address ranges this far apart.
_OWNER_STRIDE_BYTES = 1 << 44


class PlainKVPageSource:
    """A KVPageSource over ordinary tensors. `num_pages_total` is shared by every owner of this source."""

    def __init__(self, num_pages_total: int, page_size_bytes: int = 2 << 20) -> None:
        if num_pages_total < 1 or page_size_bytes < 1:
            raise ValueError("num_pages_total and page_size_bytes must be >= 1")
        self._page_size = page_size_bytes
        self._num_pages_free = num_pages_total
        self.num_pages_total = num_pages_total
        self._lock = threading.Lock()
        self._owners: dict[str, dict] = {}

    @property
    def page_size_bytes(self) -> int:
        return self._page_size

    def reserve_kv(self, owner: str, max_num_pages: int, device: str) -> torch.Tensor:
        with self._lock:
            if owner in self._owners:
                raise ValueError(f"owner {owner!r} already reserved KV pages")
            # torch.empty leaves untouched CPU pages uncommitted, like a reserved virtual range.
            tensor = torch.empty(max_num_pages * self._page_size, dtype=torch.uint8, device=device)
            self._owners[owner] = {
                "tensor": tensor,
                "free": list(range(max_num_pages - 1, -1, -1)),  # pop() gives the lowest index
                "held": set(),
                "base": (len(self._owners) + 1) * _OWNER_STRIDE_BYTES,
            }
            return tensor

    def acquire_kv_pages(self, owner: str, num_pages: int) -> list[int] | None:
        with self._lock:
            state = self._owner(owner)
            if num_pages > self._num_pages_free or num_pages > len(state["free"]):
                return None
            pages = [state["free"].pop() for _ in range(num_pages)]
            state["held"].update(pages)
            self._num_pages_free -= num_pages
            return pages

    def release_kv_pages(self, owner: str, page_indices: Sequence[int]) -> None:
        with self._lock:
            state = self._owner(owner)
            for page in page_indices:
                if page not in state["held"]:
                    raise ValueError(f"page {page} is not held by {owner!r}")
                state["held"].discard(page)
                state["free"].append(page)
            state["free"].sort(reverse=True)
            self._num_pages_free += len(page_indices)

    def kv_page_global_offset(self, owner: str, page_index: int) -> int:
        return self._owner(owner)["base"] + page_index * self._page_size

    def release_owner(self, owner: str) -> None:
        """Forget an owner (engine shut down): its pages return to the budget."""
        with self._lock:
            state = self._owners.pop(owner, None)
            if state is not None:
                self._num_pages_free += len(state["held"])

    @property
    def num_pages_free(self) -> int:
        return self._num_pages_free

    def _owner(self, owner: str) -> dict:
        try:
            return self._owners[owner]
        except KeyError:
            raise ValueError(f"owner {owner!r} has no KV reservation") from None


class PlainWeightPageSource:
    """A WeightPageSource over ordinary tensors: one contiguous allocation per owner."""

    def __init__(self, page_size_bytes: int = 2 << 20) -> None:
        self._page_size = page_size_bytes
        self._buffers: dict[str, torch.Tensor] = {}
        self._bases: dict[str, int] = {}

    def allocate_weights(self, owner: str, num_bytes: int, device: str) -> torch.Tensor:
        if owner in self._buffers:
            raise ValueError(f"owner {owner!r} already has weights")
        num_bytes = -(-num_bytes // self._page_size) * self._page_size  # whole pages, as xTensor gives
        self._buffers[owner] = torch.zeros(num_bytes, dtype=torch.uint8, device=device)
        self._bases[owner] = (len(self._bases) + 1) * _OWNER_STRIDE_BYTES
        return self._buffers[owner]

    def release_weights(self, owner: str) -> None:
        self._buffers.pop(owner, None)

    def weight_segments(self, owner: str) -> list[tuple[int, int]]:
        if owner not in self._buffers:
            return []
        return [(self._bases[owner], self._buffers[owner].numel())]

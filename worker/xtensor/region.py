"""The global region of a device's pool: page p at base + p * page_size, addressable by a remote peer."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GlobalRegion:
    """What the worker registers with the Mooncake transfer engine (`register_memory(base_address, num_bytes)`):
    a peer reads weight pages or writes KV pages at base_address + global offset."""

    base_address: int
    num_bytes: int
    page_size_bytes: int

    @property
    def num_pages(self) -> int:
        return self.num_bytes // self.page_size_bytes

    def page_offset_bytes(self, page_id: int) -> int:
        if not 0 <= page_id < self.num_pages:
            raise ValueError(f"page {page_id} is outside the region of {self.num_pages} pages")
        return page_id * self.page_size_bytes

    def page_id_at(self, offset_bytes: int) -> int:
        """The page holding global byte offset `offset_bytes`."""
        if not 0 <= offset_bytes < self.num_bytes:
            raise ValueError(f"offset {offset_bytes} is outside the region of {self.num_bytes} bytes")
        return offset_bytes // self.page_size_bytes

"""The paged KV cache: typed views over the pages a `KVPageSource` reserved for one engine.

Layout. A KV block holds `block_size` tokens of every layer as one contiguous byte range,
`[num_layers, block_size, 2 (K, V), num_kv_heads, head_dim]` in the cache dtype. A page holds
`blocks_per_page = page_size // block_num_bytes` blocks from its start (the tail of a page, if any, is unused);
block `b` lives in page `b // blocks_per_page` at byte `(b % blocks_per_page) * block_num_bytes`. One contiguous
range per block is what P/D transfer needs: a peer writes a block with one (global offset, length) pair.

Addressing. One layer's slice of a block, a *unit* `[block_size, 2, kv_heads, head_dim]`, must divide the page
size (true for power-of-two head counts and dims), so the whole reserved range is one contiguous
`[num_units, block_size, 2, kv_heads, head_dim]` tensor (`units`) and a layer's blocks are gathered with a single
`index_select`: unit of (block b, layer l) = page(b) * units_per_page + slot(b) * num_layers + l. With tokens
outer and K/V inner, a gather yields `[tokens, 2, kv_heads, head_dim]` rows whose K and V halves SDPA reads as
strided views, with no further copy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .memory import KVPageSource


@dataclass(frozen=True)
class KVBlockLayout:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype

    @property
    def block_num_elements(self) -> int:
        return self.num_layers * 2 * self.block_size * self.num_kv_heads * self.head_dim

    @property
    def block_num_bytes(self) -> int:
        return self.block_num_elements * torch.empty((), dtype=self.dtype).element_size()


class PagedKVCache:
    """The owner's reserved KV range as `units` (see the module docstring) plus block <-> byte arithmetic."""

    def __init__(
        self, source: KVPageSource, owner: str, layout: KVBlockLayout, max_num_pages: int, device: torch.device
    ) -> None:
        self.source = source
        self.owner = owner
        self.layout = layout
        self.page_size_bytes = source.page_size_bytes
        self.block_num_bytes = layout.block_num_bytes
        self.unit_num_bytes = self.block_num_bytes // layout.num_layers
        self.blocks_per_page = self.page_size_bytes // self.block_num_bytes
        if self.blocks_per_page < 1:
            raise ValueError(
                f"a KV block of {self.block_num_bytes} bytes does not fit a {self.page_size_bytes}-byte page: "
                "lower block_size"
            )
        if self.page_size_bytes % self.unit_num_bytes:
            raise ValueError(
                f"one layer's slice of a KV block ({self.unit_num_bytes} bytes) must divide the page size "
                f"({self.page_size_bytes} bytes): choose a power-of-two block_size"
            )
        self.units_per_page = self.page_size_bytes // self.unit_num_bytes
        self.max_num_pages = max_num_pages
        self.raw = source.reserve_kv(owner, max_num_pages, str(device))
        if self.raw.dtype != torch.uint8 or self.raw.numel() < max_num_pages * self.page_size_bytes:
            raise ValueError("reserve_kv must return a uint8 tensor of max_num_pages * page_size_bytes")
        self.units = self.raw[: max_num_pages * self.page_size_bytes].view(layout.dtype).view(
            max_num_pages * self.units_per_page, layout.block_size, 2, layout.num_kv_heads, layout.head_dim
        )
        # K and V rows of every token slot: row 2 * (unit * block_size + offset) is K, the next one V.
        self.rows = self.units.view(-1, layout.num_kv_heads, layout.head_dim)

    def first_units(self, block_ids: Sequence[int]) -> list[int]:
        """Unit index of layer 0 of each block (add the layer index for the others). Plain ints: cheaper than
        tensor ops for the few blocks of a step."""
        bpp, upp, num_layers = self.blocks_per_page, self.units_per_page, self.layout.num_layers
        return [(b // bpp) * upp + (b % bpp) * num_layers for b in block_ids]

    # ---- pages (the block manager's source) ----------------------------------------------------------------
    def acquire_pages(self, num_pages: int) -> list[int] | None:
        """Pages from the source, zeroed: a page may hold another model's bytes, and attention reads a block's
        unwritten slots (masked, but 0 * NaN is NaN), so no non-finite garbage may stay. Pages come rarely
        (a page holds many blocks), so this is off the per-step path."""
        pages = self.source.acquire_kv_pages(self.owner, num_pages)
        for page in pages or ():
            self.raw[page * self.page_size_bytes : (page + 1) * self.page_size_bytes].zero_()
        if pages and self.raw.is_cuda:
            # The caller's stream may not be the one that writes the page next (the engine's stream, or a peer's
            # RDMA write for a reservation): the zeros must have landed first.
            torch.cuda.current_stream(self.raw.device).synchronize()
        return pages

    def release_pages(self, page_indices: list[int]) -> None:
        self.source.release_kv_pages(self.owner, page_indices)

    # ---- raw block access (P/D transfer) --------------------------------------------------------------------
    def block_byte_offset(self, block_id: int) -> int:
        """Offset of the block in the owner's reserved tensor."""
        page, slot = divmod(block_id, self.blocks_per_page)
        return page * self.page_size_bytes + slot * self.block_num_bytes

    def block_global_offset(self, block_id: int) -> int:
        """Offset of the block in the device's global region (where a remote peer writes it)."""
        page, slot = divmod(block_id, self.blocks_per_page)
        return self.source.kv_page_global_offset(self.owner, page) + slot * self.block_num_bytes

    def block_data_ptr(self, block_id: int) -> int:
        """Address of the block in this process (a local buffer for a transfer engine)."""
        return self.raw.data_ptr() + self.block_byte_offset(block_id)

    def _block_bytes(self, block_id: int) -> torch.Tensor:
        start = self.block_byte_offset(block_id)
        return self.raw[start : start + self.block_num_bytes]

    def copy_block(self, src_block_id: int, dst_block_id: int) -> None:
        """Copy one block's KV (all layers, K and V) on the device: a forked sample's own copy of a partly filled
        prompt block, which its decode then writes into."""
        self._block_bytes(dst_block_id).copy_(self._block_bytes(src_block_id))

    def read_blocks(self, block_ids: Sequence[int]) -> torch.Tensor:
        """A CPU uint8 copy `[len(block_ids), block_num_bytes]` of the blocks' raw bytes."""
        out = torch.empty((len(block_ids), self.block_num_bytes), dtype=torch.uint8)
        for i, block_id in enumerate(block_ids):
            out[i].copy_(self._block_bytes(block_id))
        return out

    def write_blocks(self, block_ids: Sequence[int], data: torch.Tensor) -> None:
        """Overwrite the blocks with raw bytes `[len(block_ids), block_num_bytes]` (as `read_blocks` returns)."""
        if data.dtype != torch.uint8 or tuple(data.shape) != (len(block_ids), self.block_num_bytes):
            raise ValueError(
                f"expected uint8 data of shape ({len(block_ids)}, {self.block_num_bytes}), got "
                f"{data.dtype} {tuple(data.shape)}"
            )
        for i, block_id in enumerate(block_ids):
            self._block_bytes(block_id).copy_(data[i])

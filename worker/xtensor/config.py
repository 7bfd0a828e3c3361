"""Policy knobs of one device's page pool (frozen; defaults after the paper: 2 MiB pages, a small mapped KV cache)."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .backends.base import DEFAULT_PAGE_SIZE_BYTES


class XTensorConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    page_size_bytes: int = Field(default=DEFAULT_PAGE_SIZE_BYTES, gt=0)
    kv_low_watermark_pages: int = Field(
        default=2, ge=0, description="refill a model's mapped KV cache when fewer idle pages than this are mapped")
    kv_high_watermark_pages: int = Field(
        default=8, ge=0, description="refill up to this many idle mapped pages; idle pages beyond it go back")
    is_background_refill: bool = Field(
        default=True, description="a thread keeps the caches between the watermarks; off: run_kv_maintenance() does")
    refill_poll_s: float = Field(default=0.05, gt=0, description="the thread also wakes this often on its own")
    is_populate: bool = Field(
        default=True, description="CPU: MAP_POPULATE pages that are touched at once (weights, KV cache refills)")
    is_discard_on_free: bool = Field(
        default=True, description="return the memory of pages a model releases for good (release_weights, sleep, "
        "remove_owner; CPU: punch a hole in the memfd)")
    is_discard_on_kv_trim: bool = Field(
        default=False, description="also for idle KV pages the refill thread gives back to the pool: off by default, "
        "since another model takes them soon and re-populating a punched page costs its zeroing again")

    @model_validator(mode="after")
    def _watermarks_ordered(self) -> "XTensorConfig":
        if self.kv_high_watermark_pages < self.kv_low_watermark_pages:
            raise ValueError(f"kv_high_watermark_pages={self.kv_high_watermark_pages} is below "
                             f"kv_low_watermark_pages={self.kv_low_watermark_pages}")
        return self

"""Shared settings of the xTensor tests: small pages so populate and hole punching stay cheap."""
from __future__ import annotations

from worker.xtensor import XTensorConfig

TEST_PAGE_BYTES = 64 * 1024


def make_config(**overrides) -> XTensorConfig:
    fields = dict(page_size_bytes=TEST_PAGE_BYTES, kv_low_watermark_pages=2, kv_high_watermark_pages=4,
                  is_background_refill=False)
    fields.update(overrides)
    return XTensorConfig(**fields)

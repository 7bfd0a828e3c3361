"""Several dispatchers' token attainment merges weighted by the tokens each saw due, not by their request rates."""
from __future__ import annotations

import pytest

from contracts import LoadFeatures, ModelLoadWindow
from contracts.load_book import merge_windows


def _w(dispatcher: str, rate: float, token_attainment: float | None, num_tokens_due: int) -> ModelLoadWindow:
    return ModelLoadWindow(
        model="m", window_s=2.0, end_unix_ms=1000.0, num_requests=int(rate * 2), request_rate_rps=rate,
        features=LoadFeatures(token_rate_tps=rate * 200, input_len_mean=100.0, input_len_var=0.0,
                              output_len_mean=100.0),
        token_attainment=token_attainment, num_tokens_due=num_tokens_due, dispatcher_id=dispatcher,
    )


def test_token_attainment_weighs_by_tokens_due():
    # d1: many requests, few tokens finished yet; d2: few requests, many tokens
    merged = merge_windows([_w("d1", 9.0, 1.0, 100), _w("d2", 1.0, 0.5, 900)])
    assert merged.num_tokens_due == 1000
    assert merged.token_attainment == pytest.approx((1.0 * 100 + 0.5 * 900) / 1000)  # by rate it would be 0.95


def test_a_window_without_token_attainment_adds_nothing():
    merged = merge_windows([_w("d1", 1.0, None, 0), _w("d2", 1.0, 0.8, 50)])
    assert merged.token_attainment == pytest.approx(0.8) and merged.num_tokens_due == 50
    none = merge_windows([_w("d1", 1.0, None, 0), _w("d2", 1.0, None, 0)])
    assert none.token_attainment is None and none.num_tokens_due == 0

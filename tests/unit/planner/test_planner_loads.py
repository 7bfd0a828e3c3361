"""Load windows of several dispatchers add up; a silent dispatcher stops counting."""
from __future__ import annotations

import pytest

from contracts import LoadFeatures, ModelLoadWindow
from contracts.load_book import LoadBook, merge_windows


def _w(dispatcher: str, rate: float, in_mean: float, in_var: float, end_ms: float,
       out_mean: float = 100.0, out_var: float = 0.0) -> ModelLoadWindow:
    return ModelLoadWindow(
        model="m", window_s=2.0, end_unix_ms=end_ms, num_requests=int(rate * 2), request_rate_rps=rate,
        features=LoadFeatures(token_rate_tps=rate * (in_mean + out_mean), input_len_mean=in_mean,
                              input_len_var=in_var, output_len_mean=out_mean, output_len_var=out_var),
        ttft_attainment=0.9 if dispatcher == "d1" else 0.5, dispatcher_id=dispatcher,
    )


def test_rates_add_and_lengths_pool():
    merged = merge_windows([_w("d1", 3.0, 100.0, 0.0, 1000.0), _w("d2", 1.0, 500.0, 0.0, 1000.0)])
    assert merged.request_rate_rps == pytest.approx(4.0)
    assert merged.features.token_rate_tps == pytest.approx(3 * 200 + 1 * 600)
    assert merged.features.input_len_mean == pytest.approx(0.75 * 100 + 0.25 * 500)
    # pooled variance of a two-point mixture: E[x^2] - E[x]^2
    assert merged.features.input_len_var == pytest.approx(0.75 * 100**2 + 0.25 * 500**2 - 200.0**2)
    assert merged.ttft_attainment == pytest.approx((0.9 * 6 + 0.5 * 2) / 8)


def test_answer_lengths_pool_their_spread_too():
    merged = merge_windows([_w("d1", 3.0, 100.0, 0.0, 1000.0, out_mean=50.0, out_var=400.0),
                            _w("d2", 1.0, 100.0, 0.0, 1000.0, out_mean=250.0, out_var=900.0)])
    assert merged.features.output_len_mean == pytest.approx(100.0)
    second = 0.75 * (400.0 + 50.0**2) + 0.25 * (900.0 + 250.0**2)
    assert merged.features.output_len_var == pytest.approx(second - 100.0**2)


def test_latest_per_dispatcher_and_stale_ones_drop():
    book = LoadBook(stale_after_windows=3.0)
    book.observe(_w("d1", 3.0, 100.0, 0.0, 1000.0))
    book.observe(_w("d1", 5.0, 100.0, 0.0, 2000.0))  # replaces d1's older window
    book.observe(_w("d1", 9.0, 100.0, 0.0, 1500.0))  # reordered, older: ignored
    book.observe(_w("d2", 1.0, 100.0, 0.0, 2000.0))
    assert book.merged("m", 2000.0).request_rate_rps == pytest.approx(6.0)
    # d2 goes silent for longer than 3 windows of 2 s; d1 keeps reporting
    book.observe(_w("d1", 4.0, 100.0, 0.0, 9000.0))
    assert book.merged("m", 9000.0).request_rate_rps == pytest.approx(4.0)
    assert book.merged("other") is None


def test_nothing_to_merge_is_an_error():
    with pytest.raises(ValueError):
        merge_windows([])

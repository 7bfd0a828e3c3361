"""bench/server_view.py: the gateway's view of a client run from two scrapes of /metrics, exposed and parsed by
prometheus_client itself: only what happened between the scrapes counts, summed over models and tenants."""
from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from bench.server_view import quantile, server_view

BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def test_the_view_counts_only_the_run_and_sums_every_model():
    registry = CollectorRegistry()
    ttft = Histogram("janus_gateway_ttft_seconds", "", ("model", "tenant"), buckets=BUCKETS_S, registry=registry)
    lag = Histogram("janus_event_loop_lag_seconds", "", ("service",), buckets=(0.001,) + BUCKETS_S,
                    registry=registry)
    for _ in range(50):  # before the run: slow first tokens, which must not count
        ttft.labels("a", "t").observe(3.0)
    before = generate_latest(registry).decode()
    for _ in range(45):  # the run: 90 % fast, on two models
        ttft.labels("a", "t").observe(0.02)
        ttft.labels("b", "u").observe(0.02)
    for _ in range(10):
        ttft.labels("b", "u").observe(1.5)
    for i in range(100):
        lag.labels("gateway").observe(0.3 if i < 5 else 0.0005)
        lag.labels("dispatcher").observe(2.0)  # another service's loop: not the gateway's
    view = server_view(before, generate_latest(registry).decode())
    assert view.num_first_tokens == 100
    assert 10 < view.ttft_p50_ms <= 25 and 10 < view.ttft_p90_ms <= 25
    assert view.loop_late_share == pytest.approx(0.05)
    assert 250 < view.loop_lag_p99_ms <= 500


def test_quantiles_interpolate_inside_their_bucket_and_empty_is_nan():
    assert quantile({0.1: 0.0, 0.2: 10.0, math.inf: 10.0}, 0.5) == pytest.approx(0.15)
    assert quantile({0.1: 5.0, math.inf: 10.0}, 0.9) == pytest.approx(0.1)  # past the last bound: that bound
    assert math.isnan(quantile({0.1: 0.0, math.inf: 0.0}, 0.5))

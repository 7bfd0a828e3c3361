from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from contracts.limits import TenantLimits
from gateway.core.limits import TenantLimiter


def test_rate_limit_refills_over_time():
    lim = TenantLimiter({"a": TenantLimits(rate_rps=2, burst=2)})
    assert lim.try_acquire("a", 0.0) is None and lim.try_acquire("a", 0.0) is None
    refusal = lim.try_acquire("a", 0.0)
    assert refusal and "rate of 2" in refusal
    assert lim.try_acquire("a", 0.5) is None  # one token back after 0.5 s at 2/s


def test_concurrency_cap_counts_requests_in_flight():
    lim = TenantLimiter({"a": TenantLimits(max_concurrency=1)})
    assert lim.try_acquire("a", 0.0) is None
    assert "in flight" in lim.try_acquire("a", 0.0)
    lim.release("a")
    assert lim.try_acquire("a", 0.0) is None


def test_tenants_are_independent_and_default_is_unlimited():
    lim = TenantLimiter({"a": TenantLimits(max_concurrency=1)})
    assert lim.try_acquire("a", 0.0) is None
    assert all(lim.try_acquire("b", 0.0) is None for _ in range(100))


@given(st.lists(st.floats(min_value=0, max_value=0.2), min_size=1, max_size=200))
def test_admissions_never_exceed_burst_plus_rate_times_elapsed(gaps):
    lim = TenantLimiter(default=TenantLimits(rate_rps=5, burst=3))
    now, admitted = 0.0, 0
    for gap in gaps:
        now += gap
        if lim.try_acquire("t", now) is None:
            admitted += 1
            lim.release("t")
    assert admitted <= 3 + 5 * now + 1e-9

"""Per-tenant admission limits: a request rate (token bucket) and a concurrency cap. Pure: time comes in."""
from __future__ import annotations

from dataclasses import dataclass, field

from contracts.limits import TenantLimits


@dataclass
class _Bucket:
    tokens: float
    updated_s: float
    in_flight: int = 0


@dataclass
class TenantLimiter:
    limits: dict[str, TenantLimits] = field(default_factory=dict)
    default: TenantLimits = field(default_factory=TenantLimits)
    _buckets: dict[str, _Bucket] = field(default_factory=dict)

    def limits_of(self, tenant: str) -> TenantLimits:
        return self.limits.get(tenant, self.default)

    def try_acquire(self, tenant: str, now_s: float) -> str | None:
        """Take a slot for one request; None when admitted, else the reason it is refused (nothing taken)."""
        lim = self.limits_of(tenant)
        bucket = self._buckets.get(tenant)
        if bucket is None:
            bucket = self._buckets[tenant] = _Bucket(tokens=float(lim.burst), updated_s=now_s)
        if lim.rate_rps is not None:
            bucket.tokens = min(float(lim.burst), bucket.tokens + (now_s - bucket.updated_s) * lim.rate_rps)
            bucket.updated_s = now_s
        if lim.max_concurrency is not None and bucket.in_flight >= lim.max_concurrency:
            return f"tenant {tenant} has {bucket.in_flight} requests in flight (limit {lim.max_concurrency})"
        if lim.rate_rps is not None:
            if bucket.tokens < 1.0:
                wait_s = (1.0 - bucket.tokens) / lim.rate_rps
                return f"tenant {tenant} is over its rate of {lim.rate_rps:g} requests/s (retry in {wait_s:.2f} s)"
            bucket.tokens -= 1.0
        bucket.in_flight += 1
        return None

    def retry_after_s(self, tenant: str) -> float | None:
        """After a refusal by try_acquire: seconds until the tenant's bucket holds a request again (its refill
        time, as of that refusal); None when only the concurrency cap refuses, whose slots free up when requests
        end, which nobody can foresee."""
        lim = self.limits_of(tenant)
        bucket = self._buckets.get(tenant)
        if bucket is None or lim.rate_rps is None or bucket.tokens >= 1.0:
            return None
        return (1.0 - bucket.tokens) / lim.rate_rps

    def release(self, tenant: str) -> None:
        bucket = self._buckets.get(tenant)
        if bucket is not None and bucket.in_flight > 0:
            bucket.in_flight -= 1

    def in_flight(self, tenant: str) -> int:
        bucket = self._buckets.get(tenant)
        return bucket.in_flight if bucket else 0

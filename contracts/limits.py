"""A tenant's admission limits: what the cluster config states (`gateway.tenants`, `gateway.default_tenant_limits`)
and the gateway enforces (gateway/core/limits.py). Here, below both, so the settings (runtime) and the gateway's
core read one model without either importing the other."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class TenantLimits(BaseModel):
    """None means unlimited."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rate_rps: float | None = Field(default=None, gt=0, description="sustained requests per second")
    burst: int = Field(default=10, ge=1, description="requests allowed at once above the rate")
    max_concurrency: int | None = Field(default=None, ge=1, description="requests in flight at once")

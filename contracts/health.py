from __future__ import annotations

from typing import Literal

from .base import Message


class HealthReply(Message):
    service: str
    instance: str
    status: Literal["ok", "degraded", "stopping"]
    uptime_s: float
    detail: dict[str, str] = {}

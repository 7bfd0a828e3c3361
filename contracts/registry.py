"""The `instances` KV bucket: which model instances are ready where, with roles. The dispatcher routes only to
records with is_ready."""
from __future__ import annotations

from pydantic import Field

from .base import Message
from .lifecycle import InstanceRole, ModelState, Pool


class InstanceRecord(Message):
    instance_id: str
    model: str
    worker_id: str
    role: InstanceRole
    pool: Pool
    state: ModelState
    is_ready: bool = Field(description="verified and serving: the only instances a dispatcher may route to")
    prefill_tokens_per_s: float | None = None
    max_num_seqs: int = Field(default=64, ge=1)
    updated_unix_ms: float

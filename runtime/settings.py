"""Settings: a cluster YAML (what runs: models, workers, policies) plus JANUS_* environment overrides.

Policy knobs are frozen models with the paper's defaults; nothing here does I/O (`load_cluster_config` hands the
file to runtime/effective.py: load_cluster).
"""
from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gateway.core.limits import TenantLimits


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ModelSpec(Frozen):
    """A model the cluster serves. `demo` names a generated random-weight checkpoint (written on first use);
    `path` a local Hugging Face folder."""

    name: str = Field(min_length=1, max_length=96)
    path: Path | None = None
    demo: str | None = None
    ttft_slo_ms: float = Field(default=2000.0, gt=0)
    tpot_slo_ms: float = Field(default=200.0, gt=0)

    @field_validator("name")
    @classmethod
    def _printable(cls, v: str) -> str:
        if any(ch.isspace() for ch in v):
            raise ValueError("model names have no whitespace")
        return v


class WorkersSpec(Frozen):
    count: int = Field(default=2, ge=1)
    device: str = "cpu"
    pool_bytes: int = Field(default=512 << 20, gt=0, description="device page pool per worker")
    page_size_bytes: int = Field(default=2 << 20, gt=0)
    # bootstrap placement until the planner takes over: worker id -> models; a worker not listed serves every model
    placement: dict[str, list[str]] = Field(default_factory=dict)
    max_num_seqs: int = Field(default=32, ge=1, description="running requests per engine")
    engine: Literal["torch", "echo"] = Field(
        default="torch", description="echo skips the model math (to measure the serving path itself)")


class GatewaySpec(Frozen):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    api_keys: dict[str, str] = Field(default_factory=dict, description="API key -> tenant; empty: no auth")
    tenants: dict[str, TenantLimits] = Field(default_factory=dict, description="per-tenant rate and concurrency")
    default_tenant_limits: TenantLimits = TenantLimits()
    tls_certfile: Path | None = None
    tls_keyfile: Path | None = None
    max_request_bytes: int = Field(default=1 << 20, gt=0, description="counted while reading (chunked too): 413")
    request_timeout_s: float = Field(default=300.0, gt=0)
    # connection limits (docs/operations.md): a client that holds a connection without finishing its request
    # headers, or its body, or idles between requests, loses it; connections beyond the cap get 503 at once
    max_connections: int = Field(default=1024, ge=1, description="open HTTP connections at once")
    header_timeout_s: float = Field(default=10.0, gt=0, description="to send a request's headers")
    body_timeout_s: float = Field(default=30.0, gt=0, description="between two chunks of a request body")
    idle_timeout_s: float = Field(default=5.0, gt=0, description="keep-alive: idle between two requests")


class ClusterConfig(Frozen):
    models: list[ModelSpec] = Field(default_factory=lambda: [
        ModelSpec(name="demo-tiny", demo="demo-tiny"),
        ModelSpec(name="demo-small", demo="demo-small"),
    ])
    workers: WorkersSpec = WorkersSpec()
    gateway: GatewaySpec = GatewaySpec()
    replicas: dict[str, int] = Field(default_factory=dict, description="copies of a service `janus up` starts "
                                     "(workers: workers.count)")
    jetstream_replicas: int = Field(default=1, ge=1, le=5, description="3 on a three-node NATS cluster")
    dispatcher: dict = Field(default_factory=dict, description="DispatchPolicy knobs")
    planner: dict = Field(default_factory=dict, description="planner policy knobs")
    oracle: dict = Field(default_factory=dict, description="oracle knobs")

    def model(self, name: str) -> ModelSpec | None:
        return next((m for m in self.models if m.name == name), None)


class JanusSettings(BaseSettings):
    """Process settings. Every field can be set as JANUS_<FIELD> in the environment."""

    model_config = SettingsConfigDict(env_prefix="JANUS_", extra="ignore")

    nats_url: str = "nats://127.0.0.1:4222"
    nats_user: str | None = None
    nats_password: str | None = None
    nats_tls_ca: Path | None = Field(default=None, description="CA bundle: connect to NATS over TLS")
    nats_tls_cert: Path | None = Field(default=None, description="client certificate for mutual TLS")
    nats_tls_key: Path | None = None
    config: Path | None = Field(default=None, description="cluster YAML")
    state_dir: Path = Path(".janus")
    instance: str = Field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    metrics_port: int | None = Field(default=0, description="/metrics listener of services without HTTP; 0 picks "
                                     "a free port, None turns it off")
    metrics_host: str = "127.0.0.1"

    @property
    def models_dir(self) -> Path:
        return self.state_dir / "models"


def load_cluster_config(path: Path | None) -> ClusterConfig:
    """The checked loader (runtime/effective.py: load_cluster): a mistake is a ConfigError of one line naming the
    YAML path and the offending value."""
    from .effective import load_cluster

    return load_cluster(path)

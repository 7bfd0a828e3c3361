"""Settings: a cluster YAML (what runs: models, workers, policies) plus JANUS_* environment overrides.

Policy knobs are frozen models with the paper's defaults; nothing here does I/O (the checked loader of a cluster YAML
is ops/effective.py: load_cluster).
"""
from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError
from pydantic_settings import BaseSettings, SettingsConfigDict

from contracts.limits import TenantLimits


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


# the device a worker process opens, set per worker by `janus up` (ops/launcher.py); `janus serve worker
# --device` sets it by hand. Unset, a worker opens `workers.device` as written.
DEVICE_ENV = "JANUS_DEVICE"
SHAREABLE_DEVICE_KINDS = ("cpu",)  # many workers on one CPU is how the demo runs; an accelerator is one worker's


class WorkersSpec(Frozen):
    """The workers: one process per device. `devices` lists each worker's device (`[cuda:0, cuda:1]`: count is its
    length); else `count` workers share `device`, and a device kind without an index (`cuda`) gives worker i its own
    `cuda:i` (docs/operations.md: Devices)."""

    count: int = Field(default=2, ge=1)
    device: str = "cpu"
    devices: list[str] = Field(default_factory=list, description="one device per worker, in worker order")
    share_devices: bool = Field(default=False, description="allow two workers on one accelerator (each with its own "
                                "pool_bytes of it)")
    pool_bytes: int = Field(default=512 << 20, gt=0, description="device page pool per worker")
    page_size_bytes: int = Field(default=2 << 20, gt=0)
    # bootstrap placement until the planner takes over: worker id -> models; a worker not listed serves every model
    placement: dict[str, list[str]] = Field(default_factory=dict)
    max_num_seqs: int = Field(default=32, ge=1, description="running requests per engine")
    min_drain_s: float = Field(default=30.0, gt=0, description="the least a drain waits before it fails what is "
                               "left: P/D reservations; a request that streams already waits until the gateway's "
                               "request timeout from its start (docs/lifecycle.md)")
    engine: Literal["torch", "echo"] = Field(
        default="torch", description="echo skips the model math (to measure the serving path itself)")

    @model_validator(mode="before")
    @classmethod
    def _count_and_kind_from_devices(cls, data: Any) -> Any:
        """With `devices` listed, `count` and `device` may be left out: they follow from the list."""
        if isinstance(data, dict) and isinstance(data.get("devices"), list) and data["devices"]:
            kinds = {str(d).split(":")[0] for d in data["devices"]}
            data = {"count": len(data["devices"]), **({"device": kinds.pop()} if len(kinds) == 1 else {}), **data}
        return data

    @model_validator(mode="after")
    def _one_worker_per_accelerator(self) -> "WorkersSpec":
        if self.devices and len(self.devices) != self.count:
            raise _invalid("count", f"{self.count} workers for the {len(self.devices)} devices of workers.devices: "
                           "one device per worker (or leave count out)", self.count)
        kinds = {d.split(":")[0] for d in self.devices}
        if self.devices and kinds != {self.device.split(":")[0]}:
            raise _invalid("device", f"disagrees with workers.devices ({', '.join(sorted(kinds))}): leave it out",
                           self.device)
        shared = shared_accelerators(self.devices_for(self.count))
        if shared and not self.share_devices:
            field = "devices" if self.devices else "device"
            raise _invalid(field, f"puts {shared}: give each worker its own (workers.devices: [cuda:0, cuda:1, ...], "
                           "or workers.device: cuda for one each) or set workers.share_devices: true",
                           getattr(self, field))
        return self

    def devices_for(self, num_workers: int) -> list[str]:
        """Worker i's device, for `num_workers` workers (`janus up --workers` may differ from count): the listed
        one; else `device` itself when it names one (`cuda:1`) or is shareable (`cpu`); else `<device>:i`."""
        if self.devices:
            if num_workers != len(self.devices):
                raise ValueError(f"{num_workers} workers for the {len(self.devices)} devices of workers.devices")
            return list(self.devices)
        if ":" in self.device or self.device in SHAREABLE_DEVICE_KINDS:
            return [self.device] * num_workers
        return [f"{self.device}:{i}" for i in range(num_workers)]


def _invalid(field: str, message: str, value: Any) -> ValidationError:
    """An error at `workers.<field>` (a model validator's own errors would all point at `workers`)."""
    return ValidationError.from_exception_data("WorkersSpec", [InitErrorDetails(
        type=PydanticCustomError("workers", message), loc=(field,), input=value)])


def shared_accelerators(devices: list[str]) -> str:
    """'' when no accelerator has two workers, else which do (`cuda:0 under workers 0 and 3`)."""
    holders: dict[str, list[int]] = {}
    for i, device in enumerate(devices):
        if device.split(":")[0] not in SHAREABLE_DEVICE_KINDS:
            holders.setdefault(device, []).append(i)
    return "; ".join(f"{d} under workers {' and '.join(map(str, ws))}" for d, ws in holders.items() if len(ws) > 1)


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


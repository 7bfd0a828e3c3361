"""Per-process settings of a worker that must be in place before the libraries that read them start working.

- torch's CPU threads: `janus up` runs several workers on one machine, and each torch process would otherwise start
  one OpenMP thread per core; threads that spin-wait for a core another worker holds make small matmuls many times
  slower. `JANUS_TORCH_THREADS` sets the count per worker process; unset, it is 1 on a CPU device and torch's own
  default on an accelerator (where the CPU threads only feed the device).
- Mooncake's log level: the transfer engine logs through glog at INFO by default, a few lines per transfer engine
  and per peer. Mooncake reads `MC_LOG_LEVEL` when its library loads and sets glog's level from it (overriding
  `GLOG_minloglevel`), so both are set before the first `import mooncake`: warnings and errors only, unless
  `JANUS_LOG_LEVEL=DEBUG`. Values an operator set in the environment are kept.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import MutableMapping

TORCH_THREADS_ENV = "JANUS_TORCH_THREADS"
LOG_LEVEL_ENV = "JANUS_LOG_LEVEL"


@dataclass(frozen=True)
class ProcessSetup:
    """What `configure_worker_process` applied: torch threads (None: left to torch) and Mooncake's log level."""

    num_torch_threads: int | None
    mooncake_log_level: str


def torch_threads_for(device: str, environ: MutableMapping[str, str] | None = None) -> int | None:
    """The torch thread count for a worker on `device`: JANUS_TORCH_THREADS, else 1 on a CPU, else None."""
    environ = os.environ if environ is None else environ
    raw = environ.get(TORCH_THREADS_ENV, "").strip()
    if raw:
        try:
            value = int(raw)
        except ValueError:
            value = 0
        if value < 1:
            raise ValueError(f"{TORCH_THREADS_ENV} must be a whole number >= 1, got {raw!r}")
        return value
    return 1 if device.split(":")[0] == "cpu" else None


def quiet_mooncake_logs(log_level: str | None = None, environ: MutableMapping[str, str] | None = None) -> str:
    """Set Mooncake's (and glog's) level in the environment unless already set: WARNING, or INFO when the worker
    logs at DEBUG. Call before `mooncake` is first imported. Returns the level in effect."""
    environ = os.environ if environ is None else environ
    level = (log_level or environ.get(LOG_LEVEL_ENV, "INFO")).upper()
    wanted = "INFO" if level == "DEBUG" else "WARNING"
    environ.setdefault("MC_LOG_LEVEL", wanted)
    environ.setdefault("GLOG_minloglevel", "0" if wanted == "INFO" else "1")
    return environ["MC_LOG_LEVEL"]


def configure_worker_process(device: str, log_level: str, *, uses_torch: bool = True,
                             environ: MutableMapping[str, str] | None = None) -> ProcessSetup:
    """Apply both settings to this process (the worker calls it first thing in `start`)."""
    mooncake_level = quiet_mooncake_logs(log_level, environ)
    num_threads = torch_threads_for(device, environ) if uses_torch else None
    if num_threads is not None:
        import torch

        torch.set_num_threads(num_threads)
        try:  # only possible before torch ran any inter-op parallel work
            torch.set_num_interop_threads(num_threads)
        except RuntimeError:
            pass
    return ProcessSetup(num_threads, mooncake_level)

"""This machine's CPU measured as a device (a DeviceSpec): float32 matmul FLOP/s, memory copy and disk read bytes/s.

A measurement, with a clock and a scratch file, so it lives beside the plain numbers of oracle/specs.py rather than
among them: the oracle's core reads the specs and takes no clock (docs/architecture.md, "Layers"). The oracle
service and the profiling harness calibrate this CPU with it; torch-free (numpy).
"""
from __future__ import annotations

import os
import tempfile
import time
from typing import Any

from .specs import GIB, MIB, DeviceSpec


def calibrate_cpu(num_bytes: int = 64 * MIB, matmul_dim: int = 512, repeats: int = 3) -> DeviceSpec:
    """Measure this machine's CPU as a 'device': float32 matmul FLOP/s (numpy/BLAS), memory copy bytes/s (used for
    HBM, h2d and d2d alike, all of them memcpy here) and disk read bytes/s of a freshly written file after asking
    the kernel to drop it from the page cache (best effort: a page-cache read overstates the disk). Takes ~1 s."""
    import numpy as np

    if num_bytes < MIB or matmul_dim < 64 or repeats < 1:
        raise ValueError("calibrate_cpu: num_bytes >= 1 MiB, matmul_dim >= 64, repeats >= 1")
    a = np.random.default_rng(0).standard_normal((matmul_dim, matmul_dim), dtype=np.float32)
    a @ a  # warm the BLAS threads before timing
    best_matmul_s = min(_timed(lambda: a @ a) for _ in range(repeats))
    flops_per_s = 2.0 * matmul_dim**3 / best_matmul_s

    src = np.ones(num_bytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    best_copy_s = min(_timed(lambda: np.copyto(dst, src)) for _ in range(repeats))
    copy_bytes_per_s = num_bytes / best_copy_s  # bytes written; a copy also reads as many

    disk_bytes_per_s = _measure_disk_read(src.tobytes())
    return DeviceSpec(
        name="cpu-calibrated",
        hbm_bytes=_physical_memory_bytes(),
        peak_bf16_flops_per_s=flops_per_s,
        hbm_bytes_per_s=copy_bytes_per_s,
        h2d_bytes_per_s=copy_bytes_per_s,
        d2d_bytes_per_s=copy_bytes_per_s,
        disk_bytes_per_s=disk_bytes_per_s,
        local_copy_bytes_per_s=copy_bytes_per_s,
        source=f"measured by calibrate_cpu at {time.strftime('%Y-%m-%d %H:%M')} (float32 matmul {matmul_dim}^3)",
    )


def _timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _measure_disk_read(payload: bytes) -> float:
    with tempfile.NamedTemporaryFile(prefix="janus-calib-") as handle:
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        with open(handle.name, "rb", buffering=0) as reader:
            start = time.perf_counter()
            while reader.read(8 * MIB):
                pass
            elapsed_s = time.perf_counter() - start
    return len(payload) / max(elapsed_s, 1e-9)


def _physical_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 16 * GIB

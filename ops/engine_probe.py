"""This machine's CPU measured the way the engine runs on it: torch on one thread, timed by the thread's own CPU time.

`oracle.cpu_device.calibrate_cpu` measures the CPU torch-free (numpy, wall clock), as the oracle service and the
profiling harness need it. Fitting a cost model to the engine's step times (`python -m sim.calibrate`) needs the
speeds that engine's torch reaches instead, measured beside its steps. Here, above both the oracle and the worker
(docs/architecture.md, "Layers"), with the engine profiler (ops/profile.py).
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable

from oracle.specs import MIB, DeviceSpec


def _thread_timed(fn: Callable[[], object]) -> float:
    start = time.thread_time()
    fn()
    return time.thread_time() - start


class EngineLikeProbe:
    """This CPU's compute and memory speeds as the engine steps see them. A wall clock (and a multi-threaded BLAS) on
    a shared machine counts other jobs' time, and fitted efficiencies cannot exceed 1 to make up for a device
    measured slow.

    Memory speed is a read stream (a sum) of the weights' size, as a step reads its weights: a copy also writes, and
    rated this CPU 4x slower than its matrix-vector products read (7 against 28 GB/s), which pinned the fitted mbu
    at 1 (docs/bench/sim.md, "Calibration"). Call `sample` between the steps being timed: a stretch of contention
    then slows some samples of each, and the fastest sample of each is a quiet one, as the fastest step is."""

    def __init__(self, matmul_dim: int = 512, read_bytes: int = 64 * MIB):
        import torch

        torch.set_num_threads(1)
        self._matmul_dim, self._read_bytes = matmul_dim, read_bytes
        self._a = torch.randn(matmul_dim, matmul_dim)
        self._src = torch.ones(read_bytes // 4)
        self._a @ self._a  # warm the kernels before timing
        self._src.sum()
        self.best_matmul_s = self.best_read_s = float("inf")

    def sample(self, repeats: int = 1) -> None:
        for _ in range(repeats):
            self.best_matmul_s = min(self.best_matmul_s, _thread_timed(lambda: self._a @ self._a))
            self.best_read_s = min(self.best_read_s, _thread_timed(lambda: self._src.sum()))

    def device(self, base: DeviceSpec) -> DeviceSpec:
        """`base` (from `calibrate_cpu`) with the fastest compute and read speeds sampled."""
        if self.best_matmul_s == float("inf"):
            raise ValueError("EngineLikeProbe.device: call sample() first")
        read_bytes_per_s = self._read_bytes / self.best_read_s
        return replace(base, peak_bf16_flops_per_s=2.0 * self._matmul_dim**3 / self.best_matmul_s,
                       hbm_bytes_per_s=read_bytes_per_s, local_copy_bytes_per_s=read_bytes_per_s,
                       source=f"{base.source}; compute and read by torch on one thread, thread CPU time")


def engine_like_cpu(base: DeviceSpec, repeats: int = 5) -> DeviceSpec:
    """`base` with its compute and memory speeds measured back to back by an `EngineLikeProbe`."""
    probe = EngineLikeProbe()
    probe.sample(repeats)
    return probe.device(base)

"""Fit the roofline's efficiencies (mfu, mbu, per-step overhead) to measured step times of an engine, so the
roofline baseline describes the same engine the profiles measure. Pure: samples in, Efficiency out."""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..roofline import Efficiency, RooflineModel


@dataclass(frozen=True)
class StepSample:
    """One measured step: `num_prefill_tokens` prompt tokens of one sequence, or a decode step of `batch_size`
    sequences holding `context_tokens` tokens of context in all."""

    wall_ms: float
    num_prefill_tokens: int = 0
    batch_size: int = 0
    context_tokens: int = 0


def fit_efficiency(roofline: RooflineModel, samples: list[StepSample], mbu: float | None = None) -> Efficiency:
    """Grid search over mfu and mbu (log-spaced) with the overhead set to the median residual, minimising the
    squared log error of predicted step times.

    `mbu` fixes the memory efficiency instead of fitting it: for a caller that measured the device's read speed the
    way the steps read (sim.calibrate's probe reads the weights' bytes). A model whose steps all read about the same
    bytes (its weights) makes the memory time a near-constant, collinear with the per-step overhead, and a free fit
    then picks between "memory-bound at a low mbu, no overhead" and "mbu near 1 plus an overhead" by noise: the
    first leaves prefill without an intercept and over-predicts mid-length prompts (docs/bench/sim.md,
    "Calibration")."""
    if mbu is not None and not 0.0 < mbu <= 1.0:
        raise ValueError(f"fit_efficiency: mbu must be in (0, 1], got {mbu}")
    if len(samples) < 3:
        raise ValueError("fit_efficiency needs at least 3 step samples")
    flops, num_bytes = [], []
    for s in samples:
        if s.num_prefill_tokens:
            flops.append(float(roofline.prefill_flops(s.num_prefill_tokens)))
            num_bytes.append(float(roofline.weights_read_bytes(s.num_prefill_tokens))
                             + s.num_prefill_tokens * roofline.kv_bytes_per_token)
        else:
            flops.append(roofline.decode_flops(s.batch_size, s.context_tokens))
            num_bytes.append(roofline.decode_bytes(s.batch_size, s.context_tokens))
    wall_ms = np.array([s.wall_ms for s in samples])
    compute_ms_at_peak = 1e3 * np.array(flops) / roofline.tp / roofline.device.peak_bf16_flops_per_s
    memory_ms_at_peak = 1e3 * np.array(num_bytes) / roofline.device.hbm_bytes_per_s

    def search(mfus: np.ndarray, mbus: np.ndarray) -> tuple[float, float, float, float]:
        best = (np.inf, 1.0, 1.0, 0.0)
        for mfu_try in mfus:
            for mbu_try in mbus:
                core = np.maximum(compute_ms_at_peak / mfu_try, memory_ms_at_peak / mbu_try)
                overhead = max(float(np.median(wall_ms - core)), 0.0)
                error = float(np.sum((np.log(wall_ms) - np.log(core + overhead + 1e-9)) ** 2))
                if error < best[0]:
                    best = (error, float(mfu_try), float(mbu_try), overhead)
        return best

    # coarse (x1.21 a step), then fine (x1.01) around the best: a coarse step alone is a 10 % error in every
    # prediction, which is half of what the simulator's calibration may miss by
    coarse_step = 10 ** (4 / 48)
    coarse = np.logspace(-4, 0, 49)
    _, coarse_mfu, coarse_mbu, _ = search(coarse, coarse if mbu is None else np.array([mbu]))
    fine = np.logspace(-np.log10(coarse_step), np.log10(coarse_step), 41)
    fine_mbus = np.clip(coarse_mbu * fine, 1e-4, 1.0) if mbu is None else np.array([mbu])
    _, fitted_mfu, fitted_mbu, overhead = search(np.clip(coarse_mfu * fine, 1e-4, 1.0), fine_mbus)
    return replace(roofline.efficiency, mfu=fitted_mfu, mbu=fitted_mbu, step_overhead_ms=overhead)

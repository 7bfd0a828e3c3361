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


def fit_efficiency(roofline: RooflineModel, samples: list[StepSample]) -> Efficiency:
    """Grid search over mfu and mbu (log-spaced) with the overhead set to the median residual, minimising the
    squared log error of predicted step times."""
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
        for mfu in mfus:
            for mbu in mbus:
                core = np.maximum(compute_ms_at_peak / mfu, memory_ms_at_peak / mbu)
                overhead = max(float(np.median(wall_ms - core)), 0.0)
                error = float(np.sum((np.log(wall_ms) - np.log(core + overhead + 1e-9)) ** 2))
                if error < best[0]:
                    best = (error, float(mfu), float(mbu), overhead)
        return best

    # coarse (x1.21 a step), then fine (x1.01) around the best: a coarse step alone is a 10 % error in every
    # prediction, which is half of what the simulator's calibration may miss by
    coarse_step = 10 ** (4 / 48)
    _, mfu, mbu, _ = search(np.logspace(-4, 0, 49), np.logspace(-4, 0, 49))
    fine = np.logspace(-np.log10(coarse_step), np.log10(coarse_step), 41)
    _, mfu, mbu, overhead = search(np.clip(mfu * fine, 1e-4, 1.0), np.clip(mbu * fine, 1e-4, 1.0))
    return replace(roofline.efficiency, mfu=mfu, mbu=mbu, step_overhead_ms=overhead)

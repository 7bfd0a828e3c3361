"""What a run used and achieved, from its record (pure).

Achieved: token-level attainment (token i of a request on time iff delivered by TTFT_SLO + (i-1) * TPOT_SLO after
its arrival; tokens never delivered are late), per-request TTFT and TPOT attainment. A run that ends with requests
unfinished (`horizon_s`) scores their tokens due by its end only: one not delivered by then is late, one due later
is unknown. Counting every undelivered token late made any mix whose outputs outlast the drain look overloaded at
any load (a 600-token answer at a 68 ms TPOT SLO needs 41 s; the simulator's profiles drain for 16 s).

Used, per replica (the definitions of RooflineModel.needs, applied to measured step times; docs/oracle.md):
- hbm: (weight bytes + peak KV bytes) / device HBM;
- compute: share of the window the work takes with decode steps paced to the TPOT SLO: the measured extra time
  prefill tokens added to their steps, plus paced decode steps x the step time the run's own decode steps show
  at that batch (a least-squares line through the measured decode-only steps);
- bandwidth: bytes those steps move (weights once per step, KV read and written) per second over the device's.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from contracts import NeedVector

from ..roofline import RooflineModel


@dataclass
class RequestRecord:
    arrival_s: float
    prompt_len: int
    output_len: int
    token_times_s: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class StepRecord:
    start_s: float
    wall_s: float
    num_prefill_tokens: int
    num_decode_tokens: int
    context_tokens: int
    kv_bytes: int
    measured_s: float | None = None  # what the step took by the timer, where wall_s is a step-cost model's


@dataclass(frozen=True)
class Attainment:
    token: float
    ttft: float
    tpot: float
    num_requests: int


def attainment(requests: list[RequestRecord], ttft_slo_ms: float, tpot_slo_ms: float,
               horizon_s: float | None = None) -> Attainment:
    """`horizon_s`: when the run stopped (None: it ran every request to its end)."""
    if not requests:
        return Attainment(1.0, 1.0, 1.0, 0)
    ttft_slo_s, tpot_slo_s = ttft_slo_ms / 1e3, tpot_slo_ms / 1e3
    on_time = total = num_ttft_ok = num_tpot_ok = 0
    for r in requests:
        times = np.asarray(r.token_times_s) - r.arrival_s
        deadlines = ttft_slo_s + tpot_slo_s * np.arange(len(times))
        is_done = len(times) >= r.output_len
        if is_done or horizon_s is None:
            total += r.output_len
            on_time += int(np.count_nonzero(times <= deadlines + 1e-12))
        else:  # censored at the horizon: tokens due by then are scored (undelivered ones late), later ones unknown
            num_due = min(r.output_len, max(0, int((horizon_s - r.arrival_s - ttft_slo_s) // tpot_slo_s) + 1))
            total += max(num_due, len(times))
            on_time += int(np.count_nonzero(times <= deadlines + 1e-12))
        num_ttft_ok += int(len(times) > 0 and times[0] <= ttft_slo_s)
        if is_done and len(times) > 1:
            num_tpot_ok += int((times[-1] - times[0]) / (len(times) - 1) <= tpot_slo_s)
        elif is_done:
            num_tpot_ok += 1  # a one-token answer has no inter-token time
    return Attainment(on_time / total if total else 1.0, num_ttft_ok / len(requests), num_tpot_ok / len(requests),
                      len(requests))


def decode_step_line(steps: list[StepRecord]) -> tuple[float, float, float]:
    """Least-squares wall_s = a + b * batch + c * context over decode-only steps, coefficients >= 0 (falls back to
    the mean step time when too few steps differ)."""
    rows = [(s.num_decode_tokens, s.context_tokens, s.wall_s) for s in steps
            if s.num_decode_tokens > 0 and s.num_prefill_tokens == 0]
    if not rows:
        return 0.0, 0.0, 0.0
    data = np.array(rows, dtype=float)
    if len(rows) < 4 or np.ptp(data[:, 0]) == 0:
        return float(np.median(data[:, 2])), 0.0, 0.0
    from scipy.optimize import nnls

    design = np.column_stack([np.ones(len(data)), data[:, 0], data[:, 1]])
    coef, _ = nnls(design, data[:, 2])
    return float(coef[0]), float(coef[1]), float(coef[2])


def replica_needs(steps: list[StepRecord], window_s: float, roofline: RooflineModel, tpot_slo_ms: float,
                  mean_context_per_seq: float) -> NeedVector:
    """One replica's needs over a window of `window_s` seconds (see the module docstring)."""
    if window_s <= 0:
        raise ValueError("window_s must be > 0")
    a, b, c = decode_step_line(steps)
    prefill_s = 0.0
    prefill_bytes = 0.0
    num_decode_tokens = 0
    for s in steps:
        num_decode_tokens += s.num_decode_tokens
        if s.num_prefill_tokens:
            decode_part = (a + b * s.num_decode_tokens + c * s.context_tokens) if s.num_decode_tokens else 0.0
            prefill_s += max(s.wall_s - decode_part, 0.0)
            prefill_bytes += float(roofline.weights_read_bytes(s.num_prefill_tokens)) \
                + s.num_prefill_tokens * roofline.kv_bytes_per_token
    out_rate = num_decode_tokens / window_s
    steps_per_s = roofline.paced_decode_steps_per_s(out_rate, tpot_slo_ms)
    if steps_per_s > 0:
        batch = out_rate / steps_per_s
        context = batch * mean_context_per_seq
        decode_share = steps_per_s * (a + b * batch + c * context)
        decode_bytes_per_s = steps_per_s * roofline.decode_bytes(batch, context)
    else:
        decode_share = decode_bytes_per_s = 0.0
    peak_kv = max((s.kv_bytes for s in steps), default=0)
    device = roofline.device
    return NeedVector(hbm=(roofline.weight_bytes + peak_kv) / device.hbm_bytes,
                      compute=prefill_s / window_s + decode_share,
                      bandwidth=(decode_bytes_per_s + prefill_bytes / window_s) / device.hbm_bytes_per_s)

"""The simulator's device model: step times of batched prefill and decode iterations, and lifecycle load times,
on top of the oracle's roofline (oracle/roofline.py).

The roofline answers one question at a time through numpy scalars (~20 us a call); the simulator asks millions.
`StepCost` reads the roofline's coefficients once (from its public methods) and evaluates the same formulas with
plain float arithmetic; tests check it against `RooflineModel` point by point."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from oracle.roofline import Efficiency, RooflineModel
from oracle.specs import DeviceSpec, ModelShape


@dataclass(frozen=True)
class LoadTimes:
    """Seconds to bring one replica's weights onto its devices by each path."""

    h2d_s: float  # warm -> active (pinned host memory)
    d2d_s: float  # fork from a live replica
    net_s: float  # warm on another host -> active (its pinned memory over the network)
    disk_s: float  # cold -> active


class StepCost:
    """Iteration times of one model (shape, tp) on one device kind, in seconds.

    An iteration runs `num_prefill_tokens` prompt tokens of `num_prefill_seqs` sequences together with one decode
    token for each of `batch_size` running sequences holding `context_tokens` tokens of KV in all (chunked prefill
    mixes both, as vLLM does). Time = max(compute, memory) + tensor-parallel all-reduce + fixed overhead."""

    def __init__(self, roofline: RooflineModel, max_num_tokens: int = 16_384):
        self.roofline = roofline
        rm = roofline
        eff, dev = rm.efficiency, rm.device
        self.tp = rm.tp
        self.kv_bytes_per_token = rm.kv_bytes_per_token
        self.weight_bytes = rm.weight_bytes
        self.max_num_kv_tokens = rm.max_num_kv_tokens
        self.max_num_seqs = eff.max_num_seqs
        self._flop_s = 1e3 / rm.tp / (dev.peak_bf16_flops_per_s * eff.mfu)  # ms per whole-model FLOP
        self._byte_s = 1e3 / (dev.hbm_bytes_per_s * eff.mbu)  # ms per byte on one device
        self._overhead_ms = eff.step_overhead_ms
        # Prefill FLOPs = lin * n + head * s + attn * s * (n/s) * (n/s + 1) / 2, solved from three evaluations
        # (n = 1, 2, 3 tokens of one sequence: attention terms 1, 3, 6).
        f1, f2, f3 = (float(rm.prefill_flops(n, 1)) for n in (1, 2, 3))
        a = np.array([[1, 1, 1], [2, 1, 3], [3, 1, 6]], dtype=float)
        self._lin_flops, self._head_flops, self._attn_flops = np.linalg.solve(a, [f1, f2, f3]).tolist()
        # Decode FLOPs = 2 * active * B + attn * K (the same attention constant)
        self._decode_flops_per_seq = float(rm.decode_flops(1, 0))
        # Weights read by an iteration of t tokens (MoE: grows with t as more experts are touched)
        if rm.shape.is_moe:
            t = np.arange(max_num_tokens + 1, dtype=float)
            self._weights_read = np.array([float(rm.decode_bytes(x, 0)) - x * self.kv_bytes_per_token
                                           for x in t])
        else:
            self._weights_read = None
            self._dense_weights_read = float(rm.decode_bytes(1, 0)) - self.kv_bytes_per_token
        # All-reduce per iteration is affine in its tokens: recover it from two decode steps at zero context.
        self._ar0_ms, self._ar1_ms = 0.0, 0.0
        if rm.tp > 1:
            r1 = rm.decode_step_ms(1, 0) - self._core_ms(0, 0, 1, 0) - self._overhead_ms
            r2 = rm.decode_step_ms(2, 0) - self._core_ms(0, 0, 2, 0) - self._overhead_ms
            self._ar1_ms = r2 - r1
            self._ar0_ms = r1 - self._ar1_ms
        self.max_num_tokens = max_num_tokens

    def _weights(self, num_tokens: int) -> float:
        if self._weights_read is None:
            return self._dense_weights_read
        return float(self._weights_read[min(num_tokens, len(self._weights_read) - 1)])

    def _core_ms(self, num_prefill_tokens: int, num_prefill_seqs: int, batch_size: int, context_tokens: float) \
            -> float:
        flops = batch_size * self._decode_flops_per_seq + self._attn_flops * context_tokens
        if num_prefill_tokens:
            per_seq = num_prefill_tokens / num_prefill_seqs
            flops += (self._lin_flops * num_prefill_tokens + self._head_flops * num_prefill_seqs
                      + self._attn_flops * num_prefill_seqs * per_seq * (per_seq + 1) / 2)
        num_tokens = num_prefill_tokens + batch_size
        num_bytes = self._weights(num_tokens) + (context_tokens + num_tokens) * self.kv_bytes_per_token
        compute_ms = flops * self._flop_s
        memory_ms = num_bytes * self._byte_s
        return compute_ms if compute_ms > memory_ms else memory_ms

    def iteration_s(self, num_prefill_tokens: int, num_prefill_seqs: int, batch_size: int,
                    context_tokens: float) -> float:
        """One iteration, seconds. Pure prefill: batch_size = 0; pure decode: num_prefill_tokens = 0."""
        num_tokens = num_prefill_tokens + batch_size
        if num_tokens <= 0:
            return 0.0
        ms = self._core_ms(num_prefill_tokens, max(1, num_prefill_seqs), batch_size, context_tokens)
        if self.tp > 1:
            ms += self._ar0_ms + self._ar1_ms * num_tokens
        return (ms + self._overhead_ms) / 1e3

    def decode_s(self, batch_size: int, context_tokens: float) -> float:
        return self.iteration_s(0, 0, batch_size, context_tokens)

    def prefill_s(self, num_tokens: int, num_seqs: int = 1) -> float:
        return self.iteration_s(num_tokens, num_seqs, 0, 0.0)

    def prefill_s_many(self, num_tokens: np.ndarray) -> np.ndarray:
        """`prefill_s` of one sequence for each prompt length in an array (the dispatcher's p_j)."""
        n = np.asarray(num_tokens, dtype=np.float64)
        flops = self._lin_flops * n + self._head_flops + self._attn_flops * n * (n + 1) / 2
        if self._weights_read is None:
            weights = self._dense_weights_read
        else:
            weights = self._weights_read[np.clip(n.astype(np.int64), 0, len(self._weights_read) - 1)]
        num_bytes = weights + n * self.kv_bytes_per_token
        ms = np.maximum(flops * self._flop_s, num_bytes * self._byte_s) + self._overhead_ms
        if self.tp > 1:
            ms = ms + self._ar0_ms + self._ar1_ms * n
        return ms / 1e3

    def kv_transfer_s(self, num_tokens: int, link_bytes_per_s: float) -> float:
        """Moving a request's KV cache from its prefill instance to its decode instance over the device link."""
        return num_tokens * self.kv_bytes_per_token / link_bytes_per_s

    def load_times(self) -> LoadTimes:
        rm = self.roofline
        return LoadTimes(h2d_s=rm.h2d_load_ms() / 1e3, d2d_s=rm.d2d_load_ms() / 1e3, net_s=rm.net_load_ms() / 1e3,
                         disk_s=rm.disk_load_ms() / 1e3)


class FastRoofline(RooflineModel):
    """The oracle's roofline with its two step-time methods answered by a `StepCost` (same formulas in plain
    floats). The oracle's attainment runs an equilibrium iteration that calls `decode_step_ms` ~20 times per
    (model, replica count); with the numpy-scalar path that was a fifth of a Janus run. Build with `fast_roofline`."""

    _cost: StepCost

    def decode_step_ms(self, batch_size: int | float, total_context_tokens: int | float) -> float:
        if batch_size < 1 or total_context_tokens < 0:
            raise ValueError("decode_step_ms: batch_size >= 1 and total_context_tokens >= 0")
        return 1e3 * self._cost.iteration_s(0, 0, batch_size, total_context_tokens)

    def prefill_ms(self, num_tokens, num_seqs: int = 1):
        if num_seqs != 1:
            return super().prefill_ms(num_tokens, num_seqs)
        n = np.asarray(num_tokens, dtype=float)
        if np.any(n < 0):
            raise ValueError("prefill_ms: num_tokens >= 0 and num_seqs >= 1")
        out = 1e3 * self._cost.prefill_s_many(n)
        return float(out) if out.ndim == 0 else out


def fast_roofline(cost: StepCost) -> RooflineModel:
    """`cost.roofline` answering through `cost` (MoE shapes, whose weight reads grow with fractional token counts,
    keep the plain roofline)."""
    rm = cost.roofline
    if rm.shape.is_moe:
        return rm
    fast = FastRoofline.__new__(FastRoofline)
    fast.__dict__.update(rm.__dict__)
    fast._cost = cost
    return fast


_CACHE: dict[tuple, StepCost] = {}


def step_cost(device: DeviceSpec, shape: ModelShape, tp: int, efficiency: Efficiency | None = None) -> StepCost:
    """A shared `StepCost` per (device, shape, tp, efficiency): building one costs milliseconds (MoE: ~0.1 s)."""
    key = (device, shape, tp, efficiency)
    if key not in _CACHE:
        _CACHE[key] = StepCost(RooflineModel(device, shape, tp, efficiency))
    return _CACHE[key]


def min_tp(device: DeviceSpec, shape: ModelShape, max_weight_share: float = 0.7,
           efficiency: Efficiency | None = None) -> int:
    """The smallest tensor-parallel degree (a power of two dividing the heads) at which the weights take at most
    `max_weight_share` of each device's usable memory, leaving the rest for KV cache."""
    eff = efficiency or Efficiency()
    tp = 1
    while tp <= 64:
        if shape.num_heads % tp == 0:
            rm = RooflineModel(device, shape, tp, eff)
            if rm.weight_bytes <= max_weight_share * device.hbm_bytes * eff.memory_utilization:
                return tp
        tp *= 2
    raise ValueError(f"{shape.name} does not fit on up to 64 x {device.name}")

"""The analytic roofline model: device spec + model shape -> step times, memory, load times, needs, attainment.

Pure (numpy only, no torch): the simulator uses it as ground truth and the oracle answers with it for a model that
has no fitted GP yet. Formulas in docs/oracle.md ("Roofline model").

A step takes max(compute time, memory time) + tensor-parallel communication + a fixed per-step overhead, where
compute time = FLOPs / (peak * mfu) and memory time = bytes / (HBM bandwidth * mbu). All figures are per device of
the model's tensor-parallel group unless a name says otherwise.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from contracts import LoadFeatures, NeedVector

from .attainment import LoadPoint, token_attainment
from .specs import DeviceSpec, ModelShape


@dataclass(frozen=True)
class Efficiency:
    """How close real kernels come to the roofline. Defaults are typical of a tuned serving engine on a GPU
    (vLLM-class: ~50 % of peak FLOP/s in prefill GEMMs, ~80 % of HBM bandwidth in decode);
    oracle/profile/calibrate.py fits them to measured engine steps."""

    mfu: float = 0.5
    mbu: float = 0.8
    step_overhead_ms: float = 0.3
    allreduce_latency_ms: float = 0.01
    memory_utilization: float = 0.9  # share of HBM the engine may use (the rest: runtime, workspace)
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192  # the engine's token budget per step: a busy prefill engine's step size

    def __post_init__(self) -> None:
        if not (0 < self.mfu <= 1 and 0 < self.mbu <= 1 and 0 < self.memory_utilization <= 1):
            raise ValueError("Efficiency: mfu, mbu and memory_utilization must be in (0, 1]")
        if self.step_overhead_ms < 0 or self.allreduce_latency_ms < 0 or self.max_num_seqs < 1:
            raise ValueError("Efficiency: overheads must be >= 0 and max_num_seqs >= 1")
        if self.max_num_batched_tokens < 1:
            raise ValueError("Efficiency: max_num_batched_tokens must be >= 1")


@dataclass(frozen=True)
class Equilibrium:
    """Steady state of one replica under open-loop load, with continuous batching.

    The decode batch B solves Little's law B = output_rate * TPOT(B), TPOT(B) = decode_step_ms(B) / (1 - prefill
    share); the iteration from B = 1 converges to the least fixed point. Overloaded: prefill alone takes the whole
    device, or the batch the load needs passes max_num_seqs / the KV capacity."""

    rate_rps: float
    output_rate_tps: float
    prefill_busy_share: float
    decode_batch: float  # sequences per decode step (>= 1 when decoding at all)
    decode_concurrency: float  # mean sequences decoding (Little's law; < 1 when often idle)
    tpot_ms: float
    is_overloaded: bool


class RooflineModel:
    """Roofline step times and resource needs of one model (shape) on one kind of device, split over `tp` devices."""

    def __init__(self, device: DeviceSpec, shape: ModelShape, tp: int = 1, efficiency: Efficiency | None = None):
        shape.check_tp(tp)
        self.device = device
        self.shape = shape
        self.tp = tp
        self.efficiency = efficiency or Efficiency()

    @property
    def is_fitting(self) -> bool:
        """Whether the weights fit on the group with room for KV. A shape that does not fit is still a valid
        question (what would it need?), but it cannot serve."""
        return self.max_num_kv_tokens > 0

    # --- memory ------------------------------------------------------------------------------------------------
    @cached_property  # (and the three below) device, shape, tp and efficiency never change once set
    def total_weight_bytes(self) -> float:
        return self.shape.num_params * self.shape.bytes_per_param

    @cached_property
    def weight_bytes(self) -> float:
        """Weight bytes on each device of the group (everything split evenly by tensor parallelism)."""
        return self.total_weight_bytes / self.tp

    @cached_property
    def kv_bytes_per_token(self) -> float:
        """KV-cache bytes one token of context takes on each device. GQA splits KV heads over the group (a head is
        replicated when there are fewer KV heads than devices); MLA's latent vector is replicated on every device."""
        s = self.shape
        if s.is_mla:
            per_layer = s.kv_elements_per_token_per_layer
        else:
            kv_heads_per_device = max(1, -(-s.num_kv_heads // self.tp))
            per_layer = 2 * kv_heads_per_device * s.head_dim
        return float(per_layer * s.num_layers * s.kv_bytes_per_element)

    @cached_property
    def max_num_kv_tokens(self) -> int:
        """Tokens of KV cache that fit on each device beside the weights (0 when the weights do not fit)."""
        free_bytes = self.device.hbm_bytes * self.efficiency.memory_utilization - self.weight_bytes
        return max(0, int(free_bytes // self.kv_bytes_per_token))

    # --- load times --------------------------------------------------------------------------------------------
    def h2d_load_ms(self) -> float:
        """Warm -> Active: pinned host memory to device, every device of the group in parallel."""
        return 1e3 * self.weight_bytes / self.device.h2d_bytes_per_s

    def d2d_load_ms(self) -> float:
        """Fork: pull the weights of a live replica over the device-to-device link, devices in parallel."""
        return 1e3 * self.weight_bytes / self.device.d2d_bytes_per_s

    def net_load_ms(self) -> float:
        """Warm elsewhere -> Active: pull the weights from another host's pinned memory over the network (RDMA),
        every device of the group its own shard; infinite where the device spec knows no network."""
        if self.device.net_bytes_per_s <= 0:
            return float("inf")
        return 1e3 * self.weight_bytes / self.device.net_bytes_per_s

    def disk_load_ms(self) -> float:
        """Cold -> Active: read from disk into host memory, then copy to the device (not overlapped)."""
        return 1e3 * self.weight_bytes / self.device.disk_bytes_per_s + self.h2d_load_ms()

    # --- FLOPs and bytes of one step ---------------------------------------------------------------------------
    def _attn_flops_per_context_token(self) -> float:
        """FLOPs of one query token against one context token, whole model (QK^T and PV, 2 FLOPs per MAC)."""
        s = self.shape
        if s.is_mla:  # absorbed MLA: scores and values in the latent space
            qk_dim, v_dim = s.kv_lora_rank + s.qk_rope_head_dim, s.kv_lora_rank
        else:
            qk_dim = v_dim = s.head_dim
        return 2.0 * s.num_layers * s.num_heads * (qk_dim + v_dim)

    def weights_read_bytes(self, num_tokens: np.ndarray | float) -> np.ndarray | float:
        """Weights one forward pass over `num_tokens` tokens reads, per device: everything for a dense model; for an
        MoE, only the routed experts some token picked (expected distinct experts E * (1 - (1 - k/E)^n))."""
        s = self.shape
        if not s.is_moe:
            return self.weight_bytes + 0.0 * np.asarray(num_tokens)
        routed_bytes = s.num_moe_layers * s.num_experts * s.expert_params * s.bytes_per_param
        share_touched = 1.0 - (1.0 - s.num_active_experts / s.num_experts) ** np.maximum(num_tokens, 1.0)
        return (self.total_weight_bytes - routed_bytes * (1.0 - share_touched)) / self.tp

    def _allreduce_ms(self, num_tokens: np.ndarray | float) -> np.ndarray | float:
        if self.tp == 1:
            return 0.0 * np.asarray(num_tokens)
        # Two all-reduces per layer of num_tokens * hidden activations (bf16); a ring moves 2(tp-1)/tp of it.
        ring_bytes = 2.0 * (self.tp - 1) / self.tp * num_tokens * self.shape.hidden_size * 2.0
        num_allreduces = 2 * self.shape.num_layers
        return num_allreduces * (1e3 * ring_bytes / self.device.d2d_bytes_per_s + self.efficiency.allreduce_latency_ms)

    def _step_ms(self, flops: np.ndarray, num_bytes: np.ndarray, num_tokens: np.ndarray) -> np.ndarray:
        compute_ms = 1e3 * flops / self.tp / (self.device.peak_bf16_flops_per_s * self.efficiency.mfu)
        memory_ms = 1e3 * num_bytes / (self.device.hbm_bytes_per_s * self.efficiency.mbu)
        return np.maximum(compute_ms, memory_ms) + self._allreduce_ms(num_tokens) + self.efficiency.step_overhead_ms

    def prefill_flops(self, num_tokens: np.ndarray | float, num_seqs: int = 1) -> np.ndarray | float:
        """Whole-model FLOPs to prefill `num_tokens` prompt tokens split evenly over `num_seqs` sequences (causal
        attention: token i of a sequence sees i tokens; logits only for each sequence's last token)."""
        s = self.shape
        linear = 2.0 * (s.num_active_params - s.vocab_size * s.hidden_size) * num_tokens
        lm_head = 2.0 * s.vocab_size * s.hidden_size * num_seqs
        seq_len = np.asarray(num_tokens, dtype=float) / num_seqs
        attn = self._attn_flops_per_context_token() * num_seqs * seq_len * (seq_len + 1) / 2.0
        return linear + lm_head + attn

    def prefill_ms(self, num_tokens: int | float | np.ndarray, num_seqs: int = 1) -> float | np.ndarray:
        """Time to prefill `num_tokens` prompt tokens over `num_seqs` sequences in one step (array in, array out)."""
        n = np.asarray(num_tokens, dtype=float)
        if np.any(n < 0) or num_seqs < 1:
            raise ValueError("prefill_ms: num_tokens >= 0 and num_seqs >= 1")
        num_bytes = self.weights_read_bytes(n) + n * self.kv_bytes_per_token
        out = self._step_ms(self.prefill_flops(n, num_seqs), num_bytes, n)
        return float(out) if out.ndim == 0 else out

    def decode_flops(self, batch_size: float, total_context_tokens: float) -> float:
        s = self.shape
        return 2.0 * s.num_active_params * batch_size + self._attn_flops_per_context_token() * total_context_tokens

    def decode_bytes(self, batch_size: float, total_context_tokens: float) -> float:
        """HBM bytes one decode step moves per device: the weights it touches, the KV it reads, the KV it writes."""
        return float(self.weights_read_bytes(batch_size)
                     + (total_context_tokens + batch_size) * self.kv_bytes_per_token)

    def decode_step_ms(self, batch_size: int | float, total_context_tokens: int | float) -> float:
        """One decode step for `batch_size` sequences holding `total_context_tokens` tokens of context in all."""
        if batch_size < 1 or total_context_tokens < 0:
            raise ValueError("decode_step_ms: batch_size >= 1 and total_context_tokens >= 0")
        b = np.asarray(float(batch_size))
        flops = np.asarray(self.decode_flops(batch_size, total_context_tokens))
        num_bytes = np.asarray(self.decode_bytes(batch_size, total_context_tokens))
        return float(self._step_ms(flops, num_bytes, b))

    # --- a replica under load ----------------------------------------------------------------------------------
    def equilibrium(self, features: LoadFeatures, num_replicas: int = 1,
                    prefill_mean_ms: float | None = None) -> Equilibrium:
        """Steady state of one of `num_replicas` replicas that share the load evenly (see `Equilibrium`).
        `prefill_mean_ms`: the mean prefill over the window's prompt-length quantiles, when the caller has it
        (it does not depend on the replica count)."""
        point = LoadPoint.of(features, num_replicas)
        if prefill_mean_ms is None:
            prefill_mean_ms = float(np.mean(self.prefill_ms(point.input_len_quantiles())))
        prefill_share = point.rate_rps * prefill_mean_ms / 1e3
        out_rate = point.rate_rps * features.output_len_mean
        ctx_per_seq = features.input_len_mean + features.output_len_mean / 2.0
        max_batch = max(1.0, min(float(self.efficiency.max_num_seqs),
                                 self.max_num_kv_tokens / max(ctx_per_seq, 1.0)))
        slowdown = 1.0 / max(1.0 - prefill_share, 1e-3)
        batch = 1.0
        for _ in range(100):
            needed = out_rate * self.decode_step_ms(batch, batch * ctx_per_seq) * slowdown / 1e3
            new_batch = min(max_batch, max(1.0, needed))
            if abs(new_batch - batch) <= 1e-4 * batch:
                break
            batch = new_batch
        tpot_ms = self.decode_step_ms(batch, batch * ctx_per_seq) * slowdown
        concurrency = out_rate * tpot_ms / 1e3
        is_overloaded = prefill_share >= 1.0 or concurrency > max_batch * (1 + 1e-6)
        return Equilibrium(rate_rps=point.rate_rps, output_rate_tps=out_rate, prefill_busy_share=prefill_share,
                           decode_batch=batch, decode_concurrency=concurrency, tpot_ms=tpot_ms,
                           is_overloaded=is_overloaded)

    def decode_token_cost_ratio(self, features: LoadFeatures, tpot_slo_ms: float) -> float:
        """Device time of one decode token over one prefill token, each on an engine busy with its phase alone (how
        a prefill/decode split shares instances out): a prefill engine's step holds `max_num_batched_tokens` of
        prompts (at least one), a decode engine's step the largest batch that its KV cache holds and that steps
        within the TPOT SLO, its sequences holding `decode_context_per_seq` tokens each. On a GPU a decode token
        costs several prefill tokens; on a device whose decode batch is large and whose prefill is compute-bound it
        can be near 1 (docs/oracle.md, "Prefill and decode")."""
        if tpot_slo_ms <= 0:
            raise ValueError("tpot_slo_ms must be > 0")
        prompt = max(features.input_len_mean, 1.0)
        num_prompts = max(1, int(self.efficiency.max_num_batched_tokens // prompt))
        prefill_ms_per_token = float(self.prefill_ms(num_prompts * prompt, num_prompts)) / (num_prompts * prompt)
        ctx_per_seq = decode_context_per_seq(features)
        most = max(1, int(min(self.efficiency.max_num_seqs, self.max_num_kv_tokens / max(ctx_per_seq, 1.0))))
        low, high = 1, most  # the largest batch within the SLO: the step time grows with the batch
        while low < high:
            mid = (low + high + 1) // 2
            if self.decode_step_ms(mid, mid * ctx_per_seq) <= tpot_slo_ms:
                low = mid
            else:
                high = mid - 1
        decode_ms_per_token = self.decode_step_ms(low, low * ctx_per_seq) / low
        return decode_ms_per_token / max(prefill_ms_per_token, 1e-12)

    def paced_decode_steps_per_s(self, output_rate_tps: float, tpot_slo_ms: float) -> float:
        """Decode steps per second the load needs when every step carries as many tokens as the TPOT SLO allows:
        with R tokens/s and steps every S ms, sequences batch up to R*S per step (Little's law), and the engine is
        decoding a 1 - exp(-R*S) share of the time (Poisson occupancy). So min(R, (1 - exp(-R*S)) / S)."""
        slo_s = tpot_slo_ms / 1e3
        if output_rate_tps <= 0:
            return 0.0
        return min(output_rate_tps, -np.expm1(-output_rate_tps * slo_s) / slo_s)

    def needs(self, features: LoadFeatures, tpot_slo_ms: float = 50.0) -> NeedVector:
        """What one replica serving this load needs, as fractions of ONE device, summed over the tensor-parallel
        group (a tp=4 model whose weights fill its devices needs ~4 in HBM). Additive, so models that fit side by
        side sum to <= 1 in every dimension:

        - hbm: weights + KV of the requests in flight at a high percentile (mean + 2 sqrt(mean) sequences);
        - compute: share of device time the work takes when decode steps are paced to the TPOT SLO (a lone engine
          spins faster than that, back to back, so its busy share overstates what it needs beside others);
        - bandwidth: HBM bytes per second at that pace (weights once per step, KV read and written) over the
          device's HBM bandwidth."""
        if tpot_slo_ms <= 0:
            raise ValueError("tpot_slo_ms must be > 0")
        eq = self.equilibrium(features, 1)
        ctx_per_seq = features.input_len_mean + features.output_len_mean / 2.0
        steps_per_s = self.paced_decode_steps_per_s(eq.output_rate_tps, tpot_slo_ms)
        tokens_per_step = eq.output_rate_tps / steps_per_s if steps_per_s > 0 else 1.0
        decode_share = steps_per_s * self.decode_step_ms(tokens_per_step, tokens_per_step * ctx_per_seq) / 1e3
        decode_bytes_per_s = steps_per_s * self.decode_bytes(tokens_per_step, tokens_per_step * ctx_per_seq)
        prefill_bytes_per_s = eq.rate_rps * float(
            self.weights_read_bytes(features.input_len_mean) + features.input_len_mean * self.kv_bytes_per_token)
        # Requests in flight: decoding ones plus prompts in prefill.
        in_flight = eq.decode_concurrency + eq.prefill_busy_share
        kv_tokens = min(float(self.max_num_kv_tokens), (in_flight + 2.0 * np.sqrt(in_flight)) * ctx_per_seq)
        hbm_bytes = self.weight_bytes + kv_tokens * self.kv_bytes_per_token
        return NeedVector(hbm=self.tp * hbm_bytes / self.device.hbm_bytes,
                          compute=self.tp * (eq.prefill_busy_share + decode_share),
                          bandwidth=self.tp * (decode_bytes_per_s + prefill_bytes_per_s) / self.device.hbm_bytes_per_s)

    def attainment(self, features: LoadFeatures, num_replicas: int, ttft_slo_ms: float, tpot_slo_ms: float) -> float:
        """Token-level SLO attainment with `num_replicas` replicas sharing the load evenly (oracle/attainment.py):
        0 when overloaded, non-decreasing in num_replicas."""
        return self.attainment_many(features, (num_replicas,), ttft_slo_ms, tpot_slo_ms)[0]

    def attainment_many(self, features: LoadFeatures, replicas: Sequence[int], ttft_slo_ms: float,
                        tpot_slo_ms: float) -> list[float]:
        """`attainment` for several replica counts of one load: the prompt-length quantiles and their prefill
        times, which do not depend on the count, are worked out once."""
        if ttft_slo_ms <= 0 or tpot_slo_ms <= 0:
            raise ValueError("SLOs must be > 0 ms")
        prefill_ms, prefill_mean_ms = _quantile_prefills(self, features.input_len_mean, features.input_len_var)
        out = []
        for m in replicas:
            eq = self.equilibrium(features, m, prefill_mean_ms)
            if eq.is_overloaded:
                out.append(0.0)
                continue
            out.append(token_attainment(LoadPoint.of(features, m), prefill_ms, eq.prefill_busy_share, eq.tpot_ms,
                                        ttft_slo_ms, tpot_slo_ms))
        return out


def decode_context_per_seq(features: LoadFeatures) -> float:
    """Mean context of a sequence in a decode batch, in tokens: its prompt plus half its answer, averaged over decode
    steps rather than over requests. A request of o output tokens is in o steps, so an answer of length o weighs o:
    E[o^2] / (2 E[o]) = (mean^2 + var) / (2 mean). With the spread of the headline's answers (CV 1.7-2.5) that is
    2-3x the mean's half, and a decode batch the KV cache holds is that much smaller (docs/oracle.md, "Prefill and
    decode"). Prompts are taken as independent of answer lengths."""
    mean = features.output_len_mean
    if mean <= 0:
        return features.input_len_mean
    return features.input_len_mean + (mean * mean + features.output_len_var) / (2.0 * mean)


@lru_cache(maxsize=4096)
def _quantile_prefills(model: RooflineModel, input_len_mean: float, input_len_var: float) -> tuple[np.ndarray, float]:
    """The prefill time of each prompt-length quantile of a load, and their mean: they depend on the lengths alone,
    and the elastic scaler's searches ask the same load at many replica counts, tick after tick. (The array is
    shared between callers: read it, never write it.)"""
    point = LoadPoint(0.0, input_len_mean, input_len_var, 0.0)
    prefill_ms = np.asarray(model.prefill_ms(point.input_len_quantiles()))
    prefill_ms.flags.writeable = False
    return prefill_ms, float(np.mean(prefill_ms))

"""The profiling harness: drive a model's engines with synthetic open-loop load over a grid of rates, length mixes
and replica counts; measure what each setting used and achieved; write a TrainingSet (JSON).

The harness drives engines it is given (`Profiler.new_engine`), never imports one: the worker's engine on this CPU is
the operator tools' target (ops/profile.py: EngineProfiler, `janus profile`, `python -m ops.profile`), the
simulator's devices are another (sim/profile_device.py). The oracle stays independent of the worker (the services
are independent layers: docs/architecture.md, "Layers").
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from contracts import LoadFeatures, SamplingParams

from ..core.dataset import CapacitySample, ElasticitySample, TrainingSet
from ..training_files import save_training_set
from ..core.oracle import roofline_meta
from ..cpu_device import calibrate_cpu
from ..roofline import Efficiency, RooflineModel
from ..specs import DeviceSpec, ModelShape
from .calibrate import StepSample, fit_efficiency
from .grid import GridPoint, LengthMix
from .measure import attainment, replica_needs
from .virtual_clock import run_virtual
from .step_cost import fit_step_cost, measure_step_costs
from .workload import SyntheticRequest, synth_requests

MIB = 1 << 20
MIN_PILOT_REQUESTS = 8  # the knee search's first pilot has at least this many arrivals
CLOCKS = ("thread_cpu", "wall", "step_cost")
LIFETIME_ANSWERS = ("mean", "in-flight")
_CLOCK_NOTES = {"thread_cpu": "measured thread CPU time", "wall": "measured wall time",
                "step_cost": "cost by its shape (step_cost.py, fitted at start)"}

DEFAULT_MIXES = (
    LengthMix("short", input_len_mean=64, input_len_cv=0.5, output_len_mean=32),
    LengthMix("chat", input_len_mean=256, input_len_cv=1.0, output_len_mean=64),
    LengthMix("long", input_len_mean=768, input_len_cv=0.5, output_len_mean=24),
)


@dataclass(frozen=True)
class HarnessSettings:
    duration_s: float = 2.0  # virtual seconds of arrivals per grid point
    drain_s: float = 0.5  # virtual seconds after the last arrival before unfinished tokens count as late
    # SLOs scaled to what the CPU engine can do (demo-tiny: a decode step ~1 ms of CPU at batch 1, ~5 ms at 16),
    # tight enough that attainment falls gradually with the batch rather than only at saturation
    ttft_slo_ms: float = 100.0
    tpot_slo_ms: float = 10.0
    kv_cache_bytes: int = 64 * MIB
    max_num_seqs: int = 64
    torch_threads: int = 1  # one thread per step: steadier timings on a shared machine
    # How a step advances its replica's clock: "thread_cpu" = CPU time of the engine thread (time.thread_time),
    # which leaves out time other tenants of a shared machine take from it (measured here under load: a 700-token
    # prefill 18-19 ms CPU vs 39-47 ms wall, p90 61 ms); "wall" = time.perf_counter, for a dedicated machine;
    # "step_cost" = what a step of that shape costs at the machine's quietest (step_cost.py, fitted at start to the
    # quickest of repeated thread CPU timings): the labels stop following the other tenants' drift. The default:
    # the same session's profiles missed the paper's held-out P90 attainment error with thread_cpu on one set of
    # two and met it with step_cost on every set, needs errors halved (docs/bench/oracle.md).
    clock: str = "step_cost"
    # Scale each grid point's clock by how fast the machine runs the engine just before it, against its quietest
    # (speed.py), meant to take the shared machine's drift out of the labels. Off: measured, it did not do so
    # reliably (docs/bench/oracle.md).
    is_speed_corrected: bool = False
    seed: int = 0
    step_cost_rounds: int = 3  # passes over every step shape when fitting the step-cost clock (quickest kept)
    # The memory the engine is given, weights + KV (its KV budget is this less the weights): what HBM needs are
    # fractions of. None: the weights + kv_cache_bytes. `janus profile` sets the cluster's worker page pool, the
    # device the oracle service's roofline assumes for a CPU worker, so profiled and roofline needs share a unit.
    hbm_bytes: int | None = None
    # A point's arrivals span less than duration_s when it would otherwise send more requests than this (None: no
    # cap): far past the knee a point costs as much as its requests and says no more than a shorter one. Needed
    # where the target is fast (simulated devices: sim/oracle_training.py); never reached on this CPU.
    max_requests_per_point: int | None = None
    min_duration_s: float = 1.0  # the shortest a capped point's arrivals span
    # A point's arrivals span at least this many lifetimes of its mean request (TTFT SLO plus the mean output at the
    # TPOT SLO; `request_lifetime_s`), so the decode batch reaches what the load holds: it grows for up to a
    # lifetime after the first arrival, and a shorter point sees one replica hold loads it cannot (the simulated
    # die's 32B kind: 8 s points of 500-token answers at a 68 ms TPOT, a 35 s lifetime, measured one replica at 1.0
    # where its batch would need 600 sequences; docs/bench/sim.md run 31). 0: duration_s alone.
    min_request_lifetimes: float = 2.0
    # Which answer a lifetime is counted in (`lifetime_output_len`): "mean", the mix's mean answer, or "in-flight",
    # the answer a sequence in flight has on average, mean + variance / mean. A heavy-tailed mix's decode KV fills
    # over the latter: the simulated die's 32B mixes have mean answers of 19-578 tokens and in-flight ones of
    # 319-2,437. Points that long met 0.99 on every seed of the headline, on 17-19 % more device-hours
    # (docs/bench/sim.md run 48): "mean" by default.
    lifetime_answer: str = "mean"

    def __post_init__(self) -> None:
        if self.duration_s <= 0 or self.drain_s < 0 or self.ttft_slo_ms <= 0 or self.tpot_slo_ms <= 0:
            raise ValueError("HarnessSettings: positive duration and SLOs, non-negative drain")
        if self.step_cost_rounds < 1:
            raise ValueError("HarnessSettings.step_cost_rounds must be >= 1")
        if self.min_request_lifetimes < 0:
            raise ValueError("HarnessSettings.min_request_lifetimes must be >= 0")
        if self.max_requests_per_point is not None and self.max_requests_per_point < 1 or self.min_duration_s <= 0:
            raise ValueError("HarnessSettings: max_requests_per_point >= 1 (or None), min_duration_s > 0")
        if self.hbm_bytes is not None and self.hbm_bytes <= 0:
            raise ValueError("HarnessSettings.hbm_bytes must be > 0")
        if self.clock not in CLOCKS:
            raise ValueError(f"HarnessSettings.clock: one of {', '.join(CLOCKS)}, not {self.clock!r}")
        if self.lifetime_answer not in LIFETIME_ANSWERS:
            raise ValueError(f"HarnessSettings.lifetime_answer: one of {', '.join(LIFETIME_ANSWERS)}, not "
                             f"{self.lifetime_answer!r}")
        if self.clock != "wall" and self.torch_threads != 1:
            raise ValueError(f"{self.clock} clock needs torch_threads=1 (other threads' work would go uncounted)")
        if self.clock == "step_cost" and self.is_speed_corrected:
            raise ValueError("the speed probe corrects measured step times; the step_cost clock measures none")

    @property
    def timer(self) -> Callable[[], float]:
        return time.perf_counter if self.clock == "wall" else time.thread_time


def step_probe(engine) -> tuple[int, int, int, int]:
    """Prefill and decode tokens of the step just run (the engine's public `last_step`), context tokens of the
    running batch, KV bytes held."""
    last = engine.last_step
    num_prefill, num_decode = (last.num_prefill_tokens, last.num_decode_tokens) if last is not None else (0, 0)
    context = sum(seq.num_computed_tokens for seq in engine.scheduler.running)
    kv_bytes = max(engine.block_manager.num_used_blocks - 1, 0) * engine.kv_block_num_bytes
    return int(num_prefill), int(num_decode), int(context), int(kv_bytes)


def measure_isolated_steps(engine, vocab_size: int, timer: Callable[[], float], repeats: int = 3) \
        -> list[StepSample]:
    """Time single prefills of several lengths and decode steps of several batch sizes (the roofline calibration)."""
    rng = np.random.default_rng(0)
    samples: list[StepSample] = []
    counter = 0

    def timed_step() -> float:
        started = timer()
        engine.step()
        return (timer() - started) * 1e3

    for _ in range(repeats):
        for n in (16, 64, 256, 768):
            counter += 1
            engine.add_request(f"calib-p{counter}", rng.integers(1, vocab_size, n).tolist(),
                               SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
            samples.append(StepSample(timed_step(), num_prefill_tokens=n))
        for batch in (1, 4, 16, 48):
            prompt_len = 128
            for i in range(batch):
                counter += 1
                engine.add_request(f"calib-d{counter}", rng.integers(1, vocab_size, prompt_len).tolist(),
                                   SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
            engine.step()  # the prefills
            for k in range(2):
                samples.append(StepSample(timed_step(), batch_size=batch, context_tokens=batch * (prompt_len + k + 1)))
            while engine.has_unfinished():
                engine.step()
    return samples


def cpu_device_for(weight_bytes: float, kv_cache_bytes: int) -> DeviceSpec:
    """This CPU as measured, with 'HBM' = what the engine may hold (its weights + KV budget), so HBM needs are
    fractions of the memory the engine was given rather than of the whole machine's RAM."""
    return replace(calibrate_cpu(), hbm_bytes=int(weight_bytes + kv_cache_bytes))


def request_lifetime_s(output_len_mean: float, settings: HarnessSettings) -> float:
    """How long the mean request lives when served at its SLOs: time to first token, then its output at the TPOT."""
    return settings.ttft_slo_ms / 1e3 + output_len_mean * settings.tpot_slo_ms / 1e3


def lifetime_output_len(mix: LengthMix, settings: HarnessSettings) -> float:
    """The answer, in tokens, a point's lifetimes are counted in (`HarnessSettings.lifetime_answer`): the mix's mean,
    or the answer in flight, mean + variance / mean (a sequence is in flight for as long as its answer, so the
    sequences in flight at a moment are length-biased: E[o^2] / E[o])."""
    mean = mix.output_len_mean
    if settings.lifetime_answer == "mean" or mean <= 0:
        return mean
    return mean + mix.output_len_var / mean


def point_duration_s(output_len: float, settings: HarnessSettings, base_s: float | None = None) -> float:
    """How long a run's arrivals span: `base_s` (a grid point's: `duration_s`; a pilot's: the plan's pilot length),
    or `min_request_lifetimes` lifetimes of an `output_len`-token answer (`lifetime_output_len`) if longer (before
    `max_requests_per_point` shortens a run past the knee)."""
    base_s = settings.duration_s if base_s is None else base_s
    return max(base_s, settings.min_request_lifetimes * request_lifetime_s(output_len, settings))


def is_pilot_long_enough(features: LoadFeatures, horizon_s: float, settings: HarnessSettings) -> bool:
    """Whether a pilot of `horizon_s` (arrivals and drain) lets its mean request finish on time: TTFT plus its mean
    output at the TPOT SLO. A shorter one scores the start of each request and never the queue that long answers
    build: on the simulated die's 32B kind, 8 s pilots of 577-token answers at a 68 ms TPOT put one replica's knee
    near 27 requests a second, and the GP then saw one replica hold loads the device misses entirely; the scaler
    sized that kind short (docs/bench/sim.md, run 29)."""
    return request_lifetime_s(features.output_len_mean, settings) <= horizon_s


def capacity_rps(roofline: RooflineModel, mix: LengthMix, ttft_slo_ms: float, tpot_slo_ms: float) -> float:
    """Largest per-replica request rate at which the roofline still attains 0.5 (bisection in log space)."""
    def ok(rate: float) -> bool:
        point = GridPoint(rate, mix, 1)
        return roofline.attainment(point.features, 1, ttft_slo_ms, tpot_slo_ms) >= 0.5

    lo, hi = 1e-3, 1e4
    if not ok(lo):
        return lo
    for _ in range(40):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def stratified_grid(capacities_rps: dict[str, float], mixes: Sequence[LengthMix], replicas: Sequence[int],
                    bands: Sequence[tuple[float, float]], settings: HarnessSettings) -> list[GridPoint]:
    """For each (mix, m): one load per band, drawn log-uniformly inside the band (x m x the mix's per-replica
    capacity). Bands below, around and past 1 put every m below, at and past its knee with few points (the quick
    profile); the draws keep held-out points off shared grid lines, as random_grid does."""
    if not bands or any(not 0 < lo <= hi for lo, hi in bands):
        raise ValueError(f"stratified_grid: bands are (lo, hi) with 0 < lo <= hi, got {bands}")
    rng = np.random.default_rng(settings.seed)
    grid = []
    for mix in mixes:
        cap = capacities_rps[mix.name]
        for m in replicas:
            factors = [math.exp(rng.uniform(math.log(lo), math.log(hi))) for lo, hi in bands]
            grid.extend(GridPoint(float(f * cap * m), mix, m) for f in sorted(factors))
    return grid


def random_grid(capacities_rps: dict[str, float], mixes: Sequence[LengthMix], replicas: Sequence[int],
                points_per_cell: int, settings: HarnessSettings, load_range: tuple[float, float] = (0.3, 2.0)) \
        -> list[GridPoint]:
    """For each (mix, m): `points_per_cell` loads drawn log-uniformly between load_range x m x the mix's
    per-replica capacity, so every m is seen below, at and beyond its knee (and held-out points fall between
    training points rather than on the same grid lines)."""
    rng = np.random.default_rng(settings.seed)
    grid = []
    for mix in mixes:
        cap = capacities_rps[mix.name]
        for m in replicas:
            factors = np.exp(rng.uniform(math.log(load_range[0]), math.log(load_range[1]), points_per_cell))
            grid.extend(GridPoint(float(f * cap * m), mix, m) for f in sorted(factors))
    return grid


def _features(requests: Sequence[SyntheticRequest], duration_s: float) -> LoadFeatures:
    if not requests:
        return LoadFeatures(token_rate_tps=0.0, input_len_mean=0.0, input_len_var=0.0, output_len_mean=0.0)
    prompts = np.array([r.prompt_len for r in requests], dtype=float)
    outputs = np.array([r.output_len for r in requests], dtype=float)
    return LoadFeatures(token_rate_tps=float((prompts.sum() + outputs.sum()) / duration_s),
                        input_len_mean=float(prompts.mean()), input_len_var=float(prompts.var()),
                        output_len_mean=float(outputs.mean()), output_len_var=float(outputs.var()))


class Profiler:
    """Engines for one model (as many as the largest replica count) and the roofline of that model on this CPU.

    The engines come from `new_engine`, which a target supplies: ops/profile.py's EngineProfiler builds the worker's
    engine on this CPU (`janus profile`); this class alone has none (the oracle does not import the worker).

    What a profile needs of its target, so another target can stand in (the simulator profiles its simulated
    devices this way: sim/profile_device.py): `engines` (EngineLike), `vocab_size`, `max_prompt_len`, `roofline`
    (device datasheet and shape, efficiencies fitted to `calibration`), `settings`, `step_cost`, `model_dir`, the
    clock (`_timer`) and `step_probe` (what a step did)."""

    step_probe = staticmethod(step_probe)
    # How a point's m replicas are laid out: (prefill, decode) engines, decode 0 for m colocated ones (None: always
    # colocated). A target whose deployment disaggregates (Janus from `min_num_disaggregated` instances on) profiles
    # the layout its planner will run, so the Elasticity GP answers for it; needs kv_transfer_s and engines with
    # add_prefilled_request (replay.py).
    layout: Callable[[GridPoint], tuple[int, int]] | None = None
    # The synthetic requests' lengths are clipped here: what the CPU engine serves in a point's seconds. A faster
    # target raises them, or a mix with long outputs is profiled lighter than it is (a mean of 669 output tokens
    # clipped at 512 loses a fifth of its decode work).
    workload_max_prompt_len = 4096
    workload_max_output_len = 512

    def __init__(self, model_dir: str | Path, settings: HarnessSettings = HarnessSettings(), max_replicas: int = 4):
        self.settings = settings
        self.model_dir = Path(model_dir)
        first = self.new_engine(settings.kv_cache_bytes)
        hf_config = json.loads((self.model_dir / "config.json").read_text())
        bytes_per_param = first.dtype.itemsize
        self.shape = ModelShape.from_hf_config(hf_config, name=self.model_dir.name, bytes_per_param=bytes_per_param)
        self.shape = replace(self.shape, kv_bytes_per_element=bytes_per_param)
        weight_bytes = self.shape.num_params * bytes_per_param
        self.kv_cache_bytes = settings.kv_cache_bytes
        if settings.hbm_bytes is not None:  # the KV budget is what the given memory leaves beside the weights
            self.kv_cache_bytes = int(settings.hbm_bytes - weight_bytes)
            if self.kv_cache_bytes < 8 * MIB:
                raise ValueError(f"{self.model_dir.name}: {settings.hbm_bytes / MIB:.0f} MiB leaves "
                                 f"{self.kv_cache_bytes / MIB:.0f} MiB beside {weight_bytes / MIB:.0f} MiB of "
                                 "weights, under the 8 MiB of KV a profile needs")
            first = self.new_engine(self.kv_cache_bytes)
        self.engines = [first] + [self.new_engine(self.kv_cache_bytes) for _ in range(max_replicas - 1)]
        engine = self.engines[0]
        self.vocab_size = engine.model_config.vocab_size
        self.max_prompt_len = engine.max_model_len - 1
        uncalibrated = RooflineModel(cpu_device_for(weight_bytes, self.kv_cache_bytes),
                                     self.shape, efficiency=Efficiency(max_num_seqs=settings.max_num_seqs))
        self.probe = None
        if settings.is_speed_corrected:
            from .speed import SpeedProbe

            self.probe = SpeedProbe(self.new_engine(self.kv_cache_bytes), self.vocab_size, settings.timer)
            self.probe.calibrate()
        self.step_cost = None
        if settings.clock == "step_cost":
            self.step_cost = fit_step_cost(measure_step_costs(engine, self.vocab_size, settings.timer,
                                                              rounds=settings.step_cost_rounds))
        self.calibration = measure_isolated_steps(engine, self.vocab_size, self._timer())
        self.roofline = RooflineModel(uncalibrated.device, self.shape,
                                      efficiency=fit_efficiency(uncalibrated, self.calibration))

    def new_engine(self, kv_cache_bytes: int):
        """A fresh engine (EngineLike: add_request, step, has_unfinished, `dtype`, `model_config.vocab_size`,
        `max_model_len`) of the model at `model_dir` with this KV budget, on the device being profiled, set up from
        `self.settings` (max_num_seqs, seed). The target supplies it."""
        raise NotImplementedError(f"{type(self).__name__} has no engine to drive: profile a checkpoint with "
                                  "ops.profile.EngineProfiler (janus profile), or pass profile_checkpoint a "
                                  "make_profiler that builds one")

    def _timer(self) -> Callable[[], float]:
        """The settings' timer, scaled by the probe's speed factor measured now (1 without a probe): differences of
        it are step times as the quiet machine would have taken them."""
        base = self.settings.timer
        self.speed_factor = 1.0 if self.probe is None else self.probe.factor()
        if self.speed_factor == 1.0:
            return base
        factor = self.speed_factor
        return lambda: base() * factor

    def kv_transfer_s(self, num_tokens: int) -> float:
        """Seconds to move `num_tokens` tokens of KV cache from a prefill engine to a decode engine."""
        raise NotImplementedError(f"{type(self).__name__}: the CPU engine takes no computed prompt, so it profiles "
                                  "colocated replicas only (leave `layout` unset)")

    def layout_of(self, point: GridPoint) -> tuple[int, int]:
        """(prefill, decode) engines of the point; (m, 0): colocated."""
        if self.layout is None:
            return point.num_replicas, 0
        num_prefill, num_decode = self.layout(point)
        if num_prefill + num_decode != point.num_replicas or num_prefill < 1 or num_decode < 0:
            raise ValueError(f"layout of m={point.num_replicas}: {num_prefill} prefill + {num_decode} decode")
        return num_prefill, num_decode

    def measured_capacity_rps(self, mix: LengthMix, start_rps: float, duration_s: float = 1.5,
                              max_runs: int = 7, on_run: Callable[[dict], None] | None = None) \
            -> tuple[float, list[dict], list[ElasticitySample]]:
        """The per-replica rate where measured attainment (m = 1, pilot runs) crosses 0.5: double from
        start_rps until it fails, then bisect in log space. Returns the rate, the pilot runs (`on_run` is
        called with each as it ends) and their elasticity samples (source "pilot"): the bisection measures the
        knee densely, where the grid's few loads leave a gap and the GP drew a smooth curve through a sharp one.
        Only pilots long enough for their requests to finish are samples (`is_pilot_long_enough`).

        The search starts no lower than MIN_PILOT_REQUESTS arrivals in a pilot: a pilot with no request scores 1.0
        and says nothing. (demo-small's calibrated roofline put the long mix's knee at 0, below the 100 ms TTFT
        at any rate; from there five doublings measured only empty pilots and the grid got rates of ~0.)"""
        # A pilot spans the request lifetimes a grid point does (`point_duration_s`): a 4 s pilot of 579-token
        # answers at a 60 ms TPOT (a 36 s lifetime) put the simulated die's 14B knee at 4.2 requests a second where
        # the device holds ~1.1; the grid's loads, placed around that knee, then left the real one unmeasured at
        # every m and the GP sized that kind at twice the instances it needs (docs/bench/sim.md, run 33).
        duration_s = point_duration_s(lifetime_output_len(mix, self.settings), self.settings, duration_s)
        ok, bad, runs, samples = None, None, [], []
        rate = max(start_rps, MIN_PILOT_REQUESTS / duration_s)
        for i in range(max_runs):
            _, sample, info = self.run_point(GridPoint(rate, mix, 1), 1_000_000 + len(runs), duration_s)
            runs.append({**info, "attainment": sample.attainment})
            if is_pilot_long_enough(sample.features, duration_s + min(self.settings.drain_s, duration_s),
                                    self.settings):
                samples.append(replace(sample, source="pilot"))
            if on_run:
                on_run(runs[-1])
            if sample.attainment >= 0.5:
                ok = rate
            else:
                bad = rate
            if ok is None:
                rate = rate / 2.0
            elif bad is None:
                rate = rate * 2.0
            else:
                rate = math.sqrt(ok * bad)
        if ok is None:
            return bad or start_rps, runs, samples
        return (math.sqrt(ok * bad) if bad else ok), runs, samples

    def run_point(self, point: GridPoint, index: int, duration_s: float | None = None) \
            -> tuple[list[CapacitySample], ElasticitySample, dict]:
        s = self.settings
        if duration_s is not None:
            s = replace(s, duration_s=duration_s, drain_s=min(s.drain_s, duration_s))
        else:  # a grid point (a pilot keeps its length: is_pilot_long_enough)
            s = replace(s, duration_s=point_duration_s(lifetime_output_len(point.mix, s), s))
        if s.max_requests_per_point is not None and point.rate_rps * s.duration_s > s.max_requests_per_point:
            s = replace(s, duration_s=max(s.min_duration_s, s.max_requests_per_point / point.rate_rps))
        if point.num_replicas > len(self.engines):
            raise ValueError(f"grid asks for {point.num_replicas} replicas, the profiler holds {len(self.engines)}")
        workload = synth_requests(point, s.duration_s, seed=s.seed * 100_003 + index,
                                  max_prompt_len=min(self.max_prompt_len, self.workload_max_prompt_len),
                                  max_output_len=self.workload_max_output_len)
        workload = [r for r in workload if r.prompt_len + r.output_len <= self.max_prompt_len + 1]
        num_prefill, num_decode = self.layout_of(point)
        timer = self._timer()
        started = time.perf_counter()
        result = run_virtual(self.engines[: point.num_replicas], workload, self.vocab_size,
                             end_s=s.duration_s + s.drain_s, probe=self.step_probe, timer=timer,
                             id_prefix=f"g{index}-", seed=index, step_cost=self.step_cost, num_decode=num_decode,
                             transfer_s=self.kv_transfer_s if num_decode else None)
        wall_s = time.perf_counter() - started
        achieved = attainment(list(result.requests.values()), s.ttft_slo_ms, s.tpot_slo_ms,
                              horizon_s=s.duration_s + s.drain_s if result.is_truncated else None)
        by_id = {r.request_id: r for r in workload}
        capacity = []
        # Needs are a colocated replica's (what the steady planner packs); a prefill or a decode engine's are not.
        for replica in result.replicas if not num_decode else ():
            mine = [by_id[rid] for rid in replica.request_ids]
            features = _features(mine, s.duration_s)
            ctx = features.input_len_mean + features.output_len_mean / 2.0
            needs = replica_needs(replica.steps, s.duration_s, self.roofline, s.tpot_slo_ms, ctx)
            capacity.append(CapacitySample(features, needs, source="profile"))
        sample = ElasticitySample(_features(workload, s.duration_s), point.num_replicas, achieved.token,
                                  ttft_attainment=achieved.ttft, tpot_attainment=achieved.tpot,
                                  num_requests=achieved.num_requests, source="profile")
        info = {"rate_rps": point.rate_rps, "mix": point.mix.name, "num_replicas": point.num_replicas,
                "num_decode": num_decode, "duration_s": round(s.duration_s, 3),
                "wall_s": round(wall_s, 2), "is_truncated": result.is_truncated,
                "speed_factor": round(self.speed_factor, 4),
                "num_steps": sum(len(r.steps) for r in result.replicas)}
        if self.step_cost is not None:  # how far the machine was from its quietest meanwhile (1 = as quiet)
            steps = [step for r in result.replicas for step in r.steps]
            info["measured_over_cost"] = round(sum(st.measured_s for st in steps)
                                               / max(sum(st.wall_s for st in steps), 1e-12), 4)
        return capacity, sample, info


def profile_model(profiler: Profiler, grid: Sequence[GridPoint], model: str | None = None,
                  out_path: str | Path | None = None, show_progress: bool = True,
                  on_point: Callable[[int, dict], None] | None = None, extra_meta: dict | None = None) -> TrainingSet:
    """Run every grid point and collect a TrainingSet (saved to out_path when given, after every point, so an
    interrupted profile keeps what it measured)."""
    s = profiler.settings
    out = TrainingSet(model=model or profiler.model_dir.name, device=profiler.roofline.device.name,
                      shape=profiler.shape.name, ttft_slo_ms=s.ttft_slo_ms, tpot_slo_ms=s.tpot_slo_ms,
                      created_unix_s=time.time(),
                      meta={"harness": asdict(s), **roofline_meta(profiler.roofline),
                            "calibration": [asdict(c) for c in profiler.calibration], "points": [],
                            "step_cost": asdict(profiler.step_cost) if profiler.step_cost else None,
                            "note": "replicas on virtual clocks advanced by each engine step's "
                                    + _CLOCK_NOTES[s.clock],
                            **(extra_meta or {})})
    progress = _progress(show_progress)
    with progress:
        task = progress.add_task("profiling", total=len(grid))
        for index, point in enumerate(grid):
            capacity, sample, info = profiler.run_point(point, index)
            out.capacity.extend(capacity)
            out.elasticity.append(sample)
            info = {**info, "attainment": sample.attainment}
            out.meta["points"].append(info)
            if on_point:
                on_point(index, info)
            if out_path:
                save_training_set(out, out_path)
            progress.update(task, advance=1, description=f"{point.mix.name} m={point.num_replicas} "
                                                         f"{point.rate_rps:.1f} rps -> {sample.attainment:.2f}")
    return out


def _progress(enabled: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                    disable=not enabled)

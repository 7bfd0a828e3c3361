"""Profiling the simulated device, as a deployment profiles its hardware: the oracle's own harness
(`oracle.profile.harness`) drives engines on the device and learns from what it measures, never from the device's
parameters.

- `SimulatedEngine`: one replica of a model on one simulated device (or tensor-parallel group), stepped as the
  simulator's executor steps an instance: FCFS admission within the KV cache (prompt and whole output reserved) and
  `max_num_seqs`, chunked prefill within `max_num_batched_tokens` mixed with one decode token per running sequence.
  A request handed over prefilled (`add_prefilled_request`: a decode instance of a prefill/decode-disaggregated
  layout) joins the decode batch as the executor's decode instance admits it: in arrival order, as KV space allows
  (one that does not fit waits, the next is tried), up to `max_num_seqs`.
  Each step takes the device's time: the cost model's iteration time with the device effects applied
  (sim/device_effects.py), which the engine adds to a shared `DeviceClock`.
- `DeviceClock`: the simulated device's time, read by the harness through the same interface as the thread-CPU
  clock (a timer: the difference across a step is what the step took).
- `SimDeviceProfiler`: the harness's `Profiler` over simulated engines: calibration of the roofline's efficiencies
  on measured steps, knee search, grid runs and the training set are the harness's own code.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

from oracle.profile.calibrate import fit_efficiency
from oracle.profile.harness import HarnessSettings, Profiler, measure_isolated_steps
from oracle.roofline import Efficiency, RooflineModel

from .costmodel import StepCost
from .device_effects import DeviceEffects, StepEffects


class DeviceClock:
    """Seconds of simulated device time; engines advance it by each step's time."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


@dataclass
class _Seq:
    request_id: str
    prompt_len: int
    max_tokens: int
    prefilled: int = 0
    num_out: int = 0
    is_reserved: bool = False


@dataclass(frozen=True)
class _Output:
    request_id: str
    token_ids: list
    is_finished: bool


@dataclass(frozen=True)
class _LastStep:
    num_prefill_tokens: int
    num_decode_tokens: int


class SimulatedEngine:
    """A replica on the simulated device (the `EngineLike` of oracle/profile/virtual_clock.py). Tokens are ids of 1."""

    def __init__(self, cost: StepCost, effects: DeviceEffects, clock: DeviceClock, stream: str,
                 max_num_batched_tokens: int = 8192):
        self.cost = cost
        self.clock = clock
        self.effects = None if effects.is_off else StepEffects(effects, stream)
        self.max_num_batched_tokens = max_num_batched_tokens
        self.kv_capacity_tokens = cost.max_num_kv_tokens
        self.kv_used_tokens = 0
        self.waiting: deque[_Seq] = deque()
        self.arrived: deque[_Seq] = deque()  # prefilled elsewhere, KV here, not yet in the batch
        self.running: list[_Seq] = []
        self.last_step: _LastStep | None = None
        self.context_tokens = 0
        self.aborted: set[str] = set()

    def add_request(self, request_id: str, prompt_token_ids, sampling) -> None:
        self.waiting.append(_Seq(request_id, len(prompt_token_ids), max(1, sampling.max_tokens)))

    def add_prefilled_request(self, request_id: str, prompt_len: int, sampling) -> None:
        self.arrived.append(_Seq(request_id, prompt_len, max(1, sampling.max_tokens), prefilled=prompt_len,
                                 num_out=1))

    def has_unfinished(self) -> bool:
        self._drop_aborted()
        return bool(self.waiting or self.running or self.arrived)

    def abort(self, request_id: str) -> None:
        """Drop a request. A profile past its knee ends with tens of thousands unfinished, aborted one by one: the
        queues are filtered once, at the next step or check, not scanned per abort."""
        self.aborted.add(request_id)

    def _drop_aborted(self) -> None:
        if not self.aborted:
            return
        for queue in (self.waiting, self.running, self.arrived):
            kept = [seq for seq in queue if seq.request_id not in self.aborted]
            for seq in queue:
                if seq.request_id in self.aborted and seq.is_reserved:
                    self.kv_used_tokens -= seq.prompt_len + seq.max_tokens
            queue.clear()
            queue.extend(kept)
        self.aborted.clear()

    def _admit_prefilled(self) -> None:
        skipped: deque[_Seq] = deque()
        while self.arrived and len(self.running) < self.cost.max_num_seqs:
            seq = self.arrived.popleft()
            need = seq.prompt_len + seq.max_tokens
            if self.kv_used_tokens + need > self.kv_capacity_tokens:
                if need <= self.kv_capacity_tokens:
                    skipped.append(seq)  # one that never fits is dropped (its tokens stay late), not kept for ever
                continue
            self.kv_used_tokens += need
            seq.is_reserved = True
            self.running.append(seq)
        skipped.extend(self.arrived)
        self.arrived = skipped

    def step(self) -> list[_Output]:
        self._drop_aborted()
        if self.arrived:
            self._admit_prefilled()
        batch = len(self.running)
        budget = self.max_num_batched_tokens - batch
        chunk: list[tuple[_Seq, int]] = []
        num_seqs = batch
        for seq in self.waiting:
            if budget <= 0 or num_seqs >= self.cost.max_num_seqs:
                break
            if not seq.is_reserved:
                need = seq.prompt_len + seq.max_tokens
                if self.kv_used_tokens + need > self.kv_capacity_tokens:
                    break  # head of line: waits for running sequences to free KV
                self.kv_used_tokens += need
                seq.is_reserved = True
            take = min(seq.prompt_len - seq.prefilled, budget)
            chunk.append((seq, take))
            budget -= take
            num_seqs += 1
        prefill_tokens = sum(take for _, take in chunk)
        context = sum(seq.prompt_len + seq.num_out for seq in self.running)
        if not prefill_tokens and not batch:
            self.last_step = _LastStep(0, 0)
            return []
        step_s = self.cost.iteration_s(prefill_tokens, len(chunk), batch, context)
        if self.effects is not None:
            step_s = self.effects.instance_step(step_s, batch, prefill_tokens > 0, False)
            step_s *= self.effects.round_factor(1, 1)
        self.clock.now_s += step_s
        self.last_step = _LastStep(prefill_tokens, batch)
        self.context_tokens = context
        outputs = []
        still = []
        for seq in self.running:  # one decode token each
            seq.num_out += 1
            done = seq.num_out >= seq.max_tokens
            outputs.append(_Output(seq.request_id, [1], done))
            if done:
                self.kv_used_tokens -= seq.prompt_len + seq.max_tokens
            else:
                still.append(seq)
        self.running = still
        for seq, take in chunk:
            seq.prefilled += take
            if seq.prefilled < seq.prompt_len:
                break  # only the last of a chunk can be partial
            self.waiting.popleft()
            seq.num_out = 1  # the first token comes with the prefill
            done = seq.max_tokens <= 1
            outputs.append(_Output(seq.request_id, [1], done))
            if done:
                self.kv_used_tokens -= seq.prompt_len + seq.max_tokens
            else:
                self.running.append(seq)
        return outputs


def sim_step_probe(engine: SimulatedEngine) -> tuple[int, int, int, int]:
    """Prefill and decode tokens of the step just run, the batch's context tokens, KV bytes held."""
    last = engine.last_step or _LastStep(0, 0)
    kv_bytes = engine.kv_used_tokens * engine.cost.kv_bytes_per_token
    return last.num_prefill_tokens, last.num_decode_tokens, engine.context_tokens, int(kv_bytes)


class SimDeviceProfiler(Profiler):
    """The harness's Profiler over `max_replicas` simulated engines of one model (its cost on one kind of device,
    `cost`) with the device's effects. The roofline it reports is the device's datasheet and the model's shape with
    efficiencies fitted to steps measured on the device, as the real-engine profiler fits them on the CPU."""

    step_probe = staticmethod(sim_step_probe)
    workload_max_prompt_len = 16_384  # the simulated devices serve the trace's lengths, not the CPU engine's
    workload_max_output_len = 8_192

    def __init__(self, name: str, cost: StepCost, effects: DeviceEffects, settings: HarnessSettings,
                 max_replicas: int, layout=None):
        self.settings = settings
        self.layout = layout
        self.cost = cost
        self.link_bytes_per_s = cost.roofline.device.d2d_bytes_per_s  # the link the simulator moves KV over
        self.model_dir = _Named(name)
        self.clock = DeviceClock()
        self.engines = [SimulatedEngine(cost, effects, self.clock, f"profile-{name}-{i}")
                        for i in range(max_replicas)]
        datasheet = cost.roofline
        self.shape = datasheet.shape
        self.kv_cache_bytes = int(cost.max_num_kv_tokens * cost.kv_bytes_per_token)
        self.vocab_size = 32_000
        self.max_prompt_len = 16_384
        self.probe = None
        self.step_cost = None
        self.speed_factor = 1.0
        self.calibration = measure_isolated_steps(self.engines[0], self.vocab_size, self.clock)
        uncalibrated = RooflineModel(datasheet.device, self.shape, tp=datasheet.tp,
                                     efficiency=replace(Efficiency(), max_num_seqs=cost.max_num_seqs))
        self.roofline = RooflineModel(datasheet.device, self.shape, tp=datasheet.tp,
                                      efficiency=fit_efficiency(uncalibrated, self.calibration))

    def kv_transfer_s(self, num_tokens: int) -> float:
        return self.cost.kv_transfer_s(num_tokens, self.link_bytes_per_s)

    def _timer(self):
        self.speed_factor = 1.0
        return self.clock


@dataclass(frozen=True)
class _Named:
    """What the harness reads of a checkpoint folder: its name."""

    name: str

"""Serve a synthetic workload with m replicas of a real engine on virtual clocks.

This machine has two shared cores, so m replicas cannot run side by side. Each replica keeps its own virtual
clock instead: the replicas are served in turn, always the one whose clock is earliest, and a step advances that
replica's clock by the time the real `engine.step()` just took (or, with a step-cost model, by what a step of that shape
costs on the quiet machine: step_cost.py). Arrivals are dispatched at their arrival time
to the replica with the fewest outstanding requests. Attainment thus reflects real engine work without needing m
real cores (docs/oracle.md, "Profiling"). The timer is injected, so tests can use a deterministic one.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import numpy as np

from contracts import SamplingParams

from .measure import RequestRecord, StepRecord
from .step_cost import ShapeTracker, StepCostModel
from .workload import SyntheticRequest


class EngineLike(Protocol):
    def add_request(self, request_id: str, prompt_token_ids: Sequence[int], sampling: SamplingParams) -> None: ...
    def step(self) -> list: ...
    def has_unfinished(self) -> bool: ...
    def abort(self, request_id: str) -> None: ...


StepProbe = Callable[[EngineLike], tuple[int, int, int, int]]  # -> prefill tokens, decode tokens, context, KV bytes


@dataclass
class Replica:
    engine: EngineLike
    clock_s: float = 0.0
    outstanding: set[str] = field(default_factory=set)
    steps: list[StepRecord] = field(default_factory=list)
    request_ids: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RunResult:
    requests: dict[str, RequestRecord]
    replicas: list[Replica]
    is_truncated: bool  # stopped at end_s with requests unfinished (their remaining tokens count as late)


def run_virtual(engines: Sequence[EngineLike], workload: Sequence[SyntheticRequest], vocab_size: int,
                end_s: float, probe: StepProbe, timer: Callable[[], float], id_prefix: str = "",
                seed: int = 0, step_cost: StepCostModel | None = None) -> RunResult:
    if not engines:
        raise ValueError("at least one engine")
    rng = np.random.default_rng(seed)
    replicas = [Replica(e) for e in engines]
    records = {r.request_id: RequestRecord(r.arrival_s, r.prompt_len, r.output_len) for r in workload}
    pending = deque(sorted(workload, key=lambda r: r.arrival_s))
    owner: dict[str, Replica] = {}
    tracker = ShapeTracker()
    is_truncated = False
    while True:
        busy = [r for r in replicas if r.engine.has_unfinished() and r.clock_s < end_s]
        next_arrival = pending[0].arrival_s if pending else math.inf
        nxt = min(busy, key=lambda r: r.clock_s) if busy else None
        if nxt is None and not pending:
            break
        if nxt is None or next_arrival <= nxt.clock_s:
            request = pending.popleft()
            target = min(replicas, key=lambda r: len(r.outstanding))
            if not target.engine.has_unfinished():
                target.clock_s = max(target.clock_s, request.arrival_s)  # idle until this arrival
            prompt = rng.integers(1, vocab_size, request.prompt_len).tolist()
            target.engine.add_request(id_prefix + request.request_id, prompt,
                                      SamplingParams(max_tokens=request.output_len, temperature=0.0, ignore_eos=True))
            target.outstanding.add(request.request_id)
            target.request_ids.append(request.request_id)
            owner[request.request_id] = target
            continue
        if step_cost is not None:
            tracker.before(nxt.engine)
        started = timer()
        outputs = nxt.engine.step()
        measured_s = timer() - started
        wall_s = measured_s if step_cost is None else step_cost.seconds(tracker.after(nxt.engine))
        num_prefill, num_decode, context, kv_bytes = probe(nxt.engine)
        nxt.steps.append(StepRecord(nxt.clock_s, wall_s, num_prefill, num_decode, context, kv_bytes, measured_s))
        nxt.clock_s += wall_s
        for out in outputs:
            rid = out.request_id[len(id_prefix):]
            if out.token_ids:
                records[rid].token_times_s.extend([nxt.clock_s] * len(out.token_ids))
            if out.is_finished:
                nxt.outstanding.discard(rid)
    for replica in replicas:  # leave the engines empty for the next run
        if replica.outstanding:
            is_truncated = True
        for rid in list(replica.outstanding):
            replica.engine.abort(id_prefix + rid)
        while replica.engine.has_unfinished():
            replica.engine.step()
        replica.outstanding.clear()
    return RunResult(records, replicas, is_truncated)

"""Serve a synthetic workload with m replicas of a real engine on virtual clocks.

This machine has two shared cores, so m replicas cannot run side by side. Each replica keeps its own virtual
clock instead: the replicas are served in turn, always the one whose clock is earliest, and a step advances that
replica's clock by the time the real `engine.step()` just took (or, with a step-cost model, by what a step of that shape
costs on the quiet machine: step_cost.py). Arrivals are dispatched at their arrival time
to the replica with the fewest outstanding requests. Attainment thus reflects real engine work without needing m
real cores (docs/oracle.md, "Profiling"). The timer is injected, so tests can use a deterministic one.

Prefill/decode-disaggregated (`num_decode` > 0: the last `num_decode` engines decode, the others prefill), as Janus
serves a model with `min_num_disaggregated` instances or more: an arrival goes to the prefill engine with the fewest
outstanding requests and is given its decode engine then (the fewest outstanding, counting those still in prefill,
as the dispatcher's decode routing counts them); the prefill engine computes the prompt and the first token, and the
request reaches its decode engine `transfer_s(prompt tokens + 1)` later (the KV cache over the device link), which
decodes the rest (`add_prefilled_request`: an engine that can take a computed prompt; the CPU engine cannot).
"""
from __future__ import annotations

import heapq
import math
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


class DecodeEngineLike(EngineLike, Protocol):
    def add_prefilled_request(self, request_id: str, prompt_len: int, sampling: SamplingParams) -> None:
        """A request whose prompt and first token were computed elsewhere, its KV cache here: decode tokens 2.."""


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
                seed: int = 0, step_cost: StepCostModel | None = None, num_decode: int = 0,
                transfer_s: Callable[[int], float] | None = None) -> RunResult:
    if not engines:
        raise ValueError("at least one engine")
    if num_decode and not (0 < num_decode < len(engines) and transfer_s is not None):
        raise ValueError(f"prefill/decode: 1..{len(engines) - 1} decode engines of {len(engines)} and a transfer "
                         f"time, got {num_decode} decode engines")
    rng = np.random.default_rng(seed)
    replicas = [Replica(e) for e in engines]
    prefill, decode = replicas[: len(replicas) - num_decode], replicas[len(replicas) - num_decode:]
    records = {r.request_id: RequestRecord(r.arrival_s, r.prompt_len, r.output_len) for r in workload}
    by_id = {r.request_id: r for r in workload}
    # events in time order: (time, seq, request, decode replica or None for an arrival)
    pending: list[tuple[float, int, str, Replica | None]] = [
        (r.arrival_s, i, r.request_id, None) for i, r in enumerate(sorted(workload, key=lambda r: r.arrival_s))]
    heapq.heapify(pending)
    num_events = len(pending)
    decode_of: dict[str, Replica] = {}
    tracker = ShapeTracker()
    is_truncated = False
    while True:
        busy = [r for r in replicas if r.engine.has_unfinished() and r.clock_s < end_s]
        next_event_s = pending[0][0] if pending else math.inf
        nxt = min(busy, key=lambda r: r.clock_s) if busy else None
        if nxt is None and not pending:
            break
        if nxt is None or next_event_s <= nxt.clock_s:
            at_s, _, rid, target = heapq.heappop(pending)
            request = by_id[rid]
            if target is None:  # an arrival
                target = min(prefill, key=lambda r: len(r.outstanding))
                if decode:
                    decode_of[rid] = min(decode, key=lambda r: len(r.outstanding))
                    decode_of[rid].outstanding.add(rid)
            elif at_s >= end_s:
                continue  # its KV arrives after the run: unfinished
            if not target.engine.has_unfinished():
                target.clock_s = max(target.clock_s, at_s)  # idle until this event
            if rid in decode_of and target is decode_of[rid]:
                target.engine.add_prefilled_request(id_prefix + rid, request.prompt_len, SamplingParams(
                    max_tokens=request.output_len, temperature=0.0, ignore_eos=True))
                continue
            prompt = rng.integers(1, vocab_size, request.prompt_len).tolist()
            max_tokens = 1 if decode else request.output_len
            target.engine.add_request(id_prefix + rid, prompt,
                                      SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
            target.outstanding.add(rid)
            target.request_ids.append(rid)
            continue
        if step_cost is not None:
            tracker.before(nxt.engine)
        started = timer()
        outputs = nxt.engine.step()
        measured_s = timer() - started
        wall_s = measured_s if step_cost is None else step_cost.seconds(tracker.after(nxt.engine))
        num_prefill, num_decode_tokens, context, kv_bytes = probe(nxt.engine)
        nxt.steps.append(StepRecord(nxt.clock_s, wall_s, num_prefill, num_decode_tokens, context, kv_bytes,
                                    measured_s))
        nxt.clock_s += wall_s
        for out in outputs:
            rid = out.request_id[len(id_prefix):]
            if out.token_ids:
                records[rid].token_times_s.extend([nxt.clock_s] * len(out.token_ids))
            if out.is_finished:
                nxt.outstanding.discard(rid)
                to = decode_of.get(rid)
                if to is not None and to is not nxt:  # prefilled: on to its decode engine, or done at one token
                    if by_id[rid].output_len > 1:
                        num_events += 1
                        heapq.heappush(pending, (nxt.clock_s + transfer_s(by_id[rid].prompt_len + 1), num_events,
                                                 rid, to))
                    else:
                        to.outstanding.discard(rid)
    for replica in replicas:  # leave the engines empty for the next run
        if replica.outstanding:
            is_truncated = True
        for rid in list(replica.outstanding):
            replica.engine.abort(id_prefix + rid)
        while replica.engine.has_unfinished():
            replica.engine.step()
        replica.outstanding.clear()
    return RunResult(records, replicas, is_truncated)

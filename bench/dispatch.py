"""The dispatcher experiment (paper: LST-IMH vs round-robin vs least-load at 1x/2x/3x load) in one run.

Replays real request lengths and arrival times from a trace in ../shared/traces/ (time-compressed to the target
load) against simulated prefill instances on a virtual clock, driven through the real DispatcherCore. Prints TTFT
attainment and failure share per policy and load, then the cost of one LST-IMH round beside round-robin's.

    .venv/bin/python bench/dispatch.py            # the full experiment (about 40 s of CPU)
    .venv/bin/python bench/dispatch.py --quick    # a smaller run for a smoke test

Capacity (1x), defined in docs/dispatcher.md: the highest request rate at which round-robin still meets the TTFT
SLO for 99 % of the replayed requests (--capacity slo, the default), or utilisation 1.0 (--capacity throughput).
"""
from __future__ import annotations

import argparse
import copy
import csv
import heapq
import math
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from contracts import InstanceRecord, InstanceRole, ModelState, Pool  # noqa: E402
from dispatcher.core import (  # noqa: E402
    Algorithm,
    Assign,
    DispatchPolicy,
    DispatchRequest,
    DispatcherCore,
    OverloadPolicy,
    Reject,
    ThroughputPrefillModel,
)
from dispatcher.core.scheduling import lst_imh  # noqa: E402

MODEL = "m"


def shared_dir() -> Path:
    return Path(os.environ.get("JANUS_SHARED_DIR", REPO_ROOT.parent / "shared"))


@dataclass(frozen=True)
class TraceRow:
    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int


def load_azure_conv(path: Path, num_requests: int, offset: int) -> list[TraceRow]:
    from datetime import datetime

    rows: list[TraceRow] = []
    with path.open() as f:
        reader = csv.DictReader(f)
        t0 = None
        for k, row in enumerate(reader):
            if k < offset:
                continue
            if len(rows) >= num_requests:
                break
            # Timestamps carry 7 fractional digits; datetime takes 6.
            stamp = datetime.fromisoformat(row["TIMESTAMP"][:26])
            t = stamp.timestamp()
            t0 = t if t0 is None else t0
            rows.append(TraceRow(t - t0, max(1, int(row["ContextTokens"])), int(row["GeneratedTokens"])))
    return rows


def load_arena(path: Path, num_requests: int, offset: int) -> list[TraceRow]:
    rows: list[TraceRow] = []
    with path.open() as f:
        for k, row in enumerate(csv.DictReader(f)):
            if k < offset:
                continue
            if len(rows) >= num_requests:
                break
            rows.append(TraceRow(float(row["arrival_s"]), max(1, int(row["input_tokens"])), int(row["output_tokens"])))
    t0 = rows[0].arrival_s
    return [TraceRow(r.arrival_s - t0, r.num_prompt_tokens, r.num_output_tokens) for r in rows]


@dataclass(frozen=True)
class Fleet:
    num_instances: int
    tokens_per_s: float
    overhead_ms: float
    noise_sigma: float  # lognormal spread of true prefill time around the prediction

    def predicted_ms(self, num_prompt_tokens: int) -> float:
        return self.overhead_ms + 1000.0 * num_prompt_tokens / self.tokens_per_s

    def records(self) -> list[InstanceRecord]:
        return [
            InstanceRecord(
                instance_id=f"p{i:02d}",
                model=MODEL,
                worker_id=f"w{i:02d}",
                role=InstanceRole.COLOCATED,
                pool=Pool.STEADY,
                state=ModelState.ACTIVE,
                is_ready=True,
                updated_unix_ms=0.0,
            )
            for i in range(self.num_instances)
        ]


def throughput_capacity_rps(rows: list[TraceRow], fleet: Fleet) -> float:
    """Requests per second at which predicted prefill work per second equals the number of instances."""
    mean_ms = sum(fleet.predicted_ms(r.num_prompt_tokens) for r in rows) / len(rows)
    return fleet.num_instances * 1000.0 / mean_ms


@dataclass
class Outcome:
    num_requests: int
    num_on_time: int = 0
    num_late: int = 0  # first token after the deadline, or assigned late (requeued)
    num_failed: int = 0  # rejected (OVERLOADED / NO_INSTANCE)

    @property
    def attainment(self) -> float:
        return self.num_on_time / self.num_requests

    @property
    def failure_share(self) -> float:
        return self.num_failed / self.num_requests


_PREFILL_DONE, _ARRIVAL, _WAKEUP = 0, 1, 2  # same-time order: completions free capacity before arrivals use it


class Replay:
    """Open-loop replay on a virtual clock: each request arrives at its (compressed) trace time whatever the
    dispatcher does. Each instance runs its assigned prefills one after another (FIFO); each takes the predicted
    time times a lognormal noise factor (mean 1), drawn per request with a fixed seed."""

    def __init__(self, rows: list[TraceRow], rate_rps: float, fleet: Fleet, policy: DispatchPolicy,
                 ttft_slo_ms: float, seed: int) -> None:
        trace_rate_rps = (len(rows) - 1) / max(rows[-1].arrival_s, 1e-9)
        self.scale_ms = 1000.0 * trace_rate_rps / rate_rps  # trace seconds -> virtual ms at the target rate
        rng = random.Random(seed)
        sigma = fleet.noise_sigma
        self.true_ms = [fleet.predicted_ms(r.num_prompt_tokens) * rng.lognormvariate(-sigma**2 / 2, sigma) for r in rows]
        self.rows, self.fleet, self.ttft_slo_ms = rows, fleet, ttft_slo_ms
        self.core = DispatcherCore(policy, ThroughputPrefillModel(fleet.tokens_per_s, overhead_ms=fleet.overhead_ms))
        self.events: list[tuple[float, int, int, object]] = []
        self.seq = 0
        self.local_queue: dict[str, list[int]] = {r.instance_id: [] for r in fleet.records()}
        self.is_running = dict.fromkeys(self.local_queue, False)
        self.is_late: set[int] = set()
        self.wake_at = math.inf
        self.out = Outcome(num_requests=len(rows))

    def _push(self, t: float, kind: int, payload: object) -> None:
        heapq.heappush(self.events, (t, kind, self.seq, payload))
        self.seq += 1

    def _start_next(self, t: float, instance_id: str) -> None:
        if self.is_running[instance_id] or not self.local_queue[instance_id]:
            return
        k = self.local_queue[instance_id].pop(0)
        self.is_running[instance_id] = True
        self._push(t + self.true_ms[k], _PREFILL_DONE, (instance_id, k))

    def _apply(self, t: float, effects: list) -> None:
        for e in effects:
            if isinstance(e, Assign):
                k = int(e.request_id[1:])
                if e.is_late:
                    self.is_late.add(k)
                self.local_queue[e.instance_id].append(k)
                self._start_next(t, e.instance_id)
            elif isinstance(e, Reject):
                self.out.num_failed += 1

    def run(self) -> Outcome:
        for k, row in enumerate(self.rows):
            self._push(row.arrival_s * self.scale_ms, _ARRIVAL, k)
        self._apply(0.0, self.core.on_instances(0.0, self.fleet.records()))
        while self.events:
            t, kind, _, payload = heapq.heappop(self.events)
            if kind == _ARRIVAL:
                k = payload
                row = self.rows[k]
                effects = self.core.on_request(t, DispatchRequest(
                    f"r{k}", MODEL, row.num_prompt_tokens, t, t + self.ttft_slo_ms,
                    expected_output_tokens=row.num_output_tokens))
            elif kind == _PREFILL_DONE:
                instance_id, k = payload
                self.is_running[instance_id] = False
                ttft_ms = t - self.rows[k].arrival_s * self.scale_ms
                if ttft_ms <= self.ttft_slo_ms and k not in self.is_late:
                    self.out.num_on_time += 1
                else:
                    self.out.num_late += 1
                effects = self.core.on_prefill_done(t, instance_id, f"r{k}", True, first_token_ms=t)
                self._start_next(t, instance_id)
            else:
                if t != self.wake_at:
                    continue  # superseded by an earlier wakeup
                self.wake_at = math.inf
                effects = self.core.on_tick(t)
            self._apply(t, effects)
            is_busy = self.core.queue_depth(MODEL) > 0
            wake = self.core.next_wakeup_ms()
            # Past the last arrival only queued work needs wakeups (load windows alone would tick forever).
            if wake is not None and wake < self.wake_at and (is_busy or self.events):
                self.wake_at = max(wake, t + 1e-3)
                self._push(self.wake_at, _WAKEUP, None)
        out = self.out
        if out.num_on_time + out.num_late + out.num_failed != out.num_requests:
            raise AssertionError(f"requests lost in the replay: {out}")
        return out


def slo_capacity_rps(rows: list[TraceRow], fleet: Fleet, ttft_slo_ms: float, seed: int,
                     min_attainment: float = 0.99) -> float:
    """The highest request rate at which round-robin still meets the TTFT SLO for min_attainment of the requests
    (bisection on the same replay, to 1 % of the throughput capacity)."""
    high = throughput_capacity_rps(rows, fleet)
    low = 0.0
    while high - low > 0.01 * throughput_capacity_rps(rows, fleet):
        mid = (low + high) / 2
        if Replay(rows, mid, fleet, POLICIES["round_robin"], ttft_slo_ms, seed).run().attainment >= min_attainment:
            low = mid
        else:
            high = mid
    return low


POLICIES: dict[str, DispatchPolicy] = {
    "lst_imh/reject": DispatchPolicy(algorithm=Algorithm.LST_IMH, overload=OverloadPolicy.REJECT),
    "lst_imh/requeue": DispatchPolicy(algorithm=Algorithm.LST_IMH, overload=OverloadPolicy.REQUEUE),
    "round_robin": DispatchPolicy(algorithm=Algorithm.ROUND_ROBIN),
    "least_load": DispatchPolicy(algorithm=Algorithm.LEAST_LOAD),
}


def _timed_ms(fn, setup, num_repeats: int) -> tuple[float, float]:
    """(min, median) wall ms of fn(setup()) over num_repeats; setup is not timed."""
    times = []
    for _ in range(num_repeats):
        arg = setup()
        started = time.perf_counter()
        fn(arg)
        times.append((time.perf_counter() - started) * 1000.0)
    return min(times), float(np.median(times))


def round_cost(rows: list[TraceRow], num_backlog: int, num_instances: int, seed: int, num_repeats: int) -> None:
    """Cost of one dispatch round over a backlog of num_backlog requests (trace lengths) and num_instances instances
    that free up spread over the next 25..525 ms.

    steady: the backlog is already queued (arrivals spread over the last 2 s, TTFT SLO 10 s so that all of it is
      still feasible) and on_tick runs the round ~20 ms before the first instance frees up: LST-IMH plans all 512
      requests over all 16 instances and commits that instance's subset. Round-robin has no equivalent (it never
      holds a backlog).
    burst: the same number of requests arrive in one on_requests call (TTFT SLO 1 s): every policy places (or
      rejects) all of them in one round, including per-request bookkeeping. Round-robin's burst is the baseline.
    """
    rng = random.Random(seed)
    fleet = Fleet(num_instances, 10_000.0, 10.0, 0.0)
    now = 1_000_000.0

    def requests(ttft_slo_ms: float) -> list[DispatchRequest]:
        out = []
        for j in range(num_backlog):
            row = rows[rng.randrange(len(rows))]
            arrival = now - rng.uniform(0.0, 2000.0)
            out.append(DispatchRequest(f"q{j}", MODEL, row.num_prompt_tokens, arrival, arrival + ttft_slo_ms))
        return out

    def prepared(policy: DispatchPolicy) -> DispatcherCore:
        core = DispatcherCore(policy, ThroughputPrefillModel(fleet.tokens_per_s, overhead_ms=fleet.overhead_ms))
        core.on_instances(now, fleet.records())
        for i, record in enumerate(fleet.records()):
            # Bench setup only: instance i is busy until now + 25 + i * 500 / (n - 1) ms.
            busy_ms = 25.0 + 500.0 * i / max(num_instances - 1, 1)
            core._view.ledger(record.instance_id).assign(now, f"busy{i}", busy_ms)
        return core

    results: dict[str, tuple[float, float]] = {}
    steady = prepared(POLICIES["lst_imh/reject"])
    steady_backlog = requests(10_000.0)
    steady.on_requests(now, steady_backlog)  # no instance is within lookahead yet: everything stays queued
    if steady.queue_depth(MODEL) != num_backlog:
        raise AssertionError(f"steady backlog is {steady.queue_depth(MODEL)}, wanted {num_backlog}")
    tick_ms = now + 25.0 - steady.policy.lookahead_ms
    results["steady"] = _timed_ms(lambda core: core.on_tick(tick_ms), lambda: copy.deepcopy(steady), num_repeats)
    burst_backlog = requests(1000.0)
    for name in ("lst_imh/reject", "round_robin", "least_load"):
        base = prepared(POLICIES[name])
        results[name] = _timed_ms(lambda core: core.on_requests(now, burst_backlog), lambda: copy.deepcopy(base),
                                  num_repeats)
    tokens = np.array([r.num_prompt_tokens for r in steady_backlog], dtype=np.float64)
    proc = np.stack([fleet.overhead_ms + tokens * 1000.0 / fleet.tokens_per_s] * num_instances)
    available = [now + 25.0 + 500.0 * i / max(num_instances - 1, 1) for i in range(num_instances)]
    due = [r.ttft_deadline_ms for r in steady_backlog]
    results["plan"] = _timed_ms(lambda _: lst_imh(available, proc, due), lambda: None, num_repeats)
    print(f"\none round: backlog {num_backlog}, {num_instances} instances, {num_repeats} repeats "
          f"(shared machine: min is the intrinsic cost, p50 includes contention)")
    print(f"{'what':<52} {'min ms':>7} {'p50 ms':>7} {'min vs RR burst':>15}")
    labels = {
        "steady": "LST-IMH steady round (on_tick, 512 queued)",
        "plan": "LST-IMH plan only (scheduling.lst_imh, same backlog)",
        "lst_imh/reject": "LST-IMH burst (on_requests, 512 arrivals)",
        "round_robin": "round-robin burst (on_requests, 512 arrivals)",
        "least_load": "least-load burst (on_requests, 512 arrivals)",
    }
    rr_min = results["round_robin"][0]
    for name, (low, mid) in results.items():
        print(f"{labels[name]:<52} {low:>7.2f} {mid:>7.2f} {low / rr_min:>15.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", choices=["azure_conv", "arena"], default="azure_conv")
    parser.add_argument("--num-requests", type=int, default=3000)
    parser.add_argument("--offset", type=int, default=0, help="skip this many trace rows")
    parser.add_argument("--num-instances", type=int, default=8)
    parser.add_argument("--tokens-per-s", type=float, default=10_000.0)
    parser.add_argument("--overhead-ms", type=float, default=10.0)
    parser.add_argument("--noise-sigma", type=float, default=0.1)
    parser.add_argument("--ttft-slo-ms", type=float, default=1000.0)
    parser.add_argument("--loads", type=str, default="1,2,3")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--capacity", choices=["slo", "throughput"], default="slo",
                        help="what 1x means (docs/dispatcher.md): round-robin's 99 %% SLO point, or utilisation 1.0")
    parser.add_argument("--round-repeats", type=int, default=100)
    parser.add_argument("--deadline-margin", type=float, default=None,
                        help="LST-IMH deadline_margin_frac (default: the policy default)")
    parser.add_argument("--no-work-conserving", action="store_true", help="LST-IMH with is_work_conserving=False")
    parser.add_argument("--eager-commit", action="store_true", help="LST-IMH with is_late_binding=False")
    parser.add_argument("--skip-round-cost", action="store_true")
    parser.add_argument("--quick", action="store_true", help="800 requests, 2x only")
    args = parser.parse_args()
    if args.quick:
        args.num_requests, args.loads, args.round_repeats = 800, "2", 5
    if args.trace == "azure_conv":
        rows = load_azure_conv(shared_dir() / "traces" / "azure2023_conv.csv", args.num_requests, args.offset)
    else:
        rows = load_arena(shared_dir() / "traces" / "prism_vtc_arena_trace.csv", args.num_requests, args.offset)
    knobs: dict = {}
    if args.deadline_margin is not None:
        knobs["deadline_margin_frac"] = args.deadline_margin
    if args.no_work_conserving:
        knobs["is_work_conserving"] = False
    if args.eager_commit:
        knobs["is_late_binding"] = False
    if knobs:
        for name in ("lst_imh/reject", "lst_imh/requeue"):
            POLICIES[name] = POLICIES[name].model_copy(update=knobs)
    fleet = Fleet(args.num_instances, args.tokens_per_s, args.overhead_ms, args.noise_sigma)
    full_rps = throughput_capacity_rps(rows, fleet)
    cap = slo_capacity_rps(rows, fleet, args.ttft_slo_ms, args.seed) if args.capacity == "slo" else full_rps
    print(f"trace {args.trace}: {len(rows)} requests (offset {args.offset}), mean prompt "
          f"{np.mean([r.num_prompt_tokens for r in rows]):.0f} tokens; fleet {fleet.num_instances} x "
          f"{fleet.tokens_per_s:.0f} tok/s + {fleet.overhead_ms:.0f} ms, noise sigma {fleet.noise_sigma}; "
          f"TTFT SLO {args.ttft_slo_ms:.0f} ms")
    lst = POLICIES["lst_imh/reject"]
    print(f"LST-IMH knobs: lookahead {lst.lookahead_ms:.0f} ms, deadline margin {lst.deadline_margin_frac:.2f} SLO, "
          f"work-conserving {lst.is_work_conserving}, late binding {lst.is_late_binding}; requeue relaxes by "
          f"{lst.relaxation_factor:.1f} SLO up to {lst.max_num_relaxations} times")
    print(f"capacity ({args.capacity}) 1x = {cap:.1f} req/s = prefill utilisation {cap / full_rps:.2f}")
    print(f"{'load':>5} {'policy':<16} {'attain':>7} {'failed':>7} {'late':>7} {'attain vs RR':>12}")
    for load in [float(x) for x in args.loads.split(",")]:
        results = {name: Replay(rows, load * cap, fleet, pol, args.ttft_slo_ms, args.seed).run()
                   for name, pol in POLICIES.items()}
        rr = results["round_robin"].attainment
        for name, res in results.items():
            ratio = f"{res.attainment / rr:.2f}" if rr > 0 else "inf"
            print(f"{load:>4.0f}x {name:<16} {res.attainment:>7.1%} {res.failure_share:>7.1%} "
                  f"{res.num_late / res.num_requests:>7.1%} {ratio:>12}")
    if not args.skip_round_cost:
        round_cost(rows, 512, 16, args.seed, args.round_repeats)


if __name__ == "__main__":
    main()

"""Model instances and the devices they run on, advanced in iterations on the virtual clock.

An `Executor` is one device, or one tensor-parallel group of devices, and the model instances on it (several in
the steady pool, one in the elastic pool). Its instances share its time: each *round* runs one iteration of every
instance that has work (round-robin, as co-located models on their own streams contend for one device), so a round
lasts the sum of their iteration times. An instance with prompts waiting runs a chunked-prefill iteration (prompt
tokens plus one decode token for each running sequence, as vLLM mixes them); otherwise a decode step.

Per-token events are far too many at scale (the headline run emits ~10^8 tokens), so while no prompt waits the
executor advances in *runs*: n identical rounds at once, n reaching the next request to finish. A run is cut short
at the next round boundary when new work arrives. Each run leaves one step segment (start round, start time, round
length) on every instance that took part; a finished request's token times are read back from those segments (in
batches of finished requests, before the segments are pruned and at the end of a run), so token-level attainment
is exact for the simulated schedule.
"""
from __future__ import annotations

import heapq
from collections import deque
from typing import Protocol

import numpy as np

from .costmodel import StepCost
from .device_effects import StepEffects
from .metrics import ON_TIME_EPS_S
from .requests import RequestTable

MAX_ROUNDS_PER_RUN = 128  # bounds the error of evaluating a run's step time at its mid-point context
SCORE_BATCH = 256  # finished requests an instance scores at once (score_decode_tokens)
SEG_PRUNE_AT = 4096


class ExecutorHooks(Protocol):
    """What an executor tells the simulator."""

    def schedule_run_end(self, executor: "Executor", time_s: float) -> None: ...

    def on_first_token(self, instance: "SimInstance", request: int, time_s: float) -> None: ...

    def on_request_done(self, instance: "SimInstance", request: int, time_s: float) -> None: ...

    def on_instance_idle(self, instance: "SimInstance", time_s: float) -> None: ...

    def on_request_failed(self, instance: "SimInstance", request: int, time_s: float) -> None: ...

    def on_moves_due(self, instance: "SimInstance", time_s: float) -> None:
        """The instance is at a step boundary with decodes to move (`moves_out`): take them out now."""


class SimInstance:
    """One model instance: a prefill queue (or, for a decode instance, requests whose KV cache has arrived), a
    running decode batch and the step segments its tokens were emitted in."""

    __slots__ = ("instance_id", "app", "role", "pool", "cost", "executor", "table", "waiting", "head_done_tokens",
                 "num_reserved", "batch", "ctx_base", "finish_heap", "rounds", "segs", "is_draining", "is_ready",
                 "num_in_flight", "seq", "max_num_batched_tokens", "worker_id", "created_s", "ready_at_s",
                 "done_unscored", "forked_from_until_s", "kv_bytes_used", "moves_out",
                 "resume_at")

    def __init__(self, instance_id: str, app: int, role: str, pool: str, cost: StepCost, table: RequestTable,
                 max_num_batched_tokens: int = 8192, worker_id: str = ""):
        if role not in ("colocated", "prefill", "decode"):
            raise ValueError(f"unknown role {role!r}")
        self.instance_id = instance_id
        self.app = app
        self.role = role
        self.pool = pool
        self.cost = cost
        self.table = table
        self.executor: Executor | None = None
        self.waiting: deque[int] = deque()
        self.head_done_tokens = 0  # prompt tokens of waiting[0] already prefilled (chunked prefill)
        self.num_reserved = 0  # waiting[:num_reserved] hold their KV reservation
        self.kv_bytes_used = 0.0  # the KV its requests hold on the executor (reported in its heartbeat)
        self.batch = 0
        self.ctx_base = 0  # sum over the batch of (prompt + 1 - join round); context = ctx_base + batch * rounds
        self.finish_heap: list[tuple[int, int]] = []  # (finish round, request)
        self.rounds = 0
        self.segs = SegmentLog()
        self.is_draining = False
        self.is_ready = False
        self.num_in_flight = 0  # requests assigned here and not yet finished (or handed off)
        self.seq = 0
        self.max_num_batched_tokens = max_num_batched_tokens
        self.worker_id = worker_id
        self.created_s = 0.0
        self.ready_at_s = 0.0  # when its load and verify end
        self.forked_from_until_s = 0.0  # a fork is copying its weights until then (device_effects: it runs slower)
        # finished requests whose decode tokens are still to be scored: (request, first segment, end segment),
        # absolute segment indices; scored in batches (score_decode_tokens)
        self.done_unscored: list[tuple[int, int, int]] = []
        self.moves_out: list = []  # (target instance, how many) ordered, carried out at the next step boundary
        self.resume_at: dict[int, int] = {}  # a request moved here -> decode tokens it emitted elsewhere

    @property
    def context_tokens(self) -> int:
        return self.ctx_base + self.batch * self.rounds

    @property
    def has_prefill_work(self) -> bool:
        return bool(self.waiting) and self.role != "decode"

    def kv_bytes(self, request: int) -> float:
        t = self.table
        tokens = t.input_tokens[request] + (t.output_tokens[request] if self.role != "prefill" else 1)
        return tokens * self.cost.kv_bytes_per_token


class Executor:
    """A device (or a tensor-parallel group) and its instances; see the module docstring."""

    __slots__ = ("executor_id", "device_ids", "instances", "kv_capacity_bytes", "kv_used_bytes", "hooks",
                 "is_running", "run_start_s", "run_round_s", "run_num_rounds", "run_end_s", "run_members",
                 "run_prefill", "version", "busy_s", "effects")

    def __init__(self, executor_id: str, device_ids: tuple[int, ...], hbm_bytes: float, hooks: ExecutorHooks,
                 effects: StepEffects | None = None):
        self.executor_id = executor_id
        self.device_ids = device_ids
        self.instances: list[SimInstance] = []
        self.kv_capacity_bytes = hbm_bytes  # usable bytes per device; weights are taken off as instances arrive
        self.kv_used_bytes = 0.0
        self.hooks = hooks
        self.effects = effects  # what the device does beyond the roofline (device_effects.py); None: the roofline
        self.is_running = False
        self.run_start_s = 0.0
        self.run_round_s = 0.0
        self.run_num_rounds = 0
        self.run_end_s = 0.0
        self.run_members: list[SimInstance] = []
        self.run_prefill: list[tuple[SimInstance, list[tuple[int, int]]]] = []
        self.version = 0
        self.busy_s = 0.0

    # ----------------------------------------------------------------------------------------------- placement
    def add(self, instance: SimInstance) -> None:
        if instance.cost.weight_bytes > self.kv_capacity_bytes:
            raise ValueError(f"{instance.instance_id} does not fit on {self.executor_id}")
        self.kv_capacity_bytes -= instance.cost.weight_bytes
        instance.executor = self
        self.instances.append(instance)

    def remove(self, instance: SimInstance) -> None:
        if instance.waiting or instance.batch:
            raise ValueError(f"{instance.instance_id} still holds requests; drain it first")
        score_decode_tokens(instance)
        self.instances.remove(instance)
        self.kv_capacity_bytes += instance.cost.weight_bytes
        instance.executor = None

    @property
    def free_hbm_bytes(self) -> float:
        return self.kv_capacity_bytes - self.kv_used_bytes

    # ----------------------------------------------------------------------------------------------- events
    def notify(self, now_s: float) -> None:
        """New work arrived on one of the instances: start a run, or cut the current one at its next round."""
        if not self.is_running:
            self._start(now_s)
        elif self.run_num_rounds > 1:
            done = int((now_s - self.run_start_s) / self.run_round_s)
            if done + 1 < self.run_num_rounds:
                self.run_num_rounds = done + 1
                self.run_end_s = self.run_start_s + self.run_num_rounds * self.run_round_s
                self.version += 1
                self.hooks.schedule_run_end(self, self.run_end_s)

    def on_run_end(self, now_s: float, version: int) -> None:
        if version != self.version or not self.is_running:
            return  # superseded by a shortened run
        self._finish(now_s)
        self._start(now_s)

    # ----------------------------------------------------------------------------------------------- internals
    def _start(self, now_s: float) -> None:
        self._drop_unservable(now_s)
        members: list[SimInstance] = []
        prefill: list[tuple[SimInstance, list[tuple[int, int]]]] = []
        round_s = 0.0
        has_prefill = False
        effects = self.effects
        for inst in self.instances:
            if inst.role == "decode" and inst.waiting:
                self._admit_decode(inst, now_s)
            if inst.has_prefill_work:
                chunk = self._plan_chunk(inst)
                if chunk:
                    has_prefill = True
                    num_tokens = sum(c[1] for c in chunk)
                    step_s = inst.cost.iteration_s(num_tokens, len(chunk), inst.batch, inst.context_tokens)
                    if effects is not None:
                        step_s = effects.instance_step(step_s, inst.batch, True, inst.forked_from_until_s > now_s)
                    round_s += step_s
                    prefill.append((inst, chunk))
                    if inst.batch:
                        members.append(inst)
                    continue
            if inst.batch:
                members.append(inst)
        if not members and not prefill:
            self.is_running = False
            return
        num_rounds = 1
        if not has_prefill:
            num_rounds = MAX_ROUNDS_PER_RUN
            for inst in members:
                left = inst.finish_heap[0][0] - inst.rounds
                if left < num_rounds:
                    num_rounds = left
            num_rounds = max(1, num_rounds)
            half = num_rounds / 2.0
            for inst in members:
                step_s = inst.cost.decode_s(inst.batch, inst.context_tokens + inst.batch * half)
                if effects is not None:
                    step_s = effects.instance_step(step_s, inst.batch, False, inst.forked_from_until_s > now_s)
                round_s += step_s
        else:
            for inst in members:
                if not any(p[0] is inst for p in prefill):
                    step_s = inst.cost.decode_s(inst.batch, inst.context_tokens)
                    if effects is not None:
                        step_s = effects.instance_step(step_s, inst.batch, False, inst.forked_from_until_s > now_s)
                    round_s += step_s
        if effects is not None:
            num_busy = len(prefill) + sum(1 for inst in members if not any(p[0] is inst for p in prefill))
            round_s *= effects.round_factor(num_busy, num_rounds)
        for inst in members:
            inst.segs.append(inst.rounds, now_s, round_s)
        self.is_running = True
        self.run_start_s = now_s
        self.run_round_s = round_s
        self.run_num_rounds = num_rounds
        self.run_end_s = now_s + num_rounds * round_s
        self.run_members = members
        self.run_prefill = prefill
        self.version += 1
        self.hooks.schedule_run_end(self, self.run_end_s)

    def _drop_unservable(self, now_s: float) -> None:
        """A request whose KV cannot fit even on an empty device would block its queue for ever: fail it."""
        for inst in self.instances:
            while inst.waiting and inst.num_reserved == 0 and inst.kv_bytes(inst.waiting[0]) > self.kv_capacity_bytes:
                request = inst.waiting.popleft()
                inst.head_done_tokens = 0
                inst.num_in_flight -= 1
                self.hooks.on_request_failed(inst, request, now_s)

    def _plan_chunk(self, inst: SimInstance) -> list[tuple[int, int]]:
        """Prompt tokens to prefill this round: (request, tokens) in queue order, within the token budget, the KV
        space and max_num_seqs. KV is reserved when a request's first chunk is planned."""
        table = inst.table
        budget = inst.max_num_batched_tokens - inst.batch
        chunk: list[tuple[int, int]] = []
        num_seqs = inst.batch
        for pos, request in enumerate(inst.waiting):
            if budget <= 0 or num_seqs >= inst.cost.max_num_seqs:
                break
            if pos >= inst.num_reserved:
                need = inst.kv_bytes(request)
                if need > self.free_hbm_bytes:
                    break  # head-of-line: waits for running requests to free KV
                self.kv_used_bytes += need
                inst.kv_bytes_used += need
                inst.num_reserved += 1
            left = table.input_tokens[request] - (inst.head_done_tokens if pos == 0 else 0)
            take = left if left < budget else budget
            chunk.append((request, take))
            budget -= take
            num_seqs += 1
        return chunk

    def _admit_decode(self, inst: SimInstance, now_s: float) -> None:
        """A decode instance takes the requests whose KV has arrived into its batch, in arrival order, as KV space
        allows. One that does not fit waits and the next is tried: each reserves its prompt and whole output, and
        stopping at the first that does not fit let one long request (up to a fifth of the KV) stall every request
        behind it while the batch ran at a third of what the KV holds (docs/bench/sim.md, run 17)."""
        table = inst.table
        skipped: deque[int] = deque()
        while inst.waiting and inst.batch < inst.cost.max_num_seqs:
            request = inst.waiting.popleft()
            need = inst.kv_bytes(request)
            if need > self.free_hbm_bytes:
                skipped.append(request)
                continue
            self.kv_used_bytes += need
            inst.kv_bytes_used += need
            self._join(inst, request, table)
        if skipped:
            skipped.extend(inst.waiting)
            inst.waiting = skipped

    def _join(self, inst: SimInstance, request: int, table: RequestTable) -> None:
        # a request moved here joins as if it had run its earlier decode rounds here: its token i is still due at
        # the same time, and its context counts the tokens it emitted elsewhere
        join = table.join_round[request] = inst.rounds - inst.resume_at.pop(request, 0)
        table.join_seg[request] = inst.segs.end
        num_decode = table.output_tokens[request] - 1
        inst.batch += 1
        inst.ctx_base += table.input_tokens[request] + 1 - join
        inst.seq += 1
        heapq.heappush(inst.finish_heap, (join + num_decode, request))

    def _finish(self, now_s: float) -> None:
        num_rounds = self.run_num_rounds
        self.busy_s += num_rounds * self.run_round_s
        self.is_running = False
        for inst in self.run_members:
            inst.rounds += num_rounds
        hooks = self.hooks
        for inst, chunk in self.run_prefill:
            table = inst.table
            for request, take in chunk:
                if inst.waiting[0] != request:
                    raise RuntimeError("prefill order broken")
                done = (inst.head_done_tokens + take) >= table.input_tokens[request]
                if not done:
                    inst.head_done_tokens += take
                    break  # only the last request of a chunk can be partial
                inst.waiting.popleft()
                inst.num_reserved -= 1
                inst.head_done_tokens = 0
                table.first_token_s[request] = now_s
                if now_s <= table.arrival_s[request] + table.ttft_slo_s[request] + ON_TIME_EPS_S:
                    table.num_on_time[request] += 1
                if inst.role == "prefill":
                    self._release(inst, request)
                    inst.num_in_flight -= 1
                    hooks.on_first_token(inst, request, now_s)
                elif table.output_tokens[request] <= 1:
                    self._release(inst, request)
                    table.finish_s[request] = now_s
                    inst.num_in_flight -= 1
                    hooks.on_first_token(inst, request, now_s)
                    hooks.on_request_done(inst, request, now_s)
                else:
                    self._join(inst, request, table)
                    hooks.on_first_token(inst, request, now_s)
        for inst in self.run_members:
            heap = inst.finish_heap
            while heap and heap[0][0] <= inst.rounds:
                _, request = heapq.heappop(heap)
                self._complete(inst, request, now_s)
            if inst.segs.size > inst.segs.prune_at:
                score_decode_tokens(inst)  # before their segments go
                _prune_segments(inst)
        for inst in self.run_members:
            if inst.moves_out:
                hooks.on_moves_due(inst, now_s)
        for inst in self.instances:
            if inst.is_draining and not inst.waiting and not inst.batch:
                hooks.on_instance_idle(inst, now_s)

    def take_out(self, inst: SimInstance, requests: list[int]) -> list[int]:
        """Take running decodes out of the instance's batch at a step boundary (they move to another instance):
        their tokens so far are scored here (one pass over the segments) and their KV freed, and the finish heap
        is rebuilt once. Returns the decode tokens each emitted here."""
        table = inst.table
        joins = [int(table.join_round[r]) for r in requests]
        counts = _decode_counts(inst, [(r, table.join_seg[r], inst.segs.end) for r in requests])
        for request, join, count in zip(requests, joins, counts.tolist()):
            table.num_on_time[request] += int(count)
            inst.ctx_base -= table.input_tokens[request] + 1 - join
            self._release(inst, request)
        leaving = set(requests)
        inst.finish_heap = [e for e in inst.finish_heap if e[1] not in leaving]
        heapq.heapify(inst.finish_heap)
        inst.batch -= len(requests)
        inst.num_in_flight -= len(requests)
        return [inst.rounds - join for join in joins]


    def _release(self, inst: SimInstance, request: int) -> None:
        need = inst.kv_bytes(request)
        self.kv_used_bytes -= need
        inst.kv_bytes_used -= need

    def _complete(self, inst: SimInstance, request: int, now_s: float) -> None:
        table = inst.table
        inst.batch -= 1
        inst.ctx_base -= table.input_tokens[request] + 1 - table.join_round[request]
        self._release(inst, request)
        table.finish_s[request] = now_s
        inst.done_unscored.append((request, table.join_seg[request], inst.segs.end))
        if len(inst.done_unscored) >= SCORE_BATCH:
            score_decode_tokens(inst)
        inst.num_in_flight -= 1
        self.hooks.on_request_done(inst, request, now_s)


class SegmentLog:
    """Step segments of one instance: segment k covers rounds (r0[k], r0[k+1]] (the last one up to the instance's
    current round), round r of it ending at t0[k] + (r - r0[k]) * step_s[k]. Numpy arrays grown by doubling, so
    a finishing request reads its span as views, without copying."""

    __slots__ = ("r0", "t0", "step_s", "base", "size", "prune_at")

    def __init__(self, capacity: int = 64):
        self.r0 = np.zeros(capacity, dtype=np.int64)
        self.t0 = np.zeros(capacity)
        self.step_s = np.zeros(capacity)
        self.base = 0  # absolute index of slot 0
        self.size = 0
        self.prune_at = SEG_PRUNE_AT

    @property
    def end(self) -> int:
        """Absolute index the next segment will get."""
        return self.base + self.size

    def append(self, r0: int, t0: float, step_s: float) -> None:
        k = self.size
        if k == len(self.r0):
            self.r0 = np.concatenate([self.r0, np.zeros(k, dtype=np.int64)])
            self.t0 = np.concatenate([self.t0, np.zeros(k)])
            self.step_s = np.concatenate([self.step_s, np.zeros(k)])
        self.r0[k] = r0
        self.t0[k] = t0
        self.step_s[k] = step_s
        self.size = k + 1

    def drop_before(self, absolute: int) -> None:
        drop = absolute - self.base
        if drop <= 0:
            return
        keep = self.size - drop
        self.r0[:keep] = self.r0[drop:self.size]
        self.t0[:keep] = self.t0[drop:self.size]
        self.step_s[:keep] = self.step_s[drop:self.size]
        self.base = absolute
        self.size = keep


def decode_on_time(inst: SimInstance, request: int) -> int:
    """On-time tokens among a request's decode tokens (2..n) that has just finished on `inst` (one-request form
    of score_decode_tokens, which the executor uses)."""
    return int(_decode_counts(inst, [(request, inst.table.join_seg[request], inst.segs.end)])[0])


def score_decode_tokens(inst: SimInstance) -> None:
    """Add the on-time decode tokens of the instance's finished, not yet scored requests to the request table.
    In batches: one vectorised pass over all their step segments costs a fraction of one numpy pass per request
    (a request spans ~150 segments on average on the headline run; scoring one at a time was 19 % of static
    partition's run and 9 % of Janus's, py-spy)."""
    if not inst.done_unscored:
        return
    counts = _decode_counts(inst, inst.done_unscored)
    num_on_time = inst.table.num_on_time
    for (request, _, _), count in zip(inst.done_unscored, counts.tolist()):
        num_on_time[request] += int(count)
    inst.done_unscored = []


def _decode_counts(inst: SimInstance, done: list[tuple[int, int, int]]) -> np.ndarray:
    """Per finished request (request, first segment, end segment): its on-time decode tokens. Token i is emitted at
    the end of round join + i - 1 and due at arrival + TTFT + (i - 1) * TPOT. Each segment a request spans
    contributes its tokens as one uniform run (metrics.on_time_in_uniform_run)."""
    table, segs = inst.table, inst.segs
    requests = [d[0] for d in done]
    first = np.fromiter((d[1] for d in done), np.int64, len(done)) - segs.base
    lens = np.fromiter((d[2] for d in done), np.int64, len(done)) - segs.base - first
    if first.min(initial=0) < 0:
        raise RuntimeError("step segments of an unscored request were pruned")
    join = np.array([table.join_round[r] for r in requests], dtype=np.int64)
    finish = join + np.array([table.output_tokens[r] for r in requests], dtype=np.int64) - 1
    due0 = np.array([table.arrival_s[r] + table.ttft_slo_s[r] for r in requests])
    tpot = np.array([table.tpot_slo_s[r] for r in requests])
    owner = np.repeat(np.arange(len(done)), lens)  # the request each spanned segment belongs to
    pos = np.arange(len(owner)) - np.repeat(np.cumsum(lens) - lens, lens) + first[owner]  # segment slots
    r0 = segs.r0[pos]
    nxt = pos + 1
    # a segment ends where the next one starts (or at the current round); the request's own finish clamps it, so
    # segments appended after it finished change nothing
    r_end = np.where(nxt < segs.size, segs.r0[np.minimum(nxt, segs.size - 1)], inst.rounds)
    join_e, finish_e, tpot_e = join[owner], finish[owner], tpot[owner]
    lo = np.maximum(r0, join_e) + 1
    m = np.maximum(np.minimum(r_end, finish_e) - lo + 1, 0)
    step = segs.step_s[pos]
    emit = segs.t0[pos] + (lo - r0) * step
    slack = due0[owner] + (lo - join_e) * tpot_e - emit + ON_TIME_EPS_S
    return np.bincount(owner, weights=_count_on_time(slack, tpot_e - step, m), minlength=len(done))


def _count_on_time(slack: np.ndarray, gain: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Vectorised rule of metrics.on_time_in_uniform_run for runs of m tokens with initial slack `slack` growing by
    `gain` per token (no errstate, no division by zero: the masked branches divide by 1)."""
    losing = gain < 0
    upto = np.floor(slack / np.where(losing, -gain, 1.0)) + 1
    when_ahead = np.where(losing, np.minimum(m, upto), m)
    gaining = gain > 0
    start = np.ceil(-slack / np.where(gaining, gain, 1.0))
    when_behind = np.where(gaining, np.maximum(0, m - start), 0)
    return np.where(slack >= 0, when_ahead, when_behind)


def _prune_segments(inst: SimInstance) -> None:
    """Drop step segments no running request can still need."""
    table = inst.table
    oldest = min((table.join_seg[r] for _, r in inst.finish_heap), default=inst.segs.end)
    inst.segs.drop_before(oldest)
    # a long-running request pins old segments: try again only after the log doubled
    inst.segs.prune_at = max(SEG_PRUNE_AT, 2 * inst.segs.size)

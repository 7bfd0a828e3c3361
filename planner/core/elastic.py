"""The elastic scaler (fast path, every 0.5 s): replica counts for the elastic models from the Elasticity
predictions, within the devices the steady pool leaves (in devices: a tensor-parallel instance takes its group),
split into prefill and decode instances, debounced; a model with requests in flight or a recent arrival keeps one
instance (keep-alive)."""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from contracts import ElasticPlan, ElasticTarget, LoadFeatures, ModelLoadWindow

from .debounce import Debouncer
from contracts.load_book import LoadBook
from .fleet_state import DecodeKV
from .oracle_port import OracleLike
from .policy import ElasticPolicy
from .replica_search import ReplicaSearch, search_min_replicas
from .rounding import largest_remainder, scale_to_budget

PD = tuple[int, int]  # (num_prefill, num_decode); num_decode == 0 means colocated instances
# The last few idle gaps a model's keep-alive is sized by: enough to see a pattern, few enough to forget an old one.
KEEPALIVE_GAPS_REMEMBERED = 3


def num_devices(pd: PD) -> int:
    return pd[0] + pd[1]


def split_prefill_decode(num_instances: int, features: LoadFeatures, policy: ElasticPolicy,
                         decode_token_cost_ratio: float | None = None, min_num_decode: int = 0) -> PD:
    """Share `num_instances` single-model devices between prefill and decode in proportion to the device time each
    phase takes (input tokens vs output tokens weighted by the device time of a decode token over a prefill token:
    the oracle's, measured on the device, else the policy's `decode_token_cost_ratio`), at least one of each, and at
    least `min_num_decode` decode instances while one prefill instance is left (`decode_floor`). Below
    `min_num_disaggregated` instances, P/D is not worth its transfer: that many colocated instances."""
    if num_instances <= 0:
        return (0, 0)
    if num_instances < policy.min_num_disaggregated:
        return (num_instances, 0)
    ratio = decode_token_cost_ratio if decode_token_cost_ratio is not None else policy.decode_token_cost_ratio
    if policy.decode_ratio_floor_from is not None and num_instances >= policy.decode_ratio_floor_from:
        ratio = max(ratio, policy.decode_token_cost_ratio)
    prefill_work = features.input_len_mean
    decode_work = features.output_len_mean * ratio
    weights = [prefill_work, decode_work] if prefill_work + decode_work > 0 else [1.0, 1.0]
    num_prefill = largest_remainder(weights, num_instances)[0]
    num_prefill = min(max(num_prefill, 1), num_instances - 1)
    return with_decode_floor((num_prefill, num_instances - num_prefill), min_num_decode)


def with_decode_floor(pd: PD, min_num_decode: int) -> PD:
    """`pd` with at least `min_num_decode` decode instances, taken from its prefill instances while one is left; a
    colocated count stays as it is."""
    total = num_devices(pd)
    if pd[1] == 0 or pd[1] >= min_num_decode:
        return pd
    num_decode = min(min_num_decode, total - 1)
    return (total - num_decode, num_decode)


def decode_floor(kv: DecodeKV, fill_target: float) -> int:
    """The decode instances a model's sequences in flight fill to `fill_target` of their KV: the blocks its decode
    instances hold, plus, for each sequence waiting at them (its KV arrived, no room in the batch yet), as many as a
    running one holds on average, over one instance's blocks times `fill_target`. The oracle's count comes from a
    profile and a 5 s load window; a long-answer model's decode KV fills over its answers' lifetimes, past what
    either sees (docs/planner.md, "Decode floor"). 0 when no instance reports its KV."""
    capacity_blocks = kv.num_kv_blocks_used + kv.num_kv_blocks_free
    if kv.num_instances <= 0 or capacity_blocks <= 0:
        return 0
    per_sequence = kv.num_kv_blocks_used / kv.num_running if kv.num_running else 0.0
    demand_blocks = kv.num_kv_blocks_used + kv.num_waiting * per_sequence
    per_instance = capacity_blocks / kv.num_instances
    return math.ceil(demand_blocks / (per_instance * fill_target) - 1e-9)


def keep_split(before: PD, after: PD, band_frac: float) -> PD:
    """`after`'s count with `before`'s decode instances kept while `after` would move fewer than `band_frac` of its
    instances from decode to prefill. A 5 s window's prompt and answer lengths, and the decode floor read off the
    heartbeats, move the split by an instance or more from one plan to the next. A move towards decode costs little
    (a prefill instance drains at once, a draining decode instance resumes); a move towards prefill drains decode
    instances, and each holds its devices until its longest answer ends (minutes for a long-answer model) while the
    new prefill instances take other devices. Kept only when both are disaggregated and the count does not shrink:
    a shrink takes its own split (`shrink_prefill_first` under a short budget)."""
    if band_frac <= 0 or before[1] == 0 or after[1] == 0 or num_devices(after) < num_devices(before):
        return after
    total = num_devices(after)
    num_prefill = min(max(before[0], 1), total - 1)
    if after[0] <= num_prefill or after[0] - num_prefill >= band_frac * total:
        return after
    return (num_prefill, total - num_prefill)


def shrink_prefill_first(before: PD, after: PD) -> PD:
    """`after`'s count of instances, taking this plan's shrink from `before` out of its prefill instances first: the
    decode instances `after` would drop for the shrink are kept (never more than before, at least one prefill
    instance left), the rest prefill. The skew is the shrink's alone and does not carry over: at an unchanged count
    the split is `after`'s again. Held for as long as the budget binds, the skew adds up over a peak's many shrinks,
    down to one prefill instance (it cost seed 2 of the headline 0.003 attainment, docs/bench/sim.md run 42). A model
    that grows, or that was or becomes colocated, keeps `after`."""
    total = num_devices(after)
    shrink = num_devices(before) - total
    if before[1] == 0 or after[1] == 0 or shrink < 0:
        return after
    num_decode = min(before[1], after[1] + shrink, total - 1)
    return (total - num_decode, num_decode)


def _unpriced_spread(features: LoadFeatures, policy: ElasticPolicy) -> dict[str, float]:
    """The update that leaves the answers' spread out of the split's price (none with the knob on, or no spread)."""
    if policy.is_decode_priced_by_answer_spread or features.output_len_var == 0:
        return {}
    return {"output_len_var": 0.0}


def priced_for_split(features: LoadFeatures, policy: ElasticPolicy) -> LoadFeatures:
    """The load as the P/D split prices it: the oracle's decode-over-prefill token cost is asked for these features,
    so without `is_decode_priced_by_answer_spread` the answers' spread is left out (every answer as long as the
    mean). The profiles lay their points out the same way (sim/oracle_training.py)."""
    update = _unpriced_spread(features, policy)
    return features.model_copy(update=update) if update else features


def load_to_size_for(window: ModelLoadWindow, policy: ElasticPolicy, headroom: float | None = None) -> LoadFeatures:
    """The load to size replicas for: the window's token rate times `load_headroom` (or `headroom`), plus the tokens
    of the requests queued at the dispatchers spread over `backlog_drain_s`. A 5 s window's rate is a noisy, lagging
    estimate of the next seconds' (a fork takes a second or more to serve), so sizing for exactly the measured rate
    leaves every burst short; and after a saturated period the arrival rate says nothing of the queue left behind.
    Priced for the split as `priced_for_split` says (one copy of the features at most: every busy model, every
    tick)."""
    features = window.features
    token_rate = features.token_rate_tps * (policy.load_headroom if headroom is None else headroom)
    if policy.backlog_drain_s > 0 and window.queue_depth:
        tokens_per_request = features.input_len_mean + features.output_len_mean
        token_rate += window.queue_depth * tokens_per_request / policy.backlog_drain_s
    update = _unpriced_spread(features, policy)
    if token_rate != features.token_rate_tps:
        update["token_rate_tps"] = token_rate
    return features.model_copy(update=update) if update else features


def unpadded_counts(desired: Mapping[str, int], loads: Mapping[str, ModelLoadWindow],
                    policy: ElasticPolicy) -> dict[str, int]:
    """Of each desired count, the part the measured rate alone asks for: the count times measured over sized-for
    token rate (a replica count grows about linearly with the rate), rounded up, at least one. The rest is padding
    (load_headroom, the backlog term), which scale_to_budget serves last when the budget is short."""
    out = {}
    for m, n in desired.items():
        window = loads.get(m)
        if n <= 0 or window is None:
            out[m] = 0
            continue
        measured = window.features.token_rate_tps
        sized = load_to_size_for(window, policy).token_rate_tps
        out[m] = n if sized <= measured else max(1, min(n, math.ceil(n * measured / sized - 1e-9)))
    return out


def reachable_first(floor: Mapping[str, int], searches: Mapping[str, ReplicaSearch]) -> dict[str, int]:
    """The tier a short budget serves first: the measured-rate count (`floor`) of each model, except one instance
    of each model whose bound creeps below the target up to the cap. Such a count is the saturation rule's
    (replica_search.py): the bound creeps up with the GP's shrinking uncertainty, far past the count the mean meets
    the target at, and shared in proportion it took the devices of models a few instances short (docs/planner.md,
    "Over budget"). A model overloaded at every count (a burst past what the cap serves) keeps its floor: more
    replicas serve more of it."""
    return {m: min(n, 1) if m in searches and _is_creeping(searches[m]) else n for m, n in floor.items()}


def _is_creeping(search: ReplicaSearch) -> bool:
    return not search.is_reachable and not search.is_overloaded


def plan_decision(plan: ElasticPlan) -> tuple:
    """What a plan decides (its budget and counts): a plan whose decision equals the last one's changes nothing
    downstream, so the scaler service publishes it only now and then, and the simulator does not deliver it."""
    return (plan.budget_devices, tuple((t.model, t.num_prefill, t.num_decode) for t in plan.targets))


@dataclass(frozen=True)
class ElasticDecision:
    plan: ElasticPlan
    searches: Mapping[str, ReplicaSearch]
    held_models: tuple[str, ...]


def fit_to_budget(desired: Mapping[str, int], budget_devices: int, devices_per_instance: Mapping[str, int],
                  priority: Mapping[str, float], floor: Mapping[str, int] | None,
                  first: Mapping[str, int] | None = None) -> dict[str, int]:
    """Instance counts within `budget_devices`, where an instance of model m takes `devices_per_instance[m]`
    devices (its tensor-parallel group). Scaled in device units with `scale_to_budget` (proportional, each model
    with traffic kept at one device if the budget allows, `first` then `floor` served before the rest), then rounded
    down to whole groups; a model left with no instance then gets one if a whole group is still free, most
    `priority` first."""
    tp = {m: max(1, devices_per_instance.get(m, 1)) for m in desired}
    wanted = {m: n * tp[m] for m, n in desired.items()}
    if sum(wanted.values()) <= budget_devices:
        return dict(desired)

    def in_devices(counts: Mapping[str, int] | None) -> dict[str, int] | None:
        return {m: n * tp[m] for m, n in counts.items()} if counts is not None else None

    allotted = scale_to_budget(wanted, budget_devices, priority=priority, floor=in_devices(floor),
                               first=in_devices(first))
    out = {m: allotted[m] // tp[m] for m in desired}
    left = budget_devices - sum(out[m] * tp[m] for m in out)
    for m in sorted(desired, key=lambda m: (-priority.get(m, 0.0), m)):
        if desired[m] > 0 and out[m] == 0 and tp[m] <= left:
            out[m], left = 1, left - tp[m]
    return out


class ElasticScaler:
    """Call `observe` with every load window and `tick(now_ms, elastic_models, budget_devices, ...)` every
    period."""

    def __init__(
        self,
        oracle: OracleLike,
        policy: ElasticPolicy | None = None,
        id_prefix: str = "elastic",
        is_observe_only: bool = False,
    ) -> None:
        self.oracle = oracle
        self.policy = policy or ElasticPolicy()
        self._loads = LoadBook()
        self._debouncer: Debouncer[str] = Debouncer((0, 0))
        self._applied: dict[str, PD] = {}  # the last plan's counts, debounced or not
        # the last answers, as hints for the next searches (0.5 s later most m* are unchanged)
        self._last_m: dict[str, int] = {}
        self._last_rate_m: dict[str, int] = {}
        self._last_band_m: dict[str, int] = {}
        self._asked: dict[str, deque[tuple[float, int]]] = {}  # per model, (time, count) for scale_in_hold_s
        self._last_arrival_ms: dict[str, float] = {}  # per model, the end of the last window with an arrival
        # per model, its last idle gaps longer than keepalive_s (ms, between windows with arrivals)
        self._gaps_ms: dict[str, deque[float]] = {}
        self._num_plans = 0
        self._last_plan: ElasticPlan | None = None  # the last plan, ticked or woken: what `wake` adds to
        self._parked: frozenset[str] = frozenset()  # the models that plan gives no instance (`is_waking` per window)
        self._id_prefix = id_prefix
        self.is_observe_only = is_observe_only

    def observe(self, window: ModelLoadWindow) -> None:
        """A dispatcher's load window (windows of several dispatchers add up)."""
        self._loads.observe(window)
        if window.num_requests > 0:
            last = self._last_arrival_ms.get(window.model, float("-inf"))
            gap_ms = window.end_unix_ms - last
            if gap_ms > self.policy.keepalive_s * 1e3 and last > float("-inf"):
                gaps = self._gaps_ms.setdefault(window.model, deque(maxlen=KEEPALIVE_GAPS_REMEMBERED))
                gaps.append(gap_ms)
            self._last_arrival_ms[window.model] = max(last, window.end_unix_ms)

    def load(self, model: str, now_ms: float | None = None) -> ModelLoadWindow | None:
        return self._loads.merged(model, now_ms)

    def tick(self, now_ms: float, elastic_models: Sequence[str], budget_devices: int, *,
             devices_per_instance: Mapping[str, int] | None = None,
             in_flight: Mapping[str, int] | None = None,
             decode_kv: Mapping[str, DecodeKV] | None = None) -> ElasticDecision:
        """One plan. `budget_devices`: what the steady pool leaves; `devices_per_instance`: each model's
        tensor-parallel group (default 1); `in_flight`: per model, requests running or waiting at its instances
        (the workers' heartbeats), for the keep-alive; `decode_kv`: per model, its decode instances' KV and
        sequences (the heartbeats too), for the decode floor (`decode_kv_fill_target`)."""
        if budget_devices < 0:
            raise ValueError(f"budget_devices must be >= 0, got {budget_devices}")
        p = self.policy
        tp = {m: max(1, (devices_per_instance or {}).get(m, 1)) for m in elastic_models}
        models = sorted(set(elastic_models))
        loads = {m: w for m in models if (w := self._loads.merged(m, now_ms)) is not None}
        busy = [m for m in models if m in loads and loads[m].request_rate_rps > p.min_rate_rps]
        sized_for = {m: load_to_size_for(loads[m], p) for m in busy}
        searches = self._size(loads, sized_for)
        desired = {m: (searches[m].num_replicas if m in searches else 0) for m in models}
        banded = self._scale_in_band(desired, sized_for)
        held_up = self._scale_in_hold(now_ms, desired)
        kv_floors = self._decode_floors(busy, desired, loads, searches, decode_kv or {})
        kept_alive, kept_for_gaps = self._keep_alive(now_ms, desired, loads, in_flight or {})
        token_rate = {m: (loads[m].features.token_rate_tps if m in loads else 0.0) for m in models}
        wanted_devices = sum(n * tp[m] for m, n in desired.items())
        given_back: set[str] = set()
        if wanted_devices > budget_devices and kept_for_gaps:
            # An instance kept for a gap the model may come back after is a bet; when the budget binds, load that
            # is here now goes first (at a peak the gap keep-alives took devices from busy models).
            for m in kept_for_gaps:
                desired[m] = 0
                del kept_alive[m]
            given_back = set(kept_for_gaps)
            wanted_devices = sum(n * tp[m] for m, n in desired.items())
        is_over = wanted_devices > budget_devices
        floor = unpadded_counts(desired, loads, p) if is_over else None
        first = reachable_first(floor, searches) if floor is not None and p.is_budget_reachable_first else None
        allotted = fit_to_budget(desired, budget_devices, tp, token_rate, floor, first)
        is_scaled_down = allotted != desired
        busy_set = set(busy)
        raw = {m: split_prefill_decode(allotted[m], loads[m].features, p, _measured_ratio(searches.get(m)),
                                       kv_floors.get(m, 0))
               if m in busy_set else (allotted[m], 0) for m in models}
        if is_scaled_down and p.is_budget_shrink_prefill_first:
            raw = {m: with_decode_floor(shrink_prefill_first(self._applied.get(m, (0, 0)), pd), kv_floors.get(m, 0))
                   if allotted[m] < desired[m] else pd for m, pd in raw.items()}
        if p.pd_split_band_frac > 0:
            raw = {m: with_decode_floor(keep_split(self._applied.get(m, (0, 0)), pd, p.pd_split_band_frac),
                                        kv_floors.get(m, 0)) for m, pd in raw.items()}

        notes: list[str] = []
        held: set[str] = set()
        rushed: set[str] = set()
        applied = raw
        if p.is_debounced:
            applied, held = self._debouncer.step(raw)
            if sum(num_devices(v) * tp[m] for m, v in applied.items()) > budget_devices:
                # Holding old counts would overrun a budget that just shrank: the budget wins.
                applied, held = raw, set()
                self._debouncer.force(raw)
                notes.append("budget shrank: applied without debounce")
            applied, rushed = self._rush_queued(applied, raw, loads, tp, budget_devices)
            held -= rushed
        used = sum(num_devices(v) * tp[m] for m, v in applied.items())
        # A model's first instance is not held back: without one, each of its requests waits (or is turned away).
        # The debounce holds changes of a count; a model going from none to some gets one at once, the rest when
        # two plans agree.
        started = [m for m in models if num_devices(applied[m]) == 0 and num_devices(raw[m]) > 0]
        for m in sorted(started, key=lambda m: (-token_rate[m], m)):
            if used + tp[m] <= budget_devices:
                applied = {**applied, m: (1, 0)}
                used += tp[m]
                held.discard(m)
        if started and p.is_debounced:
            self._debouncer.force(applied)
        self._applied = dict(applied)
        targets = tuple(
            ElasticTarget(
                model=m,
                num_prefill=applied[m][0],
                num_decode=applied[m][1],
                desired_replicas=desired[m],
                num_devices_per_instance=tp[m],
                prediction=searches[m].prediction if m in searches else None,
                reason=self._why(m, searches.get(m), desired[m], allotted[m], raw[m], applied[m], m in held,
                                m in banded, m in held_up, kept_alive.get(m, ""),
                                loads[m].queue_depth if m in rushed else None, m in given_back,
                                kv_floors.get(m)),
            )
            for m in models
        )
        if is_scaled_down:
            notes.append(f"over budget: wanted {wanted_devices} devices, {budget_devices} left by steady pool")
        if held:
            notes.append(f"debounced: {', '.join(sorted(held))} held until two plans agree")
        saturated = sorted(m for m, r in searches.items() if not r.is_reachable)
        if saturated:
            notes.append(f"target unreachable for {', '.join(saturated)}: kept at the count that maximises the "
                         "bound")
        creeping = sorted(m for m, r in searches.items() if _is_creeping(r))
        if first is not None and creeping:
            notes.append(f"{', '.join(creeping)} served after the others' measured rates (a bound creeping below "
                         "the target)")
        self._num_plans += 1
        plan = ElasticPlan(
            plan_id=f"{self._id_prefix}-{self._num_plans:06d}",
            created_unix_ms=now_ms,
            budget_devices=budget_devices,
            num_devices_used=used,
            targets=targets,
            is_scaled_down=is_scaled_down,
            is_debounced=bool(held),
            loads=tuple(loads[m] for m in models if m in loads),
            reason="; ".join([f"{len(busy)} elastic model(s) with traffic use {used} of {budget_devices} devices",
                              *notes]),
            is_observe_only=self.is_observe_only,
        )
        self._remember(plan)
        return ElasticDecision(plan, searches, tuple(sorted(held)))

    def _remember(self, plan: ElasticPlan) -> None:
        self._last_plan = plan
        self._parked = frozenset(t.model for t in plan.targets if t.num_prefill + t.num_decode == 0)

    def is_waking(self, window: ModelLoadWindow) -> bool:
        """Whether `window` asks for a `wake`: requests of an elastic model wait in a dispatcher's queue while the
        last plan gave the model no instance (the dispatcher publishes such a window at once,
        `DispatchPolicy.is_wake_published_at_once`). Asked of every window: a set lookup."""
        return self.policy.is_woken_at_once and window.queue_depth > 0 and window.model in self._parked

    def wake(self, now_ms: float, budget_devices: int) -> ElasticPlan | None:
        """Between ticks: the last plan with one colocated instance for each elastic model that has requests
        waiting and no instance (`is_waking` on the windows observed since), the busiest first while the budget has
        their devices; None when there is none to wake. A burst after a model went to zero otherwise waited for the
        next tick (up to `period_s`) on top of the dispatcher's publish period before its first instance started
        loading (docs/planner.md, "Waking a model at once"). Nothing else in the plan moves, and no debounced change
        is confirmed by it: it is the tick's own rule for a model's first instance, applied early."""
        last = self._last_plan
        if last is None or not self.policy.is_woken_at_once:
            return None
        waiting = {m: w for m in self._parked if (w := self._loads.merged(m, now_ms)) is not None and self.is_waking(w)}
        tp = {t.model: t.num_devices_per_instance for t in last.targets}
        used = last.num_devices_used
        woken: dict[str, int] = {}  # model -> its requests waiting
        for m in sorted(waiting, key=lambda m: (-waiting[m].features.token_rate_tps, m)):
            if used + tp[m] <= budget_devices:
                used += tp[m]
                woken[m] = waiting[m].queue_depth
        if not woken:
            return None
        self._applied.update({m: (1, 0) for m in woken})
        if self.policy.is_debounced:
            self._debouncer.force(self._applied)
        targets = tuple(
            t.model_copy(update={"num_prefill": 1, "num_decode": 0,
                                 "reason": f"woken: {woken[t.model]} waiting, no instance; one colocated instance "
                                           "at once, before the next tick"})
            if t.model in woken else t for t in last.targets)
        self._num_plans += 1
        plan = last.model_copy(update={
            "plan_id": f"{self._id_prefix}-{self._num_plans:06d}",
            "created_unix_ms": now_ms,
            "budget_devices": budget_devices,
            "num_devices_used": used,
            "targets": targets,
            "reason": f"woken at once: {', '.join(sorted(woken))}; the rest as {last.plan_id}",
        })
        self._remember(plan)
        return plan

    def _decode_floors(self, busy: Sequence[str], desired: dict[str, int], loads: Mapping[str, ModelLoadWindow],
                       searches: Mapping[str, ReplicaSearch], decode_kv: Mapping[str, DecodeKV]) -> dict[str, int]:
        """With `decode_kv_fill_target`, each busy model whose count is disaggregated and whose decode instances
        report more sequences in flight than its split's decode count holds (`decode_floor`) gets that many decode
        instances beside the split's prefill count. Updates `desired`; returns the floors that bound, per model
        (the split keeps them when the budget cuts the count)."""
        fill = self.policy.decode_kv_fill_target
        if fill is None:
            return {}
        out = {}
        for m in busy:
            kv = decode_kv.get(m)
            if kv is None or desired[m] <= 0:
                continue
            floor = decode_floor(kv, fill)
            num_prefill, num_decode = split_prefill_decode(desired[m], loads[m].features, self.policy,
                                                           _measured_ratio(searches.get(m)))
            if num_decode == 0 or num_decode >= floor:
                continue
            desired[m] = num_prefill + floor
            out[m] = floor
        return out

    def _rush_queued(self, applied: dict[str, PD], raw: Mapping[str, PD], loads: Mapping[str, ModelLoadWindow],
                     tp: Mapping[str, int], budget_devices: int) -> tuple[dict[str, PD], set[str]]:
        """A debounced scale-out goes through at once for a model whose dispatchers hold at least
        `scale_out_queue_per_instance` queued requests per instance it has: the debounce guards against a noisy rate,
        and a queue is the count being short now (each plan's backlog term moves as requests are dispatched, so two
        plans in a row rarely agree while it drains). Most queued per instance first, within the budget. Returns
        the counts and the models rushed."""
        per_instance = self.policy.scale_out_queue_per_instance
        if per_instance <= 0:
            return applied, set()

        def queued_per_instance(m: str) -> float:
            return loads[m].queue_depth / max(1, num_devices(applied[m]))

        # More instances, and none fewer or more prefill ones (the queue waits for a prefill): a P/D model the budget
        # had cut to one prefill instance beside its decode ones, asked back to 163 / 114 from 1 / 138, sat there for
        # 14 s (2,163 requests refused) while each plan's counts differed and its decode count fell (docs/planner.md,
        # "Debounce")
        wanting = [m for m in raw if m in loads and num_devices(raw[m]) > num_devices(applied[m])
                   and (raw[m][0] > applied[m][0] or all(r >= a for r, a in zip(raw[m], applied[m])))
                   and loads[m].queue_depth > 0 and queued_per_instance(m) >= per_instance]
        if not wanting:
            return applied, set()
        out = dict(applied)
        used = sum(num_devices(v) * tp[m] for m, v in out.items())
        rushed = set()
        for m in sorted(wanting, key=lambda m: (-queued_per_instance(m), m)):
            extra = (num_devices(raw[m]) - num_devices(out[m])) * tp[m]
            if used + extra <= budget_devices:
                out[m], used = raw[m], used + extra
                rushed.add(m)
        if rushed:
            self._debouncer.force(out)
        return out, rushed

    def keepalive_ms(self, model: str) -> float:
        """How long after its last arrival `model` keeps its instance: `keepalive_s`, or, for a model whose last
        idle gaps were all `keepalive_max_s` or shorter, its longest of them plus `keepalive_s` (capped at
        `keepalive_max_s`): a model that comes back every few minutes finds its instance there, where parking it
        made each return a cold start at the burst (docs/bench/sim.md run 45). One device per such model for its
        gaps; a model whose gaps run longer, or that never went idle, keeps the plain keep-alive."""
        p = self.policy
        base_ms, most_ms = p.keepalive_s * 1e3, p.keepalive_max_s * 1e3
        gaps = self._gaps_ms.get(model)
        if not gaps or max(gaps) > most_ms:
            return base_ms
        return max(base_ms, min(max(gaps) + base_ms, most_ms))

    def _keep_alive(self, now_ms: float, desired: dict[str, int], loads: Mapping[str, ModelLoadWindow],
                    in_flight: Mapping[str, int]) -> tuple[dict[str, str], set[str]]:
        """A model the search sized at zero keeps one instance while requests of it run or wait (at its instances or
        in a dispatcher's queue), and for its keep-alive (`keepalive_ms`) after its last arrival: parking it earlier
        turns its next requests away, or cuts the streams still running. Updates `desired`; returns why per model
        kept, and the models kept only for their gaps (past `keepalive_s`: the first to give back)."""
        out: dict[str, str] = {}
        for_gaps: set[str] = set()
        base_ms = self.policy.keepalive_s * 1e3
        for m, count in desired.items():
            if count > 0:
                continue
            queued = loads[m].queue_depth if m in loads else 0
            since_ms = now_ms - self._last_arrival_ms.get(m, float("-inf"))
            keep_ms = self.keepalive_ms(m)
            if in_flight.get(m, 0) > 0 or queued > 0:
                why = f"{in_flight.get(m, 0)} running or waiting, {queued} queued"
            elif since_ms <= keep_ms:
                why = f"last arrival {since_ms / 1e3:.1f} s ago (keep-alive {keep_ms / 1e3:.4g} s)"
                if since_ms > base_ms:
                    for_gaps.add(m)
            else:
                continue
            desired[m] = 1
            out[m] = why
        return out, for_gaps

    def _size(self, loads: Mapping[str, ModelLoadWindow], sized_for: Mapping[str, LoadFeatures]) \
            -> dict[str, ReplicaSearch]:
        """m* per model: the larger of the least count whose bound reaches `headroom_target_attainment` at the rate
        sized for (`load_headroom`) and the least count reaching `target_attainment` at the measured rate (both with
        the backlog term). The headroom carries a burst until the next scale-out lands; asking the target of it
        too sizes twice for the knee when the oracle knows the knee is smooth (docs/planner.md, "Headroom")."""
        p = self.policy
        headroom_target = _headroom_target(p)
        searches = self._search(sized_for, self._last_m, headroom_target)
        self._last_m = {m: r.num_replicas for m, r in searches.items()}
        if headroom_target >= p.target_attainment or not searches:
            return searches  # its answer meets the target at the measured rate too (monotone in rate and target)
        at_rate = self._search({m: load_to_size_for(loads[m], p, headroom=1.0) for m in searches},
                               self._last_rate_m, p.target_attainment)
        self._last_rate_m = {m: r.num_replicas for m, r in at_rate.items()}
        return {m: at_rate[m] if at_rate[m].num_replicas > r.num_replicas else r for m, r in searches.items()}

    def _search(self, features: Mapping[str, LoadFeatures], hints: Mapping[str, int],
                target_attainment: float) -> dict[str, ReplicaSearch]:
        p = self.policy
        return search_min_replicas(self.oracle, features, target_attainment, p.k_sigma, p.max_num_replicas,
                                   mode=p.search_mode,  # type: ignore[arg-type]
                                   saturation_eps=p.saturation_eps, hints=hints)

    def _scale_in_band(self, desired: dict[str, int], features: Mapping[str, LoadFeatures]) -> set[str]:
        """Hysteresis: a model above its scale-out answer keeps its count unless even `scale_in_headroom` times
        its rate (`features` are sized at `load_headroom`) needs fewer (then it goes to that count). Without the
        band, a rate wandering around a threshold forks and drains an instance every few seconds, and each fork
        costs a load before it serves. Updates `desired`; returns the models it kept above their answer."""
        p = self.policy
        if p.scale_in_headroom <= p.load_headroom:
            return set()
        current = {m: num_devices(self._applied.get(m, (0, 0))) for m in features}
        over = {m: f for m, f in features.items() if current[m] > desired[m]}
        if not over:
            return set()
        # The band's upper answer: the same load with the rate scaled from load_headroom up to scale_in_headroom.
        ratio = p.scale_in_headroom / p.load_headroom
        kept = self._search({m: f.model_copy(update={"token_rate_tps": f.token_rate_tps * ratio})
                             for m, f in over.items()}, self._last_band_m, _headroom_target(p))
        self._last_band_m.update((m, r.num_replicas) for m, r in kept.items())
        banded = set()
        for m in over:
            count = min(current[m], kept[m].num_replicas)
            if count > desired[m]:
                desired[m] = count
                banded.add(m)
        return banded

    def _scale_in_hold(self, now_ms: float, desired: dict[str, int]) -> set[str]:
        """Keep each model at the largest count asked for it within `scale_in_hold_s` (after the band). Updates
        `desired`; returns the models it raised."""
        hold_ms = self.policy.scale_in_hold_s * 1e3
        if hold_ms <= 0:
            return set()
        raised = set()
        for m, count in desired.items():
            history = self._asked.setdefault(m, deque())
            while history and history[0][0] < now_ms - hold_ms:
                history.popleft()
            # a monotone deque: the front holds the window's largest count
            while history and history[-1][1] <= count:
                history.pop()
            history.append((now_ms, count))
            if history[0][1] > count:
                desired[m] = history[0][1]
                raised.add(m)
        return raised

    def _why(self, model, search, desired, allotted, raw, applied, is_held, is_banded=False,
             is_held_up=False, kept_alive="", rushed_queue_depth: int | None = None,
             is_given_back: bool = False, decode_floor_count: int | None = None) -> str:
        p = self.policy
        if search is None:
            why = "no traffic"
            if kept_alive:
                why += f"; kept at 1: {kept_alive}"
                if allotted < desired:
                    why += "; no device left (budget)"
            elif is_given_back:
                why += "; its gap keep-alive given back: the budget binds"
            return why
        bounds = dict(zip(search.prediction.replicas, search.prediction.attainment_bound))
        m = search.num_replicas
        target = search.target_attainment
        if search.is_reachable:
            is_at_rate = p.load_headroom <= 1.0 or target == p.target_attainment != _headroom_target(p)
            where = "the measured rate" if is_at_rate else f"x{p.load_headroom:g} the rate"
            why = f"m*={m}: bound {bounds[m]:.3f} >= target {target:.3f} at {where}"
            if m - 1 in bounds:
                why += f" (m={m - 1}: {bounds[m - 1]:.3f})"
        elif search.is_overloaded:
            why = (f"target {target:.3f} unreachable: saturated (bound {bounds[m]:.3f} at every count "
                   f"up to the cap): m*={m}, the cap, the count that serves most of the load")
        else:
            cap = p.max_num_replicas
            why = (f"target {target:.3f} unreachable (bound {bounds[cap]:.3f} at the cap m={cap}): "
                   f"m*={m}, the least count that maximises the bound ({bounds[m]:.3f})")
        if is_banded:
            why += f"; kept at {desired}: inside the scale-in band (x{p.scale_in_headroom:g} the rate needs that many)"
        if is_held_up:
            why += f"; kept at {desired}: asked for within the last {p.scale_in_hold_s:g} s"
        if decode_floor_count is not None:
            why += (f"; raised to {desired}: its sequences in flight fill {decode_floor_count} decode instances to "
                    f"{p.decode_kv_fill_target:g} of their KV")
        if allotted < desired:
            why += f"; scaled down {desired} -> {allotted} (budget)"
        why += f"; prefill/decode {raw[0]}/{raw[1]}" + (" colocated" if raw[1] == 0 else "")
        if rushed_queue_depth is not None:
            why += f"; at once, not debounced: {rushed_queue_depth} queued at the dispatchers"
        if is_held:
            why += f"; held at {applied[0]}/{applied[1]}: the last two plans disagree"
        elif applied != raw and num_devices(applied) == 1:
            why += "; its first instance at once, the rest when two plans agree"
        return why


def _headroom_target(policy: ElasticPolicy) -> float:
    """The target the count sized for `load_headroom` times the rate must reach: `headroom_target_attainment`, never
    above `target_attainment` (a lower target alone asks no more of the headroom), and the target itself without
    a headroom (the measured rate is then the rate sized for)."""
    if policy.load_headroom <= 1.0:
        return policy.target_attainment
    return min(policy.headroom_target_attainment, policy.target_attainment)


def _measured_ratio(search: ReplicaSearch | None) -> float | None:
    """The oracle's decode-over-prefill token cost for the load searched (None: it measured none)."""
    return search.prediction.decode_token_cost_ratio if search is not None else None

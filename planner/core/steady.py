"""The steady planner (slow path): pool assignment, then Phi bin packing of the steady models onto devices, kept up
to date incrementally (arrivals, departures with a local repack, needs that grew) and consolidated periodically
under a migration budget. Produces a `contracts.SteadyPlan` with its inputs, predictions, moves and reasons."""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from contracts import (
    BinAssignment,
    CapacityItem,
    CapacityPrediction,
    CapacityQuery,
    LoadFeatures,
    ModelLoadWindow,
    Move,
    NeedVector,
    Pool,
    SteadyPlan,
)

from .consolidation import consolidate, keep_in_place
from .exact import solve_exact
from .greedy import pack_phi, sorted_models
from contracts.load_book import LoadBook
from .oracle_port import OracleAnswerError, OracleLike
from .packing import Packing, Vec, place_phi
from .policy import PoolPolicy, SteadyPolicy
from .pool_assignment import PoolAssigner, PoolVerdict
from .repack import depart, refit

NO_LOAD = LoadFeatures(token_rate_tps=0.0, input_len_mean=0.0, input_len_var=0.0, output_len_mean=0.0)
# Bins opened when every device is taken get ids with this prefix; they are dropped at the end of the plan and their
# models reported as unplaced (never silently).
_OVERFLOW = "<unplaced>"


@dataclass(frozen=True)
class SteadyDecision:
    plan: SteadyPlan
    verdicts: Mapping[str, PoolVerdict]
    unplaced_models: tuple[str, ...]


class SteadyPlanner:
    """Call `observe` with every load window and `plan` every period (or on an arrival/departure)."""

    def __init__(
        self,
        oracle: OracleLike,
        policy: SteadyPolicy | None = None,
        pool_policy: PoolPolicy | None = None,
        id_prefix: str = "steady",
        is_observe_only: bool = False,
    ) -> None:
        self.oracle = oracle
        self.policy = policy or SteadyPolicy()
        self._pool = PoolAssigner(pool_policy)
        self._packing = Packing()
        self._loads = LoadBook()
        self._last_consolidation_ms: float | None = None
        self._num_plans = 0
        self._id_prefix = id_prefix
        self.is_observe_only = is_observe_only

    @property
    def packing(self) -> Packing:
        """A copy of the current packing (bin ids are worker ids)."""
        return self._packing.copy()

    def observe(self, window: ModelLoadWindow) -> None:
        """A dispatcher's load window (windows of several dispatchers add up)."""
        self._pool.observe(self._loads.observe(window))

    def plan(
        self,
        now_ms: float,
        models: Sequence[str],
        worker_ids: Sequence[str],
        trigger: str = "periodic",
    ) -> SteadyDecision:
        """Plan the steady pool for the catalogue `models` on the devices `worker_ids` (in order of preference: new
        bins take the first free ones)."""
        models = sorted(set(models))
        workers = list(dict.fromkeys(worker_ids))
        loads = {m: w for m in models if (w := self._loads.merged(m, now_ms)) is not None}
        preds = self._predict(models, loads)
        bounds = {m: preds[m].bound.as_tuple() for m in models}
        verdicts = self._pool.assign(now_ms, {m: max(bounds[m]) for m in models})
        steady = {m for m in models if verdicts[m].pool == Pool.STEADY and max(bounds[m]) <= 1.0}
        new_bin_id = _bin_ids(workers, lambda: self._packing)
        moves: list[tuple[str, str | None, str | None, str]] = []
        notes: list[str] = []
        is_startup = self._num_plans == 0 or trigger == "startup"

        if is_startup:
            trigger = "startup"
            self._startup(steady, bounds, workers, new_bin_id, moves)
            self._last_consolidation_ms = now_ms
        else:
            self._lose_devices(workers, steady, moves, notes)
            self._departures(steady, verdicts, moves, notes)
            for m, frm, to in refit(self._packing, {m: bounds[m] for m in self._packing.models()}, new_bin_id):
                moves.append((m, frm, to, "needs grew: its bin overflowed"))
            arrivals = {m: bounds[m] for m in steady if m not in self._packing}
            for m in sorted_models(arrivals, "max"):
                to = place_phi(self._packing, m, arrivals[m], new_bin_id)
                moves.append((m, None, to, "arrival: placed where Phi grows least"))
            if arrivals:
                notes.append(f"{len(arrivals)} arrival(s) placed by Phi")
            self._maybe_consolidate(now_ms, trigger, new_bin_id, moves, notes)

        unplaced = self._drop_overflow(moves)
        if unplaced:
            notes.append(f"not enough devices: unplaced {', '.join(unplaced)}")
        self._num_plans += 1
        plan = self._build_plan(now_ms, trigger, models, loads, unplaced, preds, moves, notes, verdicts, steady)
        return SteadyDecision(plan, verdicts, unplaced)

    # -- steps -------------------------------------------------------------------------------------------------

    def _predict(self, models: list[str], loads: dict[str, ModelLoadWindow]) -> dict[str, CapacityPrediction]:
        if not models:
            return {}
        items = tuple(CapacityItem(model=m, features=loads[m].features if m in loads else NO_LOAD) for m in models)
        reply = self.oracle.capacity(CapacityQuery(items=items, k_sigma=self.policy.k_sigma))
        preds = {p.model: p for p in reply.predictions}
        missing = [m for m in models if m not in preds]
        if missing:
            raise OracleAnswerError(f"the oracle's capacity reply lacks {missing}")
        return preds

    def _fresh(self, needs: dict[str, Vec]) -> Packing:
        packing = pack_phi(needs, seed=self._num_plans)
        p = self.policy
        if p.is_exact and 0 < len(needs) <= p.max_num_exact_models:
            exact = solve_exact(needs, time_limit_s=p.exact_time_limit_s, max_num_bins=packing.num_bins)
            if exact.num_bins < packing.num_bins:
                return exact.packing
        return packing

    def _startup(self, steady, bounds, workers, new_bin_id, moves) -> None:
        old = self._packing
        alive = Packing([b for b in old if b.bin_id in set(workers)])
        fresh = self._fresh({m: bounds[m] for m in steady})
        self._packing, _ = keep_in_place(alive, fresh, new_bin_id)
        for m in self._packing.models():
            if old.bin_of(m) != self._packing.bin_of(m):
                moves.append((m, old.bin_of(m), self._packing.bin_of(m), "startup packing"))
        for m in old.models():
            if m not in self._packing:
                moves.append((m, old.bin_of(m), None, "not in the steady pool"))

    def _lose_devices(self, workers, steady, moves, notes) -> None:
        alive = set(workers)
        for b in [b for b in self._packing if b.bin_id not in alive]:
            for m in list(b.needs):
                self._packing.remove(m)
                if m not in steady:  # it is leaving anyway; record it once, here
                    moves.append((m, b.bin_id, None, "device lost"))
                else:  # placed again with the arrivals
                    moves.append((m, b.bin_id, None, "device lost: placed again"))
            self._packing.close_bin(b.bin_id)
            notes.append(f"device {b.bin_id} lost")

    def _departures(self, steady, verdicts, moves, notes) -> None:
        for m in sorted(set(self._packing.models()) - steady):
            v = verdicts.get(m)
            why = f"to elastic pool ({v.reason})" if v else "left the catalogue"
            out = depart(self._packing, m, self.policy.repack_damage_threshold)
            moves.append((m, out.bin_id, None, why))
            for mm, frm, to in out.moves[1:]:
                moves.append((mm, frm, to, f"local repack of {out.bin_id}: damage {out.damage:.3f}"))
            if out.is_repacked:
                notes.append(
                    f"departure of {m}: damage {out.damage:.3f} > {self.policy.repack_damage_threshold:.3f}, "
                    f"repacked {out.bin_id} with {len(out.moves) - 1} move(s)"
                )
            elif out.closed_bin_ids:
                notes.append(f"departure of {m}: device {out.bin_id} emptied")
            else:
                notes.append(f"departure of {m}: damage {out.damage:.3f} within threshold, no repack")

    def _maybe_consolidate(self, now_ms, trigger, new_bin_id, moves, notes) -> None:
        p = self.policy
        last = self._last_consolidation_ms
        if trigger != "consolidation" and last is not None and now_ms - last < p.consolidation_period_s * 1000.0:
            return
        self._last_consolidation_ms = now_ms
        real = Packing([b for b in self._packing if not b.bin_id.startswith(_OVERFLOW)])
        out = consolidate(real, p.max_num_migrations, new_bin_id, seed=self._num_plans)
        if out.method == "none":
            return
        for b in self._packing:
            if b.bin_id.startswith(_OVERFLOW):
                out.packing.open_bin(b.bin_id)
                for m, need in b.needs.items():
                    out.packing.put(m, need, b.bin_id)
        self._packing = out.packing
        for m, frm, to in out.moves:
            moves.append((m, frm, to, f"consolidation ({out.method})"))
        notes.append(
            f"consolidation freed {out.num_bins_freed} device(s) with {len(out.moves)} move(s) "
            f"(budget {p.max_num_migrations})"
        )

    def _drop_overflow(self, moves) -> tuple[str, ...]:
        unplaced: list[str] = []
        for b in [b for b in self._packing if b.bin_id.startswith(_OVERFLOW)]:
            for m in list(b.needs):
                self._packing.remove(m)
                unplaced.append(m)
            self._packing.close_bin(b.bin_id)
        for i, (m, frm, to, why) in enumerate(moves):
            if to is not None and to.startswith(_OVERFLOW):
                moves[i] = (m, frm, None, "unplaced: no device left")
        return tuple(sorted(unplaced))

    def _build_plan(self, now_ms, trigger, models, loads, unplaced, preds, moves, notes, verdicts, steady) -> SteadyPlan:
        placed = [m for m in models if m in self._packing]
        elastic = [m for m in models if verdicts[m].pool == Pool.ELASTIC or (m not in steady)]
        bins = tuple(
            BinAssignment(
                worker_id=b.bin_id,
                models=tuple(sorted(b.needs)),
                used=NeedVector(hbm=max(0.0, b.used[0]), compute=max(0.0, b.used[1]), bandwidth=max(0.0, b.used[2])),
            )
            for b in self._packing
        )
        summary = f"{len(placed)} steady model(s) on {len(bins)} device(s), {len(elastic)} elastic"
        for m in elastic:
            notes.append(f"{m} elastic: {verdicts[m].reason}")
        return SteadyPlan(
            plan_id=f"{self._id_prefix}-{self._num_plans:06d}",
            created_unix_ms=now_ms,
            trigger=trigger,  # type: ignore[arg-type]
            steady_models=tuple(placed),
            elastic_models=tuple(elastic),
            bins=bins,
            moves=_compress(moves),
            loads=tuple(loads[m] for m in models if m in loads),
            predictions=tuple(preds[m] for m in models),
            unplaced_models=tuple(unplaced),
            pool_reasons={m: verdicts[m].reason for m in models if m in verdicts},
            reason="; ".join([summary, *notes]),
            is_observe_only=self.is_observe_only,
        )


def _bin_ids(workers: list[str], packing: Callable[[], Packing]) -> Callable[[], str]:
    """New bins take the first worker not already a bin; past the last device, overflow ids."""
    state = {"next": 0, "overflow": 0}

    def next_id() -> str:
        used = {b.bin_id for b in packing()}
        while state["next"] < len(workers):
            wid = workers[state["next"]]
            state["next"] += 1
            if wid not in used:
                return wid
        state["overflow"] += 1
        return f"{_OVERFLOW}{state['overflow']}"

    return next_id


def _compress(moves: list[tuple[str, str | None, str | None, str]]) -> tuple[Move, ...]:
    """One move per model: where it was before the plan and where it ends; a model that ends where it started did
    not move."""
    first: dict[str, str | None] = {}
    last: dict[str, tuple[str | None, str]] = {}
    for m, frm, to, why in moves:
        first.setdefault(m, frm)
        last[m] = (to, why)
    out = []
    for m, frm in first.items():
        to, why = last[m]
        if frm != to:
            out.append(Move(model=m, from_worker_id=frm, to_worker_id=to, reason=why))
    return tuple(out)

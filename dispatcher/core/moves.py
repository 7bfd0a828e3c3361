"""Moving running decodes off draining decode instances: which draining instance moves how many of its decodes to
which active instance of its model. Pure; the core calls it on heartbeats, the shell (or the simulator) carries
the moves out (worker/dataplane/move_flow.py). See docs/dispatcher.md, "Moving decodes off a draining instance".

Why: a draining decode instance keeps its devices until its longest sequence ends, minutes for long outputs; in the
simulated headline that was a tenth of all device-hours (docs/bench/sim.md, run 56).

The rule, from what heartbeats say and nothing else:
- a decode instance draining for `move_after_draining_ms` with sequences running is a source; the ones with the
  fewest sequences go first (they free their devices soonest);
- a target is a ready, active decode instance of the same model; its room is what keeps its step within
  `move_tpot_margin_frac` of the model's TPOT SLO, assuming the step grows in proportion to the batch (decode is
  memory-bound: an upper bound), and within its max_num_seqs; an idle target, whose step is unknown, takes
  `move_max_per_target`;
- a source is asked again only once a heartbeat after its last order came, and a target's pending moves count
  against its room until its own next heartbeat.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from contracts import InstanceRecord, InstanceRole, ModelState, WorkerHeartbeat

from .effects import MoveDecodes


@dataclass(slots=True)
class _Draining:
    model: str
    worker_id: str
    since_ms: float
    num_running: int
    reported_ms: float
    ordered_ms: float = -math.inf


class DecodeMover:
    def __init__(self, *, after_draining_ms: float, tpot_margin_frac: float, max_per_target: int) -> None:
        self.after_draining_ms = after_draining_ms
        self.tpot_margin_frac = tpot_margin_frac
        self.max_per_target = max_per_target
        self._draining: dict[str, _Draining] = {}
        self._step_ms: dict[str, tuple[int, float]] = {}  # active decode instance -> (running, step ms) reported
        self._pending: dict[str, int] = {}  # target -> moves ordered since its last heartbeat

    def report(self, now_ms: float, heartbeat: WorkerHeartbeat) -> set[str]:
        """Read a heartbeat's decode instances; the models with a draining one (to plan for)."""
        models: set[str] = set()
        if self._draining:
            listed = {status.instance_id for status in heartbeat.instances}
            for iid in [i for i, e in self._draining.items() if e.worker_id == heartbeat.worker_id
                        and i not in listed]:
                del self._draining[iid]  # drained: gone from its worker's heartbeat
        for status in heartbeat.instances:
            if status.role != InstanceRole.DECODE:
                continue
            iid = status.instance_id
            if status.state == ModelState.DRAINING:
                entry = self._draining.get(iid)
                if entry is None:
                    entry = self._draining[iid] = _Draining(status.model, heartbeat.worker_id, now_ms,
                                                            status.num_running, now_ms)
                entry.num_running, entry.reported_ms = status.num_running, now_ms
                models.add(status.model)
                continue
            self._draining.pop(iid, None)
            self._pending.pop(iid, None)
            tps = status.decode_tokens_per_s
            if status.num_running and tps and tps > 0:
                self._step_ms[iid] = (status.num_running, 1e3 * status.num_running / tps)
            else:
                self._step_ms.pop(iid, None)
        return models

    def forget(self, instance_id: str) -> None:
        self._draining.pop(instance_id, None)
        self._step_ms.pop(instance_id, None)
        self._pending.pop(instance_id, None)

    def plan(self, now_ms: float, model: str, targets: Sequence[InstanceRecord], backlog: Callable[[str], int],
             tpot_slo_ms: float) -> list[MoveDecodes]:
        """The moves to order now for one model's draining instances, onto `targets` (its routable decode
        instances), whose backlogs (waiting + running) `backlog` gives."""
        sources = sorted((e.num_running, iid) for iid, e in self._draining.items()
                         if e.model == model and e.num_running > 0 and now_ms - e.since_ms >= self.after_draining_ms
                         and e.reported_ms > e.ordered_ms)
        if not sources or not targets or not tpot_slo_ms > 0:
            return []
        room = {t.instance_id: self._room(t, backlog(t.instance_id), tpot_slo_ms) for t in targets}
        by_room = sorted(targets, key=lambda t: (-room[t.instance_id], t.instance_id))
        moves: list[MoveDecodes] = []
        for num_running, iid in sources:
            entry = self._draining[iid]
            left = num_running
            for target in by_room:
                n = min(left, room[target.instance_id])
                if n <= 0:
                    continue
                moves.append(MoveDecodes(model, iid, entry.worker_id, target.instance_id, target.worker_id, n))
                room[target.instance_id] -= n
                self._pending[target.instance_id] = self._pending.get(target.instance_id, 0) + n
                left -= n
                if left == 0:
                    break
            if left < num_running:
                entry.ordered_ms = now_ms
        return moves

    def _room(self, target: InstanceRecord, backlog: int, tpot_slo_ms: float) -> int:
        pending = self._pending.get(target.instance_id, 0)
        room = min(self.max_per_target, target.max_num_seqs - backlog) - pending
        reported = self._step_ms.get(target.instance_id)
        if reported is not None:
            running, step_ms = reported
            # step(b) <= step(b0) * b / b0 while decode is memory-bound; keep it within the margin of the SLO
            within_slo = math.floor(running * (self.tpot_margin_frac * tpot_slo_ms / step_ms - 1.0) + 1e-9)
            room = min(room, within_slo - max(0, backlog - running) - pending)
        return max(0, room)

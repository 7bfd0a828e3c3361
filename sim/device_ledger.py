"""Device time by kind of instance: which instances the active devices held, so that a run's device-hours can be
taken apart by app, role (colocated, prefill, decode) and pool (docs/sim.md, "Where the device-hours go").

A device group's time is shared equally among the instances on it at each moment (a steady device holding three
small models charges each a third), so the kinds add up to the active-device integral the headline's device-hours
come from, over the same span (the trace's: the tail a run spends finishing its last requests is left out, as
there)."""
from __future__ import annotations

import math
from collections import defaultdict

Kind = tuple[int, str, str]  # (app, role, pool)
# devices a system is charged for with no instance on them (Prism-like's fixed pool)
RESERVED: Kind = (-1, "reserved", "")


class DeviceLedger:
    """Call `changing(executor, now_s)` just before an executor's instances change and `emptied(executor)` when its
    last instance has left; `seconds_by_kind(now_s)` closes the books up to `now_s` (the horizon at most)."""

    def __init__(self, horizon_s: float = math.inf) -> None:
        if not horizon_s > 0:
            raise ValueError(f"DeviceLedger: horizon_s must be > 0, got {horizon_s}")
        self.horizon_s = horizon_s
        self._since_s: dict[object, float] = {}  # executor -> when its instances last changed
        self._seconds: dict[Kind, float] = defaultdict(float)

    def changing(self, executor, now_s: float) -> None:
        """Charge the executor's instances for their devices since its last change; its time restarts at now_s."""
        now_s = min(now_s, self.horizon_s)
        since_s = self._since_s.get(executor)
        if since_s is not None and executor.instances and now_s > since_s:
            share_s = len(executor.device_ids) * (now_s - since_s) / len(executor.instances)
            for inst in executor.instances:
                self._seconds[(inst.app, inst.role, inst.pool)] += share_s
        self._since_s[executor] = now_s

    def emptied(self, executor) -> None:
        self._since_s.pop(executor, None)

    def seconds_by_kind(self, now_s: float) -> dict[Kind, float]:
        """Device-seconds per (app, role, pool) up to now_s, the executors still holding instances charged too."""
        for executor in list(self._since_s):
            self.changing(executor, now_s)
        return dict(self._seconds)

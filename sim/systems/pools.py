"""The baselines' placement (Prism-like, BlitzScale-like): steady bins (device -> models) and instance counts
(model -> prefill/decode) applied directly on the simulated fleet, with tensor-parallel groups and the lifecycle's
load paths: removals make room first, a model that only moves keeps its last ready replica until the new one is
ready, instances stay where they are while wanted and prefer devices that hold their model warm.

Janus does not use this: its plans go through the reconciler core (`planner.core.Reconciler`) and the fleet port
(systems/fleet.py), as they do live."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..executor import SimInstance
from .base import SystemRun


@dataclass
class PendingSteady:
    device: int
    app: int


@dataclass
class PoolManager:
    run: SystemRun
    steady: dict[tuple[int, int], SimInstance] = field(default_factory=dict)  # (device, app) -> instance
    steady_devices: set[int] = field(default_factory=set)  # devices the latest steady plan uses
    pending_steady: list[PendingSteady] = field(default_factory=list)
    pending_removal: list[SimInstance] = field(default_factory=list)
    elastic: dict[tuple[int, str], list[SimInstance]] = field(default_factory=dict)  # (app, role) -> instances
    num_blocked: int = 0  # elastic instances a plan wanted that found no device
    elastic_apps: set[int] = field(default_factory=set)  # apps the latest elastic targets want instances of
    awaiting_elastic: set[int] = field(default_factory=set)  # apps that left the steady pool since those targets

    # ------------------------------------------------------------------------------------------ steady pool
    def apply_steady(self, bins: dict[int, list[int]], now_s: float, preloaded: bool = False) -> None:
        """Make the steady pool match `bins` (device -> apps)."""
        desired = {(d, a) for d, apps in bins.items() for a in apps}
        self.steady_devices = set(bins)
        self.pending_steady = [p for p in self.pending_steady if (p.device, p.app) in desired]
        pending = {(p.device, p.app) for p in self.pending_steady}
        for key in sorted(desired - set(self.steady) - pending):
            self.pending_steady.append(PendingSteady(*key))
        for key in sorted(set(self.steady) - desired):
            inst = self.steady.pop(key)
            self.pending_removal.append(inst)
            self.awaiting_elastic.add(inst.app)
        self._progress_steady(now_s, preloaded)

    def _progress_steady(self, now_s: float, preloaded: bool = False) -> None:
        run = self.run
        sim = run.sim
        still: list[PendingSteady] = []
        for p in self.pending_steady:
            executor = sim.executor_of_device.get(p.device)
            if executor is not None and any(i.pool == "elastic" for i in executor.instances):
                for inst in list(executor.instances):  # the steady pool is served first: elastic makes room
                    if inst.pool == "elastic" and not inst.is_draining:
                        self._forget_elastic(inst)
                        run.retire(inst, now_s)
                still.append(p)
                continue
            weights = run.costs[p.app].weight_bytes
            free = executor.free_hbm_bytes if executor is not None else sim.hbm_bytes_per_device
            if weights > free:
                still.append(p)  # an old model is still draining off this device
                continue
            self.steady[(p.device, p.app)] = run.launch(p.app, "colocated", "steady", (p.device,), now_s, preloaded)
        self.pending_steady = still
        keep: list[SimInstance] = []
        for inst in self.pending_removal:
            if inst.is_ready and self._is_wanted(inst.app) and not self._has_other_ready(inst):
                keep.append(inst)  # make before break: it serves (and is forked from) until another is ready
                continue
            run.retire(inst, now_s, keep_warm=False)
        self.pending_removal = keep

    def _is_wanted(self, app: int) -> bool:
        """Still placed somewhere: moving inside the steady pool, or going to (or in) the elastic pool."""
        return app in self.steady_apps() or app in self.awaiting_elastic or app in self.elastic_apps

    def _has_other_ready(self, inst: SimInstance) -> bool:
        return any(i is not inst and i.is_ready for i in self.run.sim.instances_by_app.get(inst.app, ()))

    def steady_apps(self) -> set[int]:
        return {a for (_, a) in self.steady} | {p.app for p in self.pending_steady}

    # ------------------------------------------------------------------------------------------ elastic pool
    def elastic_budget(self) -> int:
        """Devices the steady pool leaves: the fleet minus the steady plan's devices and devices a steady
        instance still holds."""
        held = {d for (d, _) in self.steady} | {i.executor.device_ids[0] for i in self.pending_removal
                                                 if i.executor is not None}
        return self.run.scenario.num_devices - len(self.steady_devices | held)

    def apply_elastic(self, targets: dict[int, tuple[int, int]], now_s: float, priority: dict[int, float],
                      preloaded: bool = False) -> None:
        """Make the elastic pool match `targets` (app -> (num_prefill, num_decode); num_decode 0 means colocated
        instances). Removals first; then launches while devices last: first every model that has no instance left
        (without one, each of its requests is turned away at once), then the one furthest below its count (as a
        share of it), then the busiest."""
        run = self.run
        wanted: dict[tuple[int, str], int] = {}
        for app, (num_prefill, num_decode) in targets.items():
            if num_decode == 0:
                wanted[(app, "colocated")] = num_prefill
            else:
                wanted[(app, "prefill")] = num_prefill
                wanted[(app, "decode")] = num_decode
        self.elastic_apps = {app for (app, _), n in wanted.items() if n > 0}
        self.awaiting_elastic.clear()
        self._progress_steady(now_s)
        for key in list(self.elastic):
            insts = self.elastic[key]
            surplus = len(insts) - wanted.get(key, 0)
            if surplus > 0 and wanted.get(key, 0) == 0 and self._switching_roles(key[0], key[1], wanted):
                continue  # make before break: the model changes between colocated and P/D; keep serving
            if surplus > 0:
                # not-ready ones first (nothing to drain), then the least busy
                for inst in sorted(insts, key=lambda i: (i.is_ready, i.num_in_flight))[:surplus]:
                    self._forget_elastic(inst)
                    run.retire(inst, now_s)
        blocked_devices = self.steady_devices | {p.device for p in self.pending_steady}
        free = [d for d in run.sim.free_device_ids() if d not in blocked_devices]
        has_instance = {app for (app, _), insts in self.elastic.items() if insts}
        # Most starved first: a model far below its count (a small one left with one instance in a saturated fleet)
        # gets freed devices before a busier one a few short of its count; ties go to the busier model.
        def order(k: tuple[int, str]) -> tuple:
            have = len(self.elastic.get(k, ()))
            return (k[0] in has_instance, have / wanted[k] if wanted[k] else 1.0, -priority.get(k[0], 0.0), k)

        for key in sorted(wanted, key=order):
            app, role = key
            have = len(self.elastic.get(key, ()))
            tp = run.costs[app].tp
            for _ in range(wanted[key] - have):
                group = self._pick_group(free, app, tp)
                if group is None:
                    self.num_blocked += 1
                    break
                for d in group:
                    free.remove(d)
                inst = run.launch(app, role, "elastic", group, now_s, preloaded)
                self.elastic.setdefault(key, []).append(inst)

    def _switching_roles(self, app: int, old_role: str, wanted: dict[tuple[int, str], int]) -> bool:
        """True while `app` moves between colocated and prefill/decode instances and the new layout has nothing
        ready yet: its old instances keep serving until then."""
        new_roles = [r for (a, r), n in wanted.items() if a == app and n > 0 and r != old_role]
        if not new_roles:
            return False
        def ready(role: str) -> bool:
            return any(i.is_ready for i in self.elastic.get((app, role), ()))
        if "colocated" in new_roles:
            return not ready("colocated")
        return not (ready("prefill") and ready("decode"))

    def _pick_group(self, free: list[int], app: int, tp: int) -> tuple[int, ...] | None:
        if len(free) < tp:
            return None
        warm = [d for d in free if (d, app) in self.run.warm]
        if len(warm) >= tp:
            return tuple(warm[:tp])
        return tuple(free[:tp])

    def _forget_elastic(self, inst: SimInstance) -> None:
        insts = self.elastic.get((inst.app, inst.role))
        if insts and inst in insts:
            insts.remove(inst)

    def elastic_counts(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for (app, _), insts in self.elastic.items():
            out[app] = out.get(app, 0) + len(insts)
        return out

"""The oracle service's refit thread on the simulated clock. Live (oracle/refit.py: BackgroundRefitter), one thread
refits the (model, kind) pairs due one at a time while the planners go on asking the old GPs; a new GP answers only
once its training is over. Here the same real gpytorch training runs at once, between two simulated events, and
its predictor is installed after the wall time that training took, measured (the machine running the simulation
stands for the oracle's): the planners decide on the old GPs meanwhile, as they would live. With `fixed_wall_s` every
fit is taken to last that long instead: the measured time follows how busy this machine is (two runs of the same code
differed by ~10 % of device-hours, docs/bench/sim.md run 38), a fixed one makes a run repeatable."""
from __future__ import annotations

import logging
import time
from typing import Callable

from oracle.core.oracle import Oracle

log = logging.getLogger(__name__)


class SimulatedRefitter:
    """One refit in flight at a time, as the live thread; `poke` at every window the oracle learnt and after each
    install starts the next refit due. `on_installed(now_s)` runs when a new GP serves (the simulated Janus clears
    its memo of the old GPs' answers there)."""

    def __init__(self, oracle: Oracle, at: Callable[[float, Callable[[float], None]], None],
                 on_installed: Callable[[float], None], clock: Callable[[], float] = time.perf_counter,
                 fixed_wall_s: float | None = None) -> None:
        if fixed_wall_s is not None and fixed_wall_s < 0:
            raise ValueError(f"a refit's fixed wall time is >= 0 s, not {fixed_wall_s}")
        self.oracle = oracle
        self.at = at  # the simulation's scheduler: at(time_s, fn(now_s))
        self.on_installed = on_installed
        self.clock = clock  # wall clock of the training (injected for tests)
        self.fixed_wall_s = fixed_wall_s  # None: a fit serves after its measured wall time
        self.in_flight: tuple[str, str] | None = None
        self.num_refits = 0
        self.num_failures = 0
        self.fit_walls_s: list[float] = []  # each fit's measured wall time

    def poke(self, now_s: float) -> None:
        """Start the first refit due, unless one is in flight (it starts the next when it is installed)."""
        if self.in_flight is not None:
            return
        for model, kind in self.oracle.due_for_refit(now_s):
            samples = self.oracle.refit_samples(model, kind, now_s)
            start = self.clock()
            try:
                predictor = self.oracle.train(model, kind, samples)
            except Exception:  # noqa: BLE001 - as live: a failed fit keeps the old GP, the thread goes on
                self.num_failures += 1
                log.exception("simulated refit of %s %s failed; keeping the previous model", model, kind)
                continue
            wall_s = self.clock() - start
            self.fit_walls_s.append(wall_s)
            self.in_flight = (model, kind)
            serves_after_s = wall_s if self.fixed_wall_s is None else self.fixed_wall_s
            self.at(now_s + serves_after_s, lambda t, m=model, k=kind, p=predictor, n=len(samples):
                    self._install(t, m, k, p, n))
            return

    def _install(self, now_s: float, model: str, kind: str, predictor, num_samples: int) -> None:
        self.oracle.install_fit(model, kind, predictor)
        self.oracle.fitted(model, kind, num_samples)
        self.in_flight = None
        self.num_refits += 1
        self.on_installed(now_s)
        self.poke(now_s)

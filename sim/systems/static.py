"""Static partition (the paper's ServerlessLLM configuration): every app on its own fixed devices for the whole
run, sized in proportion to its demand, the fleet split among the apps once."""
from __future__ import annotations

import numpy as np

from dispatcher.core import Algorithm

from ..scenario import window_features
from .base import ControlPlane, SystemRun, largest_remainder_alloc


def demand_replicas(scenario, app: int, window_s: float = 30.0, quantile: float = 0.9,
                    max_utilisation: float = 0.7) -> int:
    """Replicas the app needs at the `quantile` of its per-window load: its roofline need (the busiest of compute,
    bandwidth and HBM, in devices) over the group size, kept under `max_utilisation` of each replica."""
    trace = scenario.trace
    feats = [window_features(trace, app, s, s + window_s) for s in np.arange(0.0, trace.duration_s, window_s)]
    busy = [f for f in feats if f.token_rate_tps > 0]
    if not busy:
        return 1
    rates = np.array([f.token_rate_tps for f in busy])
    pick = busy[int(np.argsort(rates)[min(len(rates) - 1, int(quantile * len(rates)))])]
    rm = scenario.roofline(app)
    need = rm.needs(pick)
    return max(1, int(np.ceil(max(need.as_tuple()) / rm.tp / max_utilisation)))


class StaticPartition(ControlPlane):
    name = "static"
    uses_load_windows = False

    def __init__(self, algorithm: Algorithm = Algorithm.LEAST_LOAD, replicas: list[int] | None = None):
        self.algorithm = algorithm
        self.replicas = replicas

    def install(self, run: SystemRun) -> None:
        scenario = run.scenario
        tps = np.array([a.tp for a in scenario.apps])
        replicas = np.array(self.replicas if self.replicas is not None else
                            [demand_replicas(scenario, a) for a in range(len(scenario.apps))])
        # split the fleet in units of each app's group size, proportional to demand, at least one replica each
        devices = largest_remainder_alloc(replicas * tps, scenario.num_devices, tps)
        counts = np.maximum(devices // tps, 1)
        self.allocated = counts
        next_device = 0
        for app, count in enumerate(counts):
            for _ in range(int(count)):
                group = tuple(range(next_device, next_device + int(tps[app])))
                if group[-1] >= scenario.num_devices:
                    break
                run.launch(app, "colocated", "steady", group, 0.0, preloaded=True)
                next_device += int(tps[app])

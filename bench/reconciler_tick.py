"""What the reconciler core costs on a large fleet: Janus in the simulator over the first --window-s seconds of the
headline (768 devices), every call into `planner.core.Reconciler` timed, against the whole run's CPU time.

    .venv/bin/python bench/reconciler_tick.py --window-s 300

Prints, per kind of call (tick, plan, observed heartbeat, reply...), the count, median and p90 time and the total,
and the share of the run that the reconciler and the fleet port (its simulated workers) took.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.core import Reconciler  # noqa: E402
from sim.systems import fleet as fleet_module  # noqa: E402

CALLS = ("on_tick", "on_steady_plan", "on_elastic_plan", "observe_heartbeat", "observe_alive", "observe_reply",
         "observe_record")


def timed(cls, names, book: dict[str, list[float]]):
    """Wrap `names` of `cls` so each call's wall time lands in book[name] (ms)."""
    for name in names:
        original = getattr(cls, name)

        def wrapper(self, *args, _original=original, _name=name, **kwargs):
            t0 = time.perf_counter()
            try:
                return _original(self, *args, **kwargs)
            finally:
                book.setdefault(_name, []).append((time.perf_counter() - t0) * 1e3)

        setattr(cls, name, wrapper)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--window-s", type=float, default=300.0)
    args = p.parse_args()
    from sim.runner import ScenarioSpec, run_one

    book: dict[str, list[float]] = {}
    timed(Reconciler, CALLS, book)
    port: dict[str, list[float]] = {}
    timed(fleet_module.SimFleet, ("_beat", "_report", "_execute"), port)
    cpu0 = time.process_time()
    # the clairvoyant oracle, as its figures in docs/benchmarks.md were taken (the GP oracle's tick: bench/oracle.py)
    result = run_one(ScenarioSpec(window_s=args.window_s, oracle="clairvoyant"), "janus")
    cpu_s = time.process_time() - cpu0
    print(f"janus, first {args.window_s:.0f} s of the headline: token attainment "
          f"{result.summary.token_attainment:.4f} on {result.summary.device_hours:.1f} device-hours; {cpu_s:.1f} CPU s")
    print(f"{'call':>20} {'count':>8} {'median ms':>10} {'p90 ms':>8} {'total s':>8}")
    for name in CALLS:
        times = np.array(book.get(name, [0.0]))
        print(f"{name:>20} {len(book.get(name, [])):>8} {np.median(times):>10.3f} {np.percentile(times, 90):>8.3f} "
              f"{times.sum() / 1e3:>8.2f}")
    reconciler_s = sum(sum(v) for v in book.values()) / 1e3
    beat_s = sum(port.get("_beat", [])) / 1e3  # includes the heartbeats it observes (counted above too)
    execute_s = sum(port.get("_execute", [])) / 1e3
    print(f"reconciler: {reconciler_s:.1f} s ({100 * reconciler_s / cpu_s:.1f} % of the run); fleet beats "
          f"{beat_s:.1f} s and commands {execute_s:.1f} s (reconciler calls inside them included above)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

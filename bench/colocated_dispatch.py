"""Dispatch over co-located instances (issue 9): LST-IMH against least-load on the simulator, same trace, same fleet.

The busiest app of the light mix (Qwen2.5-14B, ~154 req/s, 650-token outputs) for the first `--window-s` seconds,
alone on a fixed `--num-devices` co-located H200 instances (the static partition's layout, so no scaler moves the
counts). Each request decodes on the instance that prefilled it, so how the dispatcher spreads prefills decides
every instance's decode batch.

    .venv/bin/python bench/colocated_dispatch.py [--window-s 80] [--num-devices 60]
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import table  # noqa: E402
from dispatcher.core import Algorithm, DispatchPolicy, OverloadPolicy  # noqa: E402
from sim.runner import ScenarioSpec  # noqa: E402
from sim.scenario import build_scenario  # noqa: E402
from sim.systems.base import SystemRun  # noqa: E402
from sim.systems.static import StaticPartition  # noqa: E402
from sim.trace import Trace  # noqa: E402

BUSIEST_APP = 1  # app-01 of the headline trace: 37 % of all requests


def busiest_app_scenario(window_s: float, num_devices: int):
    full = ScenarioSpec().build_trace().window(0, window_s)
    mine = full.app_ids == BUSIEST_APP
    trace = Trace.build(full.arrival_s[mine], np.zeros(int(mine.sum()), int), full.input_tokens[mine],
                        full.output_tokens[mine], ("app-01",))
    scenario = build_scenario(trace, num_devices=num_devices, tiers=((1.0, ("qwen2.5-14b",)),))
    return dataclasses.replace(scenario, num_devices=num_devices)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window-s", type=float, default=80.0)
    ap.add_argument("--num-devices", type=int, default=60)
    args = ap.parse_args()
    scenario = busiest_app_scenario(args.window_s, args.num_devices)
    policies = {
        "least-load": DispatchPolicy(algorithm=Algorithm.LEAST_LOAD),
        "LST-IMH, requeue": DispatchPolicy(algorithm=Algorithm.LST_IMH, overload=OverloadPolicy.REQUEUE),
        "LST-IMH, reject": DispatchPolicy(algorithm=Algorithm.LST_IMH),
    }
    rows = []
    for name, policy in policies.items():
        t0 = time.process_time()
        s = SystemRun(scenario, StaticPartition(), dispatch_policy=policy).run().summary
        rows.append([name, f"{s.token_attainment:.4f}", f"{s.ttft_attainment:.4f}", f"{s.tpot_attainment:.4f}",
                     s.num_failed, f"{time.process_time() - t0:.1f}"])
    print(f"{scenario.trace.num_requests} requests over {args.window_s:g} s on {args.num_devices} co-located "
          f"instances")
    print(table(["dispatch", "token att.", "TTFT att.", "TPOT att.", "failed", "CPU s"], rows))


if __name__ == "__main__":
    main()

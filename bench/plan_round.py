"""The cost of one LST-IMH round on rounds recorded from the simulator, against another commit's planner.

Runs Janus in the simulator over the first --window-s seconds of the headline workload, records the inputs and the
decision of every --sample-th round (`dispatcher.core.round.plan_round`), then times this tree's `plan_round` on
them. With --against REF it loads REF's `dispatcher/core` (git archive, imported under another name) and times its
`plan_round` on the same rounds in the same process, and checks that both decide every round alike.

    .venv/bin/python bench/plan_round.py --against HEAD~3
"""
from __future__ import annotations

import argparse
import copy
import importlib
import io
import subprocess
import sys
import tarfile
import tempfile
import time
import types
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import dispatcher.core.core as core_module  # noqa: E402
from dispatcher.core.round import plan_round  # noqa: E402


def record_rounds(window_s: float, sample: int) -> list[tuple]:
    """(now, jobs, available, p_ij matrix, policy, decision) of every `sample`-th round of a Janus run."""
    from sim.runner import ScenarioSpec, run_one

    rounds: list[tuple] = []
    seen = [0]

    def recording(now, jobs, available, rows, policy):
        decision = plan_round(now, jobs, available, rows, policy)
        seen[0] += 1
        if seen[0] % sample == 0:
            # jobs are mutated by later rounds (relaxations): keep copies as they were
            copies = [copy.copy(j) for j in jobs]
            rounds.append((now, copies, list(available), np.array(rows, dtype=np.float64), policy, decision))
        return decision

    core_module.plan_round = recording
    try:
        # the clairvoyant oracle, as the figures in docs/benchmarks.md were taken (GP ticks: bench/oracle.py)
        run_one(ScenarioSpec(mix="default", window_s=window_s, oracle="clairvoyant"), "janus")
    finally:
        core_module.plan_round = plan_round
    return rounds


def planner_at(ref: str):
    """The LST-IMH round (`dispatcher.core.round`, once `.planner`) as it was at commit `ref`, as a separate package."""
    tar = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", ref, "dispatcher/core"], check=True,
                         capture_output=True).stdout
    folder = Path(tempfile.mkdtemp(prefix="janus-planner-"))
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.extractall(folder, filter="data")
    package = types.ModuleType("planner_at_ref")
    package.__path__ = [str(folder / "dispatcher" / "core")]
    sys.modules["planner_at_ref"] = package
    named = "round" if (folder / "dispatcher" / "core" / "round.py").exists() else "planner"  # its name until a2b3238
    return importlib.import_module(f"planner_at_ref.{named}")


def _fields(decision) -> tuple:
    return decision.commits, decision.rejected, decision.relaxed, decision.hopeless_at_ms


def time_rounds(fn, rounds: list[tuple], as_rows: bool, repeats: int) -> float:
    """Median over repeats of the mean µs per round."""
    inputs = [(now, jobs, available, [m[0].tolist()] * len(available) if as_rows and bool((m == m[0]).all())
               else (m.tolist() if as_rows else m), policy) for now, jobs, available, m, policy, _ in rounds]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for now, jobs, available, proc, policy in inputs:
            fn(now, jobs, available, proc, policy)
        times.append((time.perf_counter() - start) / len(inputs) * 1e6)
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window-s", type=float, default=120.0, help="simulated seconds to record rounds from")
    parser.add_argument("--sample", type=int, default=4, help="record every n-th round")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--against", default=None, help="a commit whose planner to time on the same rounds")
    args = parser.parse_args()
    rounds = record_rounds(args.window_s, args.sample)
    multi = [r for r in rounds if len(r[1]) > 1]
    print(f"{len(rounds)} rounds recorded ({len(multi)} with more than one queued request; mean queue "
          f"{np.mean([len(r[1]) for r in rounds]):.1f}, mean instances {np.mean([len(r[2]) for r in rounds]):.1f})")
    old = planner_at(args.against) if args.against else None
    if old is not None:
        differ = sum(_fields(old.plan_round(now, jobs, available, m, policy))
                     != _fields(plan_round(now, jobs, available, m, policy))
                     for now, jobs, available, m, policy, _ in rounds)
        print(f"decisions that differ from {args.against}'s: {differ} of {len(rounds)}")
    print(f"{'rounds':<8} {'this tree µs':>13}" + (f" {args.against + ' µs':>16} {'ratio':>6}" if old else ""))
    for name, subset in (("all", rounds), ("multi", multi)):
        new_us = time_rounds(plan_round, subset, True, args.repeats)
        line = f"{name:<8} {new_us:>13.1f}"
        if old is not None:
            old_us = time_rounds(old.plan_round, subset, False, args.repeats)
            line += f" {old_us:>16.1f} {new_us / old_us:>6.2f}"
        print(line)


if __name__ == "__main__":
    main()

"""Small helpers shared by the benchmarks: percentiles, tables, where the shared traces are, load generators in
their own virtual environments and bounded runs of them."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent


def shared_dir() -> Path:
    """The shared data folder: $JANUS_SHARED_DIR, else `shared` beside the repository."""
    return Path(os.environ.get("JANUS_SHARED_DIR", REPO_ROOT.parent / "shared"))


def pct(values, q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else float("nan")


def table(headers: list[str], rows: list[list[object]]) -> str:
    cells = [[str(h) for h in headers]] + [[f"{c:.3f}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    line = lambda row: "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |"  # noqa: E731
    return "\n".join([line(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] +
                     [line(r) for r in cells[1:]])


def venv_tool(venv_dir: Path, spec: str, exe_name: str) -> Path:
    """`exe_name` from a virtual environment of its own, made with `spec` from PyPI on first use: the load
    generators pin other versions of libraries the project uses, and bring some (uvloop) that would change it."""
    exe = venv_dir / "bin" / exe_name
    if not exe.exists():
        print(f"installing {spec} into {venv_dir} (once) ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv_dir)], check=True)
        subprocess.run([str(venv_dir / "bin" / "python"), "-m", "pip", "install", "-q",
                        "--disable-pip-version-check", spec], check=True)
    return exe


def installed_version(venv_dir: Path, dist: str) -> str:
    """The version of `dist` installed in venv_dir, as its own metadata says (the venv may predate a pin)."""
    code = f"import importlib.metadata as m; print(m.version({dist!r}))"
    done = subprocess.run([str(venv_dir / "bin" / "python"), "-c", code], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def stop_group(proc: subprocess.Popen, sig: int = signal.SIGTERM, grace_s: float = 10.0,
               leftovers_s: float = 5.0) -> None:
    """Stops the process group `proc` leads (started with start_new_session): `sig` first, SIGKILL after grace_s,
    and SIGKILL for what is left of the group leftovers_s after the leader went (the tools spawn workers)."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    deadline = time.monotonic() + leftovers_s
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@dataclass
class Bounded:
    """How a bounded run ended: its exit status (None when killed before it had one), whether it ran out of time."""
    returncode: int | None
    timed_out: bool
    wall_s: float

    @property
    def ok(self) -> bool:
        return not self.timed_out and self.returncode == 0


def run_bounded(cmd: list[str], timeout_s: float, log_path: Path, cwd: Path | None = None) -> Bounded:
    """Runs cmd in a process group of its own, stdout and stderr to log_path; past timeout_s the whole group is
    stopped, so a hung client is a failed run rather than a hung benchmark."""
    start = time.monotonic()
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True)
        try:
            proc.wait(timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        stop_group(proc, grace_s=5.0, leftovers_s=0.0 if not timed_out else 5.0)
    return Bounded(None if timed_out else proc.returncode, timed_out, time.monotonic() - start)


def aiperf_statuses(out_dir: Path) -> Counter[str]:
    """aiperf's per-request records (profile_export.jsonl) of the profiling phase counted by outcome: "200", or a
    failure's HTTP code (else its error type)."""
    statuses: Counter[str] = Counter()
    with (out_dir / "profile_export.jsonl").open() as records:
        for line in records:
            if not line.strip():
                continue
            rec = json.loads(line)
            if rec.get("metadata", {}).get("benchmark_phase", "profiling") != "profiling":
                continue
            err = rec.get("error")
            statuses["200" if not err else str(err.get("code") or err.get("type") or "error")] += 1
    return statuses


def aiperf_stat(summary: dict, metric: str, key: str) -> float:
    """One statistic ("p50", "avg", ...) of one metric from aiperf's profile_export_aiperf.json; NaN if absent."""
    value = (summary.get(metric) or {}).get(key)
    return math.nan if value is None else float(value)

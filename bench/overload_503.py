"""Share of 503s under an overload: the dispatcher's old defaults against its new ones, measured with aiperf.

Starts a `janus up` cluster (the two demo models on two CPU workers, as `make up` serves them) twice in one run, each
from a fresh state folder, and drives each with aiperf (its CLI, as a subprocess) at a fixed concurrency for a fixed
time:

- old: `dispatcher: {overload: reject, window_s: 2.0, max_wait_for_instance_ms: 5000}` (the defaults before the
  simulator's pick), forced by a cluster YAML;
- new: `dispatcher: {}`, i.e. today's defaults (requeue, up to max_num_relaxations TTFT SLOs late; 5 s window;
  30 s wait for an instance).

aiperf's per-request records give the HTTP status of every failure; the table counts them, with the requests
completed and their latency (aiperf's summary: completed requests only).

    .venv/bin/python bench/overload_503.py                 # 2 x 60 s at concurrency 16, about 5 minutes
    .venv/bin/python bench/overload_503.py --duration-s 20 --json out.json

aiperf lives in its own virtual environment (.janus/aiperf-venv, made on first use from the `bench` extra in
pyproject.toml; `--aiperf PATH` names another): it pins older prometheus-client, rich and huggingface-hub than the
project's, and brings uvloop and httptools, which uvicorn would then pick up for the gateway, so the figures would
measure another HTTP stack than the one Janus ships with.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from functools import partial
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    REPO_ROOT, aiperf_stat, aiperf_statuses, run_bounded, stop_group, table, venv_tool)
from runtime.ports import free_loopback_ports  # noqa: E402

AIPERF_VENV = REPO_ROOT / ".janus" / "aiperf-venv"
VARIANTS = {
    "old": {"overload": "reject", "window_s": 2.0, "max_wait_for_instance_ms": 5000},
    "new": {},
}
MODELS = ("demo-tiny", "demo-small")


def aiperf_spec() -> str:
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return next(req for req in extras["bench"] if req.startswith("aiperf"))


def find_aiperf(explicit: Path | None) -> Path:
    """--aiperf, else one beside this Python, else on PATH, else .janus/aiperf-venv (made now if missing)."""
    if explicit is not None:
        return explicit
    beside = Path(sys.executable).with_name("aiperf")
    if beside.exists():
        return beside
    on_path = shutil.which("aiperf")
    if on_path:
        return Path(on_path)
    return venv_tool(AIPERF_VENV, aiperf_spec(), "aiperf")


class JanusUp:
    """`janus up` in its own process group, from a fresh state folder; stopped with Ctrl-C as a person would."""

    def __init__(self, workdir: Path, dispatcher: dict) -> None:
        self.workdir = workdir
        self.state_dir = workdir / "state"
        self.config = workdir / "cluster.yaml"
        self.config.write_text(json.dumps({"dispatcher": dispatcher}) + "\n")  # JSON is YAML
        self.port = free_loopback_ports(1)[0]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "janus-up.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 300.0) -> None:
        janus = Path(sys.executable).with_name("janus")
        with self.log.open("w") as out:
            # --no-profile: a fresh state folder would first profile both demo models for minutes (the oracle's
            # training sets), and this bench's figures were taken with the roofline oracle
            self.proc = subprocess.Popen([str(janus), "up", "--config", str(self.config), "--port", str(self.port),
                                          "--state-dir", str(self.state_dir), "--no-profile"], stdout=out,
                                         stderr=subprocess.STDOUT, cwd=REPO_ROOT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        ready: set[str] = set()
        while ready != set(MODELS):  # every model answers a request: its instances are up and routed to
            if self.proc.poll() is not None:
                raise RuntimeError(f"janus up exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the cluster was not ready in {timeout_s:.0f} s:\n{self.log.read_text()[-3000:]}")
            for model in set(MODELS) - ready:
                try:
                    r = httpx.post(f"{self.url}/v1/completions", timeout=30,
                                   json={"model": model, "prompt": "Hello", "max_tokens": 2})
                    if r.status_code == 200:
                        ready.add(model)
                except httpx.HTTPError:
                    pass
            time.sleep(1.0)

    def stop(self, timeout_s: float = 90.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        # the services are the launcher's children in its process group: none may outlive the run
        stop_group(self.proc, signal.SIGINT, grace_s=timeout_s)


class LoadSampler:
    """The machine's 1-minute load average every 5 s while a run lasts: the box is shared, and the two variants
    run one after the other, so the doc can say how busy it was for each."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(5.0):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> "LoadSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def mean(self) -> float:
        return sum(self.samples) / len(self.samples) if self.samples else float("nan")


def run_aiperf(aiperf: Path, cluster: JanusUp, out_dir: Path, args: argparse.Namespace) -> Path:
    cmd = [str(aiperf), "profile", "--model-names", ",".join(MODELS), "--model-selection-strategy", "round_robin",
           "--url", cluster.url, "--endpoint-type", "chat", "--streaming",
           "--concurrency", str(args.concurrency), "--benchmark-duration", str(args.duration_s),
           "--benchmark-grace-period", str(args.grace_s),
           "--tokenizer", str(cluster.state_dir / "models" / MODELS[0]),
           "--prompt-input-tokens-mean", str(args.isl), "--prompt-output-tokens-mean", str(args.osl),
           "--extra-inputs", "ignore_eos:true", "--use-server-token-count", "--random-seed", "7",
           "--ui-type", "none", "--output-artifact-dir", str(out_dir)]
    log = out_dir.parent / f"{out_dir.name}.log"
    ran = run_bounded(cmd, args.duration_s + args.grace_s + 600, log, cwd=out_dir.parent)
    if not ran.ok:
        raise RuntimeError(f"aiperf {'timed out' if ran.timed_out else f'exited with {ran.returncode}'}: see {log}")
    return out_dir


def read_results(out_dir: Path) -> dict:
    """Statuses from the per-request records (a failure carries its HTTP code); latency from the summary."""
    statuses = aiperf_statuses(out_dir)
    summary = json.loads((out_dir / "profile_export_aiperf.json").read_text())
    stat = partial(aiperf_stat, summary)
    total = sum(statuses.values())
    return {"requests": total, "completed": statuses["200"], "statuses": dict(statuses),
            "share_503": statuses["503"] / total if total else float("nan"),
            "latency_p50_ms": stat("request_latency", "p50"), "latency_p99_ms": stat("request_latency", "p99"),
            "ttft_p50_ms": stat("time_to_first_token", "p50"), "ttft_p99_ms": stat("time_to_first_token", "p99"),
            "throughput_rps": stat("request_throughput", "avg")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration-s", type=int, default=60)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--isl", type=int, default=1024, help="prompt tokens (mean)")
    ap.add_argument("--osl", type=int, default=64, help="output tokens (mean)")
    ap.add_argument("--grace-s", type=int, default=30, help="aiperf's wait for answers after the duration")
    ap.add_argument("--only", choices=sorted(VARIANTS), action="append", help="run only this variant")
    ap.add_argument("--aiperf", type=Path, help="aiperf executable (default: see the module docstring)")
    ap.add_argument("--keep", type=Path, help="keep the artifacts (aiperf exports, janus up logs) here")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()

    aiperf = find_aiperf(args.aiperf)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="janus-overload-") as tmp:
        root = args.keep or Path(tmp)
        for name in args.only or list(VARIANTS):
            workdir = root / name
            workdir.mkdir(parents=True, exist_ok=True)
            cluster = JanusUp(workdir, VARIANTS[name])
            print(f"[{name}] janus up with dispatcher: {json.dumps(VARIANTS[name])} ...", flush=True)
            try:
                cluster.start()
                print(f"[{name}] aiperf: concurrency {args.concurrency}, {args.duration_s} s ...", flush=True)
                with LoadSampler() as load:
                    results[name] = read_results(run_aiperf(aiperf, cluster, workdir / "aiperf", args))
                results[name]["load_avg"] = load.mean
            finally:
                cluster.stop()
            print(f"[{name}] {results[name]['statuses']}", flush=True)

    labels = {"old": "old defaults: reject, window 2 s, wait 5 s",
              "new": "new defaults: requeue, window 5 s, wait 30 s"}
    rows = [[labels[n], r["requests"], r["completed"], r["statuses"].get("503", 0), f"{100 * r['share_503']:.1f} %",
             r["requests"] - r["completed"] - r["statuses"].get("503", 0), f"{r['throughput_rps']:.2f}",
             f"{r['latency_p50_ms']:.0f}", f"{r['latency_p99_ms']:.0f}", f"{r['ttft_p50_ms']:.0f}",
             f"{r['ttft_p99_ms']:.0f}", f"{r['load_avg']:.1f}"] for n, r in results.items()]
    print(f"\naiperf, chat streaming over {', '.join(MODELS)} (round robin), concurrency {args.concurrency}, "
          f"{args.duration_s} s, {args.isl} prompt / {args.osl} output tokens")
    print(table(["dispatcher", "requests", "completed", "503", "share 503", "other errors", "completed/s",
                 "p50 ms", "p99 ms", "TTFT p50 ms", "TTFT p99 ms", "load avg"], rows))
    print("(latency and TTFT: completed requests only, from aiperf's summary)")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results},
                                        indent=2))


if __name__ == "__main__":
    main()

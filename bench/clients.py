"""Real clients against a running gateway (issue 26): guidellm and aiperf, unmodified, from PyPI.

Drives a gateway that is already up (`make up`, or `janus up --no-profile --port PORT --state-dir DIR`) with, one
after the other, each for --duration-s at a constant --rate of requests per second:

- guidellm, streaming (its default), `guidellm run` with a constant-rate profile;
- aiperf, `aiperf profile`, chat, streaming;
- aiperf again with `--per-chunk-usage` (it then asks for usage in every chunk: `continuous_usage_stats`).

Each run is bounded by a hard timeout (duration + --margin-s): past it the client's whole process group is killed
and the run counts as failed. The figures come from each tool's own export (guidellm's JSON report, aiperf's
profile_export_aiperf.json and per-request profile_export.jsonl); beside them the server's own view of each run,
from the gateway's /metrics scraped before and after it (bench/server_view.py: the gateway's TTFT, how late its
event loop ran), which tells the server's time from the client's; the table is printed and a JSON summary written
to --out. The exit status is 1 when a run errored, timed out or completed nothing.

    .venv/bin/python bench/clients.py --gateway http://127.0.0.1:8000 --state-dir .janus --out artifacts/clients
    .venv/bin/python bench/clients.py --only guidellm --duration-s 10

The clients live in virtual environments of their own under --state-dir (guidellm-venv, aiperf-venv: the one
bench/overload_503.py makes for the default state folder), made from PyPI on first use with the versions pinned
below: they pin other versions of libraries the project uses.
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    Bounded, aiperf_stat, aiperf_statuses, installed_version, run_bounded, table, venv_tool)
from bench.server_view import ServerView, scrape, server_view  # noqa: E402

GUIDELLM_SPEC = "guidellm==0.8.1"
AIPERF_SPEC = "aiperf==0.13.0"
CLIENTS = ("guidellm", "aiperf", "aiperf-per-chunk")
AIPERF_GRACE_S = 30  # aiperf's wait for answers in flight when the duration ends


@dataclass
class Figures:
    """What one client run measured, from the client's own export."""
    completed: int = 0
    errored: int = 0
    incomplete: int | None = None  # guidellm's: cancelled when its duration ended (aiperf waits for them instead)
    ttft_p50_ms: float = math.nan
    ttft_p90_ms: float = math.nan
    itl_p50_ms: float = math.nan
    output_tokens_per_s: float = math.nan


@dataclass
class Outcome:
    client: str
    version: str
    command: list[str]
    ran: Bounded
    figures: Figures | None
    problem: str = ""
    server: ServerView | None = None  # the gateway's own view of the run (None: its /metrics could not be read)

    @property
    def failed(self) -> bool:
        return bool(self.problem) or self.figures is None or self.figures.errored > 0 or self.figures.completed == 0


# ---- guidellm --------------------------------------------------------------------------------------------------

def guidellm_command(exe: Path, args: argparse.Namespace, report: Path) -> list[str]:
    return [str(exe), "run",
            "--backend", f"kind=openai_http,target={args.gateway},model={args.model}",
            "--profile", f"kind=constant,rate={args.rate}",
            "--constraint", f"kind=max_duration,seconds={args.duration_s}",
            "--data", f"kind=synthetic_text,prompt_tokens={args.prompt_tokens},output_tokens={args.output_tokens}",
            "--tokenizer", f"kind=huggingface_auto,model={tokenizer_dir(args)}",
            "--output", f"kind=json,path={report}"]


def read_guidellm(report: Path) -> Figures:
    """guidellm's JSON report: the first benchmark's request totals and its metrics' distributions over the
    successful requests."""
    bench = json.loads(report.read_text())["benchmarks"][0]
    totals = bench["metrics"]["request_totals"]
    metrics = bench["metrics"]

    def dist(name: str) -> dict:
        return metrics[name]["successful"]

    return Figures(completed=int(totals["successful"]), errored=int(totals["errored"]),
                   incomplete=int(totals["incomplete"]),
                   ttft_p50_ms=float(dist("time_to_first_token_ms")["median"]),
                   ttft_p90_ms=float(dist("time_to_first_token_ms")["percentiles"]["p90"]),
                   itl_p50_ms=float(dist("inter_token_latency_ms")["median"]),
                   output_tokens_per_s=float(dist("output_tokens_per_second")["mean"]))


# ---- aiperf ----------------------------------------------------------------------------------------------------

def aiperf_command(exe: Path, args: argparse.Namespace, out_dir: Path, per_chunk: bool) -> list[str]:
    cmd = [str(exe), "profile", "--model-names", args.model, "--url", args.gateway,
           "--endpoint-type", "chat", "--streaming",
           "--request-rate", str(args.rate), "--arrival-pattern", "constant",  # aiperf's default is poisson
           "--benchmark-duration", str(args.duration_s), "--benchmark-grace-period", str(AIPERF_GRACE_S),
           "--tokenizer", str(tokenizer_dir(args)),
           "--prompt-input-tokens-mean", str(args.prompt_tokens),
           "--prompt-output-tokens-mean", str(args.output_tokens),
           "--random-seed", "7", "--ui-type", "none", "--output-artifact-dir", str(out_dir),
           # the tokens the server generated: the demo models emit arbitrary token ids, which aiperf's default
           # (re-tokenising the text) counts ~1.2x over, inflating tokens/s and deflating ITL; and --per-chunk-usage
           # requires it, so both aiperf runs count alike
           "--use-server-token-count",
           # no DCGM on a CPU box, and scraping /metrics is a load these figures do not ask for
           "--no-gpu-telemetry", "--no-server-metrics"]
    return cmd + (["--per-chunk-usage"] if per_chunk else [])


def read_aiperf(out_dir: Path) -> Figures:
    """Completed and errored from the per-request records (profiling phase); the rest from aiperf's summary."""
    statuses = aiperf_statuses(out_dir)
    summary = json.loads((out_dir / "profile_export_aiperf.json").read_text())
    return Figures(completed=statuses["200"], errored=sum(statuses.values()) - statuses["200"],
                   ttft_p50_ms=aiperf_stat(summary, "time_to_first_token", "p50"),
                   ttft_p90_ms=aiperf_stat(summary, "time_to_first_token", "p90"),
                   itl_p50_ms=aiperf_stat(summary, "inter_token_latency", "p50"),
                   output_tokens_per_s=aiperf_stat(summary, "output_token_throughput", "avg"))


# ---- runs ------------------------------------------------------------------------------------------------------

def tokenizer_dir(args: argparse.Namespace) -> Path:
    return args.state_dir / "models" / args.model


def run_client(name: str, cmd: list[str], version: str, timeout_s: float, out: Path,
               read: Callable[[], Figures], metrics_url: str) -> Outcome:
    """Runs one client bounded by timeout_s and reads its export; a timeout, an exit status or an unreadable
    export is the outcome's problem (the figures read, if any, are kept). The gateway's /metrics, scraped before
    and after, give the server's own view of the run."""
    print(f"[{name}] {' '.join(cmd)}", flush=True)
    before = _scrape_or_none(metrics_url)
    ran = run_bounded(cmd, timeout_s, out / f"{name}.log", cwd=out)
    after = _scrape_or_none(metrics_url)
    server = server_view(before, after) if before is not None and after is not None else None
    problem = (f"timed out after {timeout_s:.0f} s" if ran.timed_out
               else f"exited with {ran.returncode}" if ran.returncode else "")
    try:
        figures = read()
    except (OSError, KeyError, IndexError, TypeError, ValueError) as exc:
        figures = None
        problem = problem or f"no figures: {type(exc).__name__}: {exc}"
    print(f"[{name}] {'FAILED: ' + problem if problem else 'done'} in {ran.wall_s:.0f} s "
          f"(log: {out / f'{name}.log'})", flush=True)
    return Outcome(name, version, cmd, ran, figures, problem, server)


def _scrape_or_none(url: str) -> str | None:
    """The gateway's /metrics, or None (the server's view is an extra: a run is not failed for lacking it)."""
    try:
        return scrape(url)
    except OSError as exc:
        print(f"(no server view: {url}: {exc})", flush=True)
        return None


def run_all(args: argparse.Namespace) -> list[Outcome]:
    timeout_s = args.duration_s + args.margin_s
    outcomes = []
    for name in args.only or CLIENTS:
        if name == "guidellm":
            venv = args.state_dir / "guidellm-venv"
            exe = venv_tool(venv, GUIDELLM_SPEC, "guidellm")
            report = args.out / "guidellm.json"
            report.unlink(missing_ok=True)  # a run that writes nothing must not be read from an earlier one
            outcomes.append(run_client(name, guidellm_command(exe, args, report), installed_version(venv, "guidellm"),
                                       timeout_s, args.out, lambda report=report: read_guidellm(report),
                                       f"{args.gateway}/metrics"))
        else:
            venv = args.state_dir / "aiperf-venv"
            exe = venv_tool(venv, AIPERF_SPEC, "aiperf")
            out_dir = args.out / name
            shutil.rmtree(out_dir, ignore_errors=True)
            cmd = aiperf_command(exe, args, out_dir, per_chunk=name == "aiperf-per-chunk")
            outcomes.append(run_client(name, cmd, installed_version(venv, "aiperf"), timeout_s + AIPERF_GRACE_S,
                                       args.out, lambda out_dir=out_dir: read_aiperf(out_dir),
                                       f"{args.gateway}/metrics"))
    return outcomes


def report(outcomes: list[Outcome], args: argparse.Namespace) -> str:
    def ms(value: float) -> str:
        return "-" if math.isnan(value) else f"{value:.1f}"

    rows = []
    for o in outcomes:
        f = o.figures or Figures()
        v = o.server or ServerView()
        late = "-" if math.isnan(v.loop_late_share) else f"{100 * v.loop_late_share:.1f}"
        rows.append([f"{o.client} {o.version}", f.completed, f.errored, "-" if f.incomplete is None else f.incomplete,
                     ms(f.ttft_p50_ms), ms(f.ttft_p90_ms), ms(v.ttft_p50_ms), ms(v.ttft_p90_ms), late,
                     ms(f.itl_p50_ms), ms(f.output_tokens_per_s), f"{o.ran.wall_s:.0f}", o.problem or "ok"])
    head = (f"{args.model} at {args.gateway}: constant {args.rate} req/s for {args.duration_s} s, streaming, "
            f"{args.prompt_tokens} prompt / {args.output_tokens} output tokens")
    headers = ["client", "completed", "errored", "incomplete", "TTFT p50 ms", "TTFT p90 ms", "server TTFT p50 ms",
               "server TTFT p90 ms", "gateway loop late %", "ITL p50 ms", "output tok/s", "wall s", "status"]
    return head + "\n" + table(headers, rows)


def write_summary(outcomes: list[Outcome], args: argparse.Namespace) -> Path:
    """summary.json: the arguments and every run (command, version, exit, figures); a figure not measured is null
    (strict JSON has no NaN)."""
    def strict(value):
        if isinstance(value, float) and math.isnan(value):
            return None
        if isinstance(value, dict):
            return {k: strict(v) for k, v in value.items()}
        return [strict(v) for v in value] if isinstance(value, list) else value

    runs = [asdict(o) | {"failed": o.failed} for o in outcomes]
    path = args.out / "summary.json"
    path.write_text(json.dumps(strict({"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs}),
                               indent=2) + "\n")
    return path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gateway", default="http://127.0.0.1:8000", help="the gateway's URL")
    ap.add_argument("--state-dir", type=Path, default=Path(".janus"),
                    help="janus up's state folder: the model's tokenizer (models/MODEL) and the clients' venvs")
    ap.add_argument("--model", default="demo-tiny")
    ap.add_argument("--duration-s", type=int, default=30, help="each client run")
    ap.add_argument("--rate", type=float, default=2.0, help="requests per second, constant")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--margin-s", type=int, default=120,
                    help="time a run may take past its duration (start-up, answers in flight) before it is killed")
    ap.add_argument("--out", type=Path, default=Path("artifacts/clients"), help="exports, logs and summary.json")
    ap.add_argument("--only", choices=CLIENTS, action="append", help="run only this client (repeatable)")
    args = ap.parse_args(argv)
    args.gateway = args.gateway.rstrip("/")
    args.state_dir, args.out = args.state_dir.resolve(), args.out.resolve()  # the clients run from --out
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    outcomes = run_all(args)
    print("\n" + report(outcomes, args))
    print(f"summary: {write_summary(outcomes, args)}")
    return 1 if any(o.failed for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())

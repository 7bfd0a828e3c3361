"""The live oracle's prediction error, from its own /metrics, while a public trace is replayed against `make up`:
before its first online refit (the GPs fitted on the profiles alone) and after it (profiles plus telemetry).

    make up                                    # another terminal: the demo cluster, GPs from its profiles
    .venv/bin/python bench/oracle_live.py --duration-s 600 --out artifacts/oracle-live

It runs `janus replay` (open loop, streaming, the trace's own arrival times) for `--duration-s` and, every
`--poll-s`, scrapes the oracle's /metrics (the URL from its health reply on the bus):
per model the rolling mean absolute error of predicted vs measured attainment, the same over the windows the
answering fit predicted (`..._current_fit`), the bias, the windows scored and the refits. It writes every sample to
`samples.csv`, the figure to `error.png`, and prints per model the error just before the first refit after the start
(the profiles' fit) and at the end (the refitted GP's windows only). docs/oracle.md, "The oracle reports itself",
says what the series mean; docs/bench/oracle.md has the figures.
"""
from __future__ import annotations

import argparse
import asyncio
import csv
import re
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import table  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
JANUS = [str(Path(sys.executable).parent / "janus")]  # the console script of this virtualenv
SERIES = {  # what is kept per model from one scrape
    "janus_oracle_attainment_abs_error": "abs_error",
    "janus_oracle_attainment_abs_error_current_fit": "abs_error_current_fit",
    "janus_oracle_attainment_bias": "bias",
    "janus_oracle_attainment_error_windows": "windows",
}
LINE = re.compile(r'^(\w+)\{([^}]*)\}\s+([-+0-9.eEinfa]+)$')


def parse_metrics(text: str) -> dict[str, dict[str, float]]:
    """Per model: the SERIES above, and `refits` (elasticity refits so far) and `scored` (windows scored)."""
    out: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        match = LINE.match(line.strip())
        if not match:
            continue
        name, labels_text, value = match.groups()
        labels = dict(re.findall(r'(\w+)="([^"]*)"', labels_text))
        model = labels.get("model")
        if model is None:
            continue
        row = out.setdefault(model, {})
        if name in SERIES:
            row[SERIES[name]] = float(value)
        elif name == "janus_oracle_refits_total" and labels.get("kind") == "elasticity":
            row["refits"] = float(value)
        elif name == "janus_oracle_windows_scored_total":
            row["scored"] = row.get("scored", 0.0) + float(value)
    return out


def oracle_metrics_url(state_dir: str, instance: str = "oracle-0") -> str:
    """The oracle's /metrics URL, from its health reply on the bus (as `janus up` asks each service when it starts)."""
    from contracts import HealthReply, subjects
    from runtime.tools import connect_tool, nats_target, settings_for

    async def ask() -> HealthReply:
        bus = await connect_tool("oracle_live", nats_target(settings_for(state_dir), None))
        try:
            return await bus.request(subjects.health("oracle", instance), None, HealthReply, timeout_s=5.0)
        finally:
            await bus.close()

    url = asyncio.run(ask()).detail.get("metrics")
    if not url:
        raise SystemExit(f"oracle_live: {instance} reports no metrics URL in its health detail")
    return url


@dataclass
class ModelTrack:
    """One model's scrapes: (t_s, row) in order; where its first refit after the start fell."""

    samples: list[tuple[float, dict[str, float]]] = field(default_factory=list)

    def first_refit_index(self) -> int | None:
        if not self.samples:
            return None
        start = self.samples[0][1].get("refits", 0.0)
        for index, (_, row) in enumerate(self.samples):
            if row.get("refits", 0.0) > start:
                return index
        return None


def summarise(tracks: dict[str, ModelTrack]) -> list[list[object]]:
    rows = []
    for model, track in sorted(tracks.items()):
        refit = track.first_refit_index()
        last = track.samples[-1][1]
        if refit is None:
            rows.append([model, last.get("abs_error", float("nan")), int(last.get("windows", 0)), "no refit", "-", "-"])
            continue
        before = track.samples[max(refit - 1, 0)][1]
        rows.append([model, before.get("abs_error", float("nan")), int(before.get("windows", 0)),
                     f"{track.samples[refit][0]:.0f} s", last.get("abs_error_current_fit", float("nan")),
                     last.get("bias", float("nan"))])
    return rows


def plot(tracks: dict[str, ModelTrack], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    for model, track in sorted(tracks.items()):
        times = [t for t, _ in track.samples]
        line, = ax.plot(times, [row.get("abs_error", float("nan")) for _, row in track.samples], label=model)
        refit = track.first_refit_index()
        if refit is not None:
            ax.axvline(track.samples[refit][0], color=line.get_color(), linestyle=":", linewidth=1)
    ax.set_xlabel("seconds into the replay")
    ax.set_ylabel("rolling |predicted - measured| attainment")
    ax.set_title("live oracle error (dotted: first online refit)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state-dir", default=".janus")
    ap.add_argument("--gateway", default="http://127.0.0.1:8000")
    ap.add_argument("--metrics-url", help="the oracle's /metrics (default: from its health reply)")
    ap.add_argument("--duration-s", type=float, default=600.0)
    ap.add_argument("--poll-s", type=float, default=10.0)
    ap.add_argument("--replay-args", default="--trace arena --compression 10 --max-requests 100000 "
                                             "--max-input-tokens 256 --max-output-tokens 64",
                    help="arguments of `janus replay` (the trace and how it is scaled)")
    ap.add_argument("--out", type=Path, default=Path("artifacts/oracle-live"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    url = args.metrics_url or oracle_metrics_url(args.state_dir)
    print(f"oracle_live: scraping {url} every {args.poll_s:g} s for {args.duration_s:g} s", flush=True)
    replay = subprocess.Popen([*JANUS, "replay", "--gateway", args.gateway, *args.replay_args.split(),
                               "--out", str(args.out / "replay")], cwd=REPO, stdout=open(args.out / "replay.log", "w"),
                              stderr=subprocess.STDOUT)
    tracks: dict[str, ModelTrack] = {}
    started = time.monotonic()
    try:
        while (now_s := time.monotonic() - started) < args.duration_s and replay.poll() is None:
            try:
                with urllib.request.urlopen(url, timeout=5) as reply:
                    scraped = parse_metrics(reply.read().decode())
            except OSError as exc:
                print(f"oracle_live: {now_s:.0f} s: /metrics did not answer ({exc})", flush=True)
                scraped = {}
            for model, row in scraped.items():
                tracks.setdefault(model, ModelTrack()).samples.append((now_s, row))
            time.sleep(args.poll_s)
    finally:
        if replay.poll() is None:
            replay.terminate()
        replay.wait(timeout=60)
    with open(args.out / "samples.csv", "w", newline="") as fh:
        writer = csv.writer(fh)
        columns = (*SERIES.values(), "refits", "scored")
        writer.writerow(["t_s", "model", *columns])
        for model, track in sorted(tracks.items()):
            for t_s, row in track.samples:
                writer.writerow([f"{t_s:.1f}", model, *(row.get(k, "") for k in columns)])
    if not tracks:
        print("oracle_live: no model series scraped", flush=True)
        return 1
    plot(tracks, args.out / "error.png")
    print(table(["model", "error before 1st refit", "windows", "1st refit at", "error after (refitted fit)",
                 "bias after"], summarise(tracks)))
    print(f"wrote {args.out / 'samples.csv'}, {args.out / 'error.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The headline table, the ablation table and the figure (load, goodput, active devices, attainment over time;
one line per system), from `runner.SystemResult`s."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np

from .metrics import worst_apps
from .runner import SystemResult

ABLATION = ("janus", "elastic-only", "steady-only")


def headline_rows(results: list[SystemResult], baseline: str = "static") -> list[dict]:
    base = next((r for r in results if r.system == baseline), None)
    rows = []
    for r in results:
        s = r.summary
        rows.append({
            "system": r.system,
            "token_attainment": s.token_attainment,
            "ttft_attainment": s.ttft_attainment,
            "tpot_attainment": s.tpot_attainment,
            "goodput_tps": s.goodput_tps,
            "device_hours": s.device_hours,
            "device_hours_vs_static": (s.device_hours / base.summary.device_hours
                                       if base is not None and base.summary.device_hours > 0 else float("nan")),
            "mean_active_devices": s.mean_active_devices,
            "worst_app": s.worst_app,
            "worst_app_attainment": s.worst_app_token_attainment,
            "num_failed": s.num_failed,
            "wall_s": r.wall_s,
            "cpu_s": r.cpu_s,
            "worst_apps": [asdict(a) for a in worst_apps(r.apps)],
            "device_hours_by_kind": [asdict(k) for k in r.kinds],
        })
    return rows


def print_tables(results: list[SystemResult], console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title="token-level SLO attainment and device-hours (same trace, same fleet)")
    for col in ("system", "token att.", "TTFT att.", "TPOT att.", "goodput tok/s", "device-h", "vs static",
                "mean devices", "worst app (att.)", "failed", "sim wall s"):
        table.add_column(col, justify="right" if col not in ("system", "worst app (att.)") else "left")
    for row in headline_rows(results):
        table.add_row(row["system"], f"{row['token_attainment']:.4f}", f"{row['ttft_attainment']:.4f}",
                      f"{row['tpot_attainment']:.4f}", f"{row['goodput_tps']:,.0f}", f"{row['device_hours']:.1f}",
                      f"{row['device_hours_vs_static']:.2f}", f"{row['mean_active_devices']:.0f}",
                      f"{row['worst_app']} ({row['worst_app_attainment']:.3f})", str(row["num_failed"]),
                      f"{row['wall_s']:.0f}")
    console.print(table)
    present = [r for r in results if r.system in ABLATION]
    if len(present) > 1:
        ab = Table(title="ablation (paper: both pools 97.8 %, elastic only 59.0 %, steady only 37.1 %)")
        for col in ("pools", "token att.", "device-h"):
            ab.add_column(col)
        names = {"janus": "both", "elastic-only": "elastic only", "steady-only": "steady only"}
        for r in sorted(present, key=lambda r: ABLATION.index(r.system)):
            ab.add_row(names[r.system], f"{100 * r.summary.token_attainment:.1f} %", f"{r.summary.device_hours:.1f}")
        console.print(ab)
    if any(r.kinds for r in results):
        console.print(kinds_table([(r.system, r.kinds) for r in results]))
    focus = next((r for r in results if r.system == "janus"), results[0] if results else None)
    if focus is not None and focus.apps:
        console.print(worst_apps_table(focus))


def device_hours_by(kinds, key=lambda k: (k.model, k.role)) -> dict[tuple, float]:
    """Device-hours summed per `key` of each KindHours (by default model and role: apps and pools summed)."""
    out: dict[tuple, float] = {}
    for k in kinds:
        out[key(k)] = out.get(key(k), 0.0) + k.device_hours
    return out


def kinds_table(columns: list[tuple[str, list]], min_share: float = 0.01, is_diffed: bool = False):
    """Where each column's device-hours went (columns: (name, KindHours list), a system each), by model and role:
    the rows any column spent at least `min_share` of the largest column's device-hours on, the largest first, the
    rest as one row. `is_diffed`: a last column, the last column's hours less the first's."""
    from rich.table import Table

    hours = [device_hours_by(kinds) for _, kinds in columns]
    keys = sorted({k for h in hours for k in h}, key=lambda k: (-max(h.get(k, 0.0) for h in hours), k))
    floor = min_share * max((sum(h.values()) for h in hours), default=0.0)
    shown = [k for k in keys if max(h.get(k, 0.0) for h in hours) >= floor]
    is_diffed = is_diffed and len(columns) > 1
    digits = 1 if floor >= 0.1 else 3  # a short run's hundredths of a device-hour still tell the kinds apart
    table = Table(title="where the device-hours went, by model and role")
    table.add_column("model")
    table.add_column("role")
    for name, _ in columns:
        table.add_column(name, justify="right")
    if is_diffed:
        table.add_column("last - first", justify="right")

    def row(label: tuple, values: list[float]) -> None:
        diff = [f"{values[-1] - values[0]:+.{digits}f}"] if is_diffed else []
        table.add_row(*label, *(f"{v:.{digits}f}" for v in values), *diff)

    for k in shown:
        row(tuple(part or "-" for part in k), [h.get(k, 0.0) for h in hours])
    rest = [sum(v for k, v in h.items() if k not in shown) for h in hours]
    if any(rest):
        row(("others", ""), rest)
    row(("total", ""), [sum(h.values()) for h in hours])
    return table


def compare_runs(out_dirs: list[Path], console, num_rows: int = 10) -> None:
    """`janus sim --compare DIR...`: the headline figures of the runs written under `out_dirs` (each a `janus sim
    --out` folder), one column per system of each, then where their device-hours went by model and role, then the
    `num_rows` (app, role) rows whose device-hours differ most between the first column and the last."""
    from rich.table import Table

    from .metrics import KindHours

    columns, rows, codes = [], [], []
    for out_dir in out_dirs:
        path = Path(out_dir) / "summary.json"
        if not path.is_file():
            raise ValueError(f"no summary.json in {out_dir} (a folder `janus sim --out` wrote)")
        summary = json.loads(path.read_text())
        codes.append((Path(out_dir).name, summary.get("meta", {}).get("code")))
        for row in summary["systems"]:
            if "device_hours_by_kind" not in row:
                raise ValueError(f"{path}: {row['system']} has no device_hours_by_kind (written before runs took "
                                 "their device-hours apart; run it again)")
            columns.append((f"{Path(out_dir).name}:{row['system']}",
                            [KindHours(**k) for k in row["device_hours_by_kind"]]))
            rows.append(row)
    head = Table(title="the runs compared")
    for col in ("run:system", "token att.", "device-h", "worst app (att.)", "failed"):
        head.add_column(col, justify="left" if col in ("run:system", "worst app (att.)") else "right")
    for (name, _), row in zip(columns, rows):
        head.add_row(name, f"{row['token_attainment']:.4f}", f"{row['device_hours']:.1f}",
                     f"{row['worst_app']} ({row['worst_app_attainment']:.3f})", f"{row['num_failed']:,}")
    console.print(head)
    print_code_differences(codes, console)
    console.print(kinds_table(columns, is_diffed=True))
    if len(columns) > 1:
        by_app = [device_hours_by(kinds, lambda k: (k.app, k.model, k.role)) for _, kinds in columns]
        moved = sorted({k for h in by_app for k in h},
                       key=lambda k: (-abs(by_app[-1].get(k, 0.0) - by_app[0].get(k, 0.0)), k))[:num_rows]
        apps = Table(title=f"the {num_rows} (app, role) rows that moved most, first column to last")
        for col in ("app", "model", "role", columns[0][0], columns[-1][0], "last - first"):
            apps.add_column(col, justify="left" if col in ("app", "model", "role") else "right")
        for k in moved:
            first, last = by_app[0].get(k, 0.0), by_app[-1].get(k, 0.0)
            apps.add_row(k[0] or "-", k[1] or "-", k[2], f"{first:.1f}", f"{last:.1f}", f"{last - first:+.1f}")
        console.print(apps)


def print_code_differences(codes: list[tuple[str, dict | None]], console) -> None:
    """A line per run when the runs compared may not have run the same code (sim/provenance.py): a difference
    between them may then be the code's, not the policy's or the seed's."""
    from .provenance import describe, is_same_code

    known = [c for _, c in codes if c is not None]
    if len(codes) < 2 or (len(known) == len(codes) and all(is_same_code(known[0], c) for c in known[1:])):
        return
    console.print("[yellow]these runs may not have run the same code:[/]", highlight=False)
    for name, code in codes:
        console.print(f"  {name}: {describe(code) if code is not None else 'not recorded (an older run)'}",
                      highlight=False)


def worst_apps_table(result: SystemResult, count: int = 8):
    """The apps that lost the most, with their failed requests by error code (no_instance: the model had no ready
    instance; overloaded: none could finish the prefill by the deadline) and when those came: where to look next."""
    from rich.table import Table

    shown = worst_apps(result.apps, count)
    codes = sorted({code for a in shown for code in a.rejected})
    table = Table(title=f"worst apps of {result.system}: failed requests by error code")
    for col in ("app", "model", "requests", "token att.", *codes, "failures from-to s"):
        table.add_column(col, justify="left" if col in ("app", "model") else "right")
    for a in shown:
        span = (f"{a.first_rejection_s:.0f}-{a.last_rejection_s:.0f}" if np.isfinite(a.first_rejection_s)
                else "-")
        table.add_row(a.name, a.model, f"{a.num_requests:,}", f"{a.token_attainment:.3f}",
                      *(f"{a.rejected.get(code, 0):,}" for code in codes), span)
    return table


def write_outputs(results: list[SystemResult], out_dir: Path, meta: dict | None = None) -> list[Path]:
    """summary.json and figure.png (plus ablation.png when the ablation systems ran)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = headline_rows(results)
    for row, result in zip(rows, results):  # lifecycle paths taken, the oracle's refits and their wall time, ...
        row["counters"] = dict(result.counters)
    (out_dir / "summary.json").write_text(json.dumps({"meta": meta or {}, "systems": rows}, indent=2,
                                                     default=float))
    paths = [out_dir / "summary.json", plot_timeseries(results, out_dir / "figure.png")]
    return paths


def plot_timeseries(results: list[SystemResult], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(4, 1, figsize=(11, 11), sharex=True)
    first = results[0].series
    axes[0].plot(first.bin_start_s / 60, first.load_rps, color="black", lw=1)
    axes[0].set_ylabel("load (req/s)")
    for r in results:
        s = r.series
        axes[1].plot(s.bin_start_s / 60, s.goodput_tps, lw=1, label=r.system)
        axes[2].plot(s.bin_start_s / 60, s.active_devices, lw=1, label=r.system)
        axes[3].plot(s.bin_start_s / 60, s.token_attainment, lw=1, label=r.system)
    axes[1].set_ylabel("goodput (on-time tok/s)")
    axes[2].set_ylabel("active devices")
    axes[3].set_ylabel("token attainment")
    axes[3].set_ylim(max(0.0, np.nanmin([np.nanmin(r.series.token_attainment) for r in results]) - 0.02), 1.005)
    axes[3].set_xlabel("time (min, compressed)")
    axes[1].legend(loc="upper right", fontsize=8, ncol=3)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

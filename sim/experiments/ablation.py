"""The paper's five-app dual-pool ablation (issue 24): both pools vs the elastic pool alone vs the steady pool alone
(plus the static partition for reference), on a fixed device budget, with a load shock on one app; and the budget
sweep at fixed devices.

Nothing here is policy: the systems are `runner._systems` with the live defaults. This module builds a synthetic
workload (five apps, Poisson arrivals, one app's rate multiplied at a known time), runs the systems on it and
measures what the paper reports: token attainment, the worst app, and the recovery time after the shock.

Recovery time (docs/sim.md, "Ablation"): bin the shocked app's requests by arrival into 1 s bins and take each
bin's token attainment (on-time tokens / output tokens of the requests that arrived in it). The recovery time is
t_r - t_shock, where t_r is the start of the first bin at or after the shock from which `hold_s` (5 s) of
consecutive bins all reach `threshold` (0.9). 0 when the app never dips; infinite when it never recovers within
the trace."""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..runner import ScenarioSpec, SystemResult, run_many
from ..trace import Trace

# (app name, model, base rate in requests per second). A hot app on a 14B model and a long tail of four small
# models at low, steady rates: what the steady pool packs onto shared devices.
FIVE_APPS: tuple[tuple[str, str, float], ...] = (
    ("hot-14b", "qwen2.5-14b", 20.0),
    ("tail-8b", "llama-3-8b", 1.0),
    ("tail-7b", "qwen2-7b", 1.0),
    ("tail-1.5b", "qwen2-1.5b", 1.0),
    ("tail-0.5b", "qwen2-0.5b", 1.0),
)
ABLATION_SYSTEMS = ("janus", "elastic-only", "steady-only", "static")
RECOVERY_THRESHOLD = 0.9
RECOVERY_HOLD_S = 5.0
# Lengths: log-normal, medians 512 prompt / 96 output tokens (the ServeGen headline's means are 773 / 120)
INPUT_MEDIAN, OUTPUT_MEDIAN, LENGTH_SIGMA = 512, 96, 0.8


def ablation_trace(apps: tuple[tuple[str, str, float], ...] = FIVE_APPS, duration_s: float = 180.0,
                   shock_app: int = 1, shock_at_s: float = 60.0, shock_factor: float = 20.0,
                   seed: int = 0, input_median: int = INPUT_MEDIAN, output_median: int = OUTPUT_MEDIAN) -> Trace:
    """Poisson arrivals per app at its base rate; from `shock_at_s` on, app `shock_app`'s rate is `shock_factor`
    times its base; log-normal lengths around the medians. Seeded, deterministic."""
    if not 0 <= shock_app < len(apps):
        raise ValueError(f"shock_app {shock_app} is not one of the {len(apps)} apps")
    if not 0 < shock_at_s < duration_s:
        raise ValueError("the shock must fall inside the trace")
    rng = np.random.default_rng(seed)
    arrivals, ids = [], []
    for a, (_, _, rate) in enumerate(apps):
        pieces = [(0.0, shock_at_s, rate), (shock_at_s, duration_s, rate * (shock_factor if a == shock_app else 1.0))]
        for start, end, r in pieces:
            k = int(rng.poisson(r * (end - start)))
            arrivals.append(np.sort(rng.uniform(start, end, k)))
            ids.append(np.full(k, a))
    arrival = np.concatenate(arrivals)
    app_ids = np.concatenate(ids)
    n = len(arrival)
    inputs = np.clip(rng.lognormal(np.log(input_median), LENGTH_SIGMA, n), 8, 4096).astype(np.int64)
    outputs = np.clip(rng.lognormal(np.log(output_median), LENGTH_SIGMA, n), 1, 1024).astype(np.int64)
    # Trace.build shifts the first arrival to 0; keep the absolute clock (the shock at shock_at_s) by a marker
    order = np.argsort(arrival, kind="stable")
    arrival, app_ids, inputs, outputs = arrival[order], app_ids[order], inputs[order], outputs[order]
    meta = {"shock_app": shock_app, "shock_at_s": shock_at_s - float(arrival[0]) if n else shock_at_s,
            "shock_factor": shock_factor, "models": [m for _, m, _ in apps]}
    return Trace.build(arrival, app_ids, inputs, outputs, [name for name, _, _ in apps], source="ablation",
                       meta=meta)


def tiers_for(trace: Trace, models: list[str]) -> tuple[tuple[float, tuple[str, ...]], ...]:
    """`build_scenario` tiers that give app a the model `models[a]`: one tier per traffic rank."""
    order = np.argsort(-trace.requests_per_app(), kind="stable")
    n = len(order)
    return tuple(((rank + 1) / n, (models[int(app)],)) for rank, app in enumerate(order))


@dataclass(frozen=True)
class AblationSpec(ScenarioSpec):
    """The five-app scenario: `ScenarioSpec` with the synthetic trace (ScenarioSpec's servegen fields unused)."""

    trace: str = "ablation"
    apps: tuple[tuple[str, str, float], ...] = FIVE_APPS
    duration_s: float = 180.0
    shock_app: int = 1
    shock_at_s: float = 60.0
    shock_factor: float = 20.0
    num_devices: int = 0  # 0: the static partition's size (static_partition_devices)

    def build_trace(self) -> Trace:
        return ablation_trace(self.apps, self.duration_s, self.shock_app, self.shock_at_s, self.shock_factor,
                              self.seed)

    def build(self):
        from ..device_effects import DeviceEffects
        from ..scenario import build_scenario

        trace = self.build_trace()
        effects = DeviceEffects(seed=self.seed) if self.device_effects == "on" else DeviceEffects.off()
        scenario = build_scenario(trace, device_name=self.device, num_devices=max(1, self.num_devices),
                                  seed=self.seed, tiers=tiers_for(trace, [m for _, m, _ in self.apps]),
                                  effects=effects)
        if self.num_devices <= 0:
            scenario.num_devices = static_partition_devices(scenario)
        return scenario

    def resolved(self) -> "AblationSpec":
        """This spec with its budget made explicit (the static partition's size when it was 0)."""
        return self if self.num_devices > 0 else dataclasses.replace(self, num_devices=self.build().num_devices)


def static_partition_devices(scenario) -> int:
    """Devices the static partition reserves when unconstrained: each app's replicas at its 90th-percentile 30 s
    window at 0.7 utilisation (`systems.static.demand_replicas`), times its tensor-parallel degree."""
    from ..systems.static import demand_replicas

    return int(sum(demand_replicas(scenario, a) * spec.tp for a, spec in enumerate(scenario.apps)))


# ------------------------------------------------------------------------------------------------ measures
def app_attainment_series(trace: Trace, outcomes, app: int, bin_s: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(bin starts, token attainment per bin) of one app's requests binned by arrival (NaN: no request)."""
    num_bins = max(1, int(math.ceil(max(trace.duration_s, bin_s) / bin_s)))
    sel = trace.app_ids == app
    bins = np.minimum((trace.arrival_s[sel] / bin_s).astype(np.int64), num_bins - 1)
    total = np.bincount(bins, weights=trace.output_tokens[sel].astype(float), minlength=num_bins)
    good = np.bincount(bins, weights=outcomes.num_on_time_tokens[sel].astype(float), minlength=num_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.arange(num_bins) * bin_s, np.where(total > 0, good / total, np.nan)


def recovery_time_s(bin_start_s, attainment, shock_at_s: float, threshold: float = RECOVERY_THRESHOLD,
                    hold_s: float = RECOVERY_HOLD_S) -> float:
    """t_r - shock_at_s, where t_r is the start of the first bin at or after the shock from which `hold_s` of
    consecutive bins all have attainment >= `threshold`; 0 when the app never dips, inf when it never recovers. A
    bin without requests (NaN) neither starts nor breaks a run (the hold is measured in time)."""
    start = np.asarray(bin_start_s, dtype=float)
    att = np.asarray(attainment, dtype=float)
    bin_s = float(start[1] - start[0]) if len(start) > 1 else 1.0
    first = int(np.searchsorted(start, shock_at_s - 1e-9))
    need = max(1, int(round(hold_s / bin_s)))
    run_from = None
    for i in range(first, len(att)):
        if np.isnan(att[i]):
            continue
        if att[i] >= threshold:
            run_from = i if run_from is None else run_from
            if i - run_from + 1 >= need:  # bins from run_from to i, NaN ones included
                return max(0.0, float(start[run_from] - shock_at_s))
        else:
            run_from = None
    return math.inf


def shock_extra(scenario, result) -> dict:
    """`run_one`'s extra hook: the shocked app's and all apps' token attainment per second."""
    trace = scenario.trace
    app = int(trace.meta["shock_app"])
    t, shocked = app_attainment_series(trace, result.outcomes, app)
    from ..metrics import time_series

    overall = time_series(trace, result.outcomes, 1.0).token_attainment
    return {"bin_start_s": t.tolist(), "shocked": shocked.tolist(), "overall": overall.tolist(),
            "shock_at_s": float(trace.meta["shock_at_s"]), "shock_app": trace.app_names[app]}


@dataclass(frozen=True)
class AblationRow:
    system: str
    token_attainment: float
    worst_app: str
    worst_app_attainment: float
    shocked_app_attainment: float
    recovery_s: float
    device_hours: float
    mean_active_devices: float
    cpu_s: float


def ablation_rows(results: list[SystemResult], hold_s: float = RECOVERY_HOLD_S,
                  threshold: float = RECOVERY_THRESHOLD) -> list[AblationRow]:
    rows = []
    for r in results:
        x = r.extra
        shocked = next(i for i, a in enumerate(r.apps) if a.name == x["shock_app"])
        rows.append(AblationRow(
            r.system, r.summary.token_attainment, r.summary.worst_app, r.summary.worst_app_token_attainment,
            float(r.per_app_attainment[shocked]),
            recovery_time_s(x["bin_start_s"], x["shocked"], x["shock_at_s"], threshold, hold_s),
            r.summary.device_hours, r.summary.mean_active_devices, r.cpu_s))
    return rows


# ------------------------------------------------------------------------------------------------ outputs
PAPER = {"janus": "97.8 %", "elastic-only": "59.0 %", "steady-only": "37.1 %", "static": "—"}


def print_ablation(rows: list[AblationRow], spec: AblationSpec, console) -> None:
    from rich.table import Table

    name = spec.apps[spec.shock_app][0]
    table = Table(title=f"five-app ablation on {spec.num_devices} x {spec.device}: {name} x{spec.shock_factor:g} "
                        f"at {spec.shock_at_s:g} s (paper: 97.8 / 59.0 / 37.1 %, recovery ~9 s)")
    for col in ("system", "token att.", "paper", "worst app (att.)", f"{name} att.", "recovery s",
                "device-h", "mean devices", "CPU s"):
        table.add_column(col, justify="left" if col in ("system", "worst app (att.)") else "right")
    for r in rows:
        table.add_row(r.system, f"{r.token_attainment:.4f}", PAPER.get(r.system, ""),
                      f"{r.worst_app} ({r.worst_app_attainment:.3f})", f"{r.shocked_app_attainment:.3f}",
                      _fmt_s(r.recovery_s), f"{r.device_hours:.2f}", f"{r.mean_active_devices:.1f}",
                      f"{r.cpu_s:.0f}")
    console.print(table)


def _fmt_s(s: float) -> str:
    return "never" if math.isinf(s) else f"{s:.0f}"


def plot_shock(results: list[SystemResult], path: Path, before_s: float = 20.0, after_s: float = 60.0) -> Path:
    """Token attainment per second around the shock, one line per system: the shocked app, and all apps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
    for r in results:
        x = r.extra
        t = np.asarray(x["bin_start_s"]) - x["shock_at_s"]
        keep = (t >= -before_s) & (t <= after_s)
        axes[0].plot(t[keep], np.asarray(x["shocked"])[keep], label=r.system, lw=1.4)
        axes[1].plot(t[keep], np.asarray(x["overall"])[keep], label=r.system, lw=1.4)
    shock_app = results[0].extra["shock_app"]
    for ax, what in zip(axes, (f"{shock_app} (shocked)", "all five apps")):
        ax.axvline(0, color="k", ls=":", lw=1)
        ax.axhline(RECOVERY_THRESHOLD, color="grey", ls="--", lw=0.8)
        ax.set_ylim(-0.02, 1.02)
        ax.set_ylabel(f"token att. / s\n{what}")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower right", ncol=len(results))
    axes[1].set_xlabel("seconds from the shock (requests binned by arrival, 1 s)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_ablation(spec: AblationSpec, systems=ABLATION_SYSTEMS, processes: int = 2):
    """(resolved spec, results, rows). A system that failed raises."""
    from ..runner import RunFailure

    spec = spec.resolved()
    results = run_many(spec, list(systems), processes=processes, extra=shock_extra)
    failed = [r for r in results if isinstance(r, RunFailure)]
    if failed:
        raise RuntimeError("\n".join(f"{f.system}: {f.error}" for f in failed))
    return spec, results, ablation_rows(results)


# ------------------------------------------------------------------------------------------------ budget sweep
def budget_sweep(spec: ScenarioSpec, budgets: list[int], systems=ABLATION_SYSTEMS, processes: int = 2,
                 say=None) -> dict[int, list]:
    """Every system at every budget (`spec.num_devices` replaced), on the same trace. A system that cannot run at a
    budget (the static partition below one replica per app) comes back as its RunFailure."""
    out = {}
    for n in budgets:
        out[n] = run_many(dataclasses.replace(spec, num_devices=n), list(systems), processes=processes)
        if say is not None:
            say(f"{n} devices: " + ", ".join(f"{r.system} {_att(r)}" for r in out[n]))
    return out


def _att(result) -> str:
    return f"{result.summary.token_attainment:.4f}" if isinstance(result, SystemResult) else "failed"


def sweep_table(sweep: dict[int, list]) -> list[dict]:
    rows = []
    for n, results in sorted(sweep.items()):
        row = {"devices": n}
        for r in results:
            if not isinstance(r, SystemResult):
                row[r.system] = {"error": r.error.strip().splitlines()[-1]}
                continue
            s = r.summary
            row[r.system] = {"token_attainment": s.token_attainment, "worst_app": s.worst_app,
                             "worst_app_attainment": s.worst_app_token_attainment, "device_hours": s.device_hours,
                             "cpu_s": r.cpu_s}
        both, elastic = row.get("janus", {}), row.get("elastic-only", {})
        if "token_attainment" in both and "token_attainment" in elastic:
            row["janus_minus_elastic_only"] = both["token_attainment"] - elastic["token_attainment"]
        rows.append(row)
    return rows


def widest_margin(rows: list[dict]) -> dict | None:
    """The row where both pools beat the elastic pool alone by the most token attainment."""
    rows = [r for r in rows if "janus_minus_elastic_only" in r]
    return max(rows, key=lambda r: r["janus_minus_elastic_only"]) if rows else None


def plot_sweep(rows: list[dict], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = [k for k in rows[0] if isinstance(rows[0][k], dict)]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for s in systems:
        ran = [r for r in rows if "token_attainment" in r[s]]
        ax.plot([r["devices"] for r in ran], [r[s]["token_attainment"] for r in ran], marker="o", label=s)
    ax.set_xlabel("devices (fixed budget)")
    ax.set_ylabel("token attainment")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def print_sweep(rows: list[dict], console, title: str) -> None:
    from rich.table import Table

    systems = [k for k in rows[0] if isinstance(rows[0][k], dict)]
    table = Table(title=title)
    table.add_column("devices", justify="right")
    for s in systems:
        table.add_column(f"{s} att. (worst app)", justify="right")
    table.add_column("janus - elastic-only", justify="right")
    for r in rows:
        cells = [f"{r[s]['token_attainment']:.4f} ({r[s]['worst_app_attainment']:.3f})"
                 if "token_attainment" in r[s] else "cannot run" for s in systems]
        margin = r.get("janus_minus_elastic_only")
        table.add_row(str(r["devices"]), *cells, f"{margin:+.4f}" if margin is not None else "")
    console.print(table)


# ------------------------------------------------------------------------------------------------ CLI
def main(args, console, policy: dict) -> int:
    """`janus sim --experiment ablation | budget-sweep` (arguments parsed by sim/cli.py)."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()] if args.systems else list(ABLATION_SYSTEMS)
    ablation = AblationSpec(num_devices=args.devices or 0, seed=args.seed, device=args.device, policy=policy,
                            device_effects=args.device_effects, shock_factor=args.shock_factor,
                            shock_at_s=args.shock_at_s, shock_app=args.shock_app,
                            duration_s=args.duration_s if args.duration_s else 180.0, oracle=args.oracle,
                            refit_wall_s=args.refit_wall_s)
    if args.experiment == "ablation":
        spec, results, rows = run_ablation(ablation, systems, args.processes)
        print_ablation(rows, spec, console)
        fig = plot_shock(results, Path(args.figure or out / "ablation-shock.png"))
        summary = {"spec": _spec_json(spec), "rows": [dataclasses.asdict(r) for r in rows],
                   "series": {r.system: r.extra for r in results},
                   "recovery": {"threshold": RECOVERY_THRESHOLD, "hold_s": RECOVERY_HOLD_S, "bin_s": 1.0}}
        (out / "ablation.json").write_text(json.dumps(summary, indent=1, default=_json_default))
        console.print(f"wrote {out / 'ablation.json'}, {fig}")
        return 0
    # budget-sweep
    if args.sweep_on == "ablation":
        base, title = ablation.resolved(), "five-app ablation scenario"
    else:
        base = ScenarioSpec(num_apps=args.apps, num_requests=args.requests,
                            duration_s=args.duration_s if args.duration_s else 1800.0, window_s=args.window_s,
                            device=args.device, mix=args.mix, seed=args.seed, policy=policy,
                            device_effects=args.device_effects, oracle=args.oracle,
                            refit_wall_s=args.refit_wall_s)
        title = (f"ServeGen, {args.apps} apps, {args.requests:,} requests over {base.duration_s:g} s"
                 + (f", first {args.window_s:g} s" if args.window_s else ""))
    budgets = [int(b) for b in args.budgets.split(",")]
    sweep = budget_sweep(base, budgets, systems, args.processes, say=console.print)
    rows = sweep_table(sweep)
    print_sweep(rows, console, f"token attainment against budget: {title}")
    best = widest_margin(rows)
    if best is not None:
        console.print(f"widest margin of both pools over elastic only: {best['janus_minus_elastic_only']:+.4f} "
                      f"at {best['devices']} devices")
    fig = plot_sweep(rows, Path(args.figure or out / "budget-sweep.png"), f"attainment against budget: {title}")
    (out / "budget-sweep.json").write_text(json.dumps({"spec": _spec_json(base), "rows": rows, "widest": best},
                                                      indent=1, default=_json_default))
    console.print(f"wrote {out / 'budget-sweep.json'}, {fig}")
    return 0


def _spec_json(spec) -> dict:
    d = dataclasses.asdict(spec)
    d.pop("policy", None)
    return d


def _json_default(x):
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    return str(x)

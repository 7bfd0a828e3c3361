"""`janus sim`: replay a trace open-loop against Janus and its baselines on the simulated fleet, print the headline
and ablation tables, write summary.json and the figure. `main` is the `janus sim` subcommand."""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from .provenance import code_provenance, describe
from .runner import DEFAULT_ORACLE, EXTRA_SYSTEM_NAMES, SYSTEM_NAMES, ScenarioSpec, run_many


def _seconds(text: str) -> float:
    """A duration in seconds, >= 0 (argparse names the option and the value otherwise)."""
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"a time is >= 0 s, not {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="janus sim", description=__doc__)
    p.add_argument("--trace", default="servegen", choices=["servegen", "azure", "mooncake", "arena"])
    p.add_argument("--apps", type=int, default=62, help="servegen: number of apps (clients)")
    p.add_argument("--requests", type=int, default=600_000, help="servegen: about this many requests")
    p.add_argument("--duration-s", type=float, default=1800.0, help="servegen: compressed length of the trace")
    p.add_argument("--compression", type=float, default=1.0, help="public traces: time compression factor")
    p.add_argument("--window-s", type=float, default=None, help="replay only the first WINDOW_S seconds")
    p.add_argument("--device", default="ascend-910c-die", choices=["ascend-910c-die", "nvidia-h200"])
    p.add_argument("--devices", type=int, default=None, help="fleet size (default 768; --experiment ablation: the "
                   "static partition's size)")
    p.add_argument("--mix", default="default", choices=["default", "light", "heavy", "full-range"],
                   help="which models the apps run (by traffic rank; see sim/scenario.py)")
    p.add_argument("--systems", default=",".join(SYSTEM_NAMES), help="comma-separated, from: " +
                   ", ".join(SYSTEM_NAMES + EXTRA_SYSTEM_NAMES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device-effects", choices=["off", "on"], default="off",
                   help="on: the simulated devices do what a roofline leaves out (interference, mixed steps, small "
                   "batches, jitter, fork sources: sim/device_effects.py); off: they run the roofline itself")
    p.add_argument("--oracle", choices=["learned", "clairvoyant", "roofline"], default=DEFAULT_ORACLE,
                   help="what the Janus systems (janus, its ablations) ask: GPs fitted on profiles of the simulated "
                   "device (the default, as a deployment learns; profiled once, cached under artifacts/sim-oracle), "
                   "the cost model's own roofline, or the untrained datasheet roofline (janus-learned, "
                   "janus-clairvoyant and janus-roofline keep theirs)")
    p.add_argument("--refit-wall-s", type=_seconds, default=None,
                   help="learned oracle: every online refit serves this many seconds after it starts (default: the "
                        "fit's measured wall time, as live; a number makes two runs of the same code the same run)")
    p.add_argument("--config", type=Path, default=None, help="cluster YAML: Janus runs with its planner and "
                   "dispatcher policies (default: the live defaults, as `janus config` prints them)")
    p.add_argument("--processes", type=int, default=2, help="systems simulated at once")
    p.add_argument("--bin-s", type=float, default=10.0, help="time bin of the plots")
    p.add_argument("--out", default="artifacts/sim", help="folder for summary.json and figure.png")
    p.add_argument("--watch", metavar="APP", help="headline: one app's plans, instances and requests, to "
                   "OUT/watch-APP-SYSTEM.json, and its bursts as a table (APP: its name or a prefix only it has; "
                   "sim/watch.py)")
    p.add_argument("--compare", nargs="+", type=Path, default=None, metavar="DIR",
                   help="simulate nothing: compare the runs written under these --out folders (headline figures, "
                   "where their device-hours went by model and role, the apps that moved most)")
    e = p.add_argument_group("experiments (issue 24, sim/experiments/ablation.py, docs/sim.md)")
    e.add_argument("--experiment", choices=["headline", "ablation", "budget-sweep"], default="headline",
                   help="ablation: five apps, a load shock, both pools vs one; budget-sweep: --budgets")
    e.add_argument("--shock-app", type=int, default=1, help="ablation: which of the five apps is shocked")
    e.add_argument("--shock-factor", type=float, default=20.0, help="ablation: its rate times this")
    e.add_argument("--shock-at-s", type=float, default=60.0, help="ablation: from this second on")
    e.add_argument("--budgets", default="40,72,98", help="budget-sweep: comma-separated device counts")
    e.add_argument("--sweep-on", choices=["headline", "ablation"], default="headline",
                   help="budget-sweep: the ServeGen trace of the other flags, or the five-app scenario")
    e.add_argument("--figure", default=None, help="experiments: where the plot goes (default: under --out)")
    return p


def run_policy(config: Path | None) -> dict:
    """The policies Janus runs with, in the shape `janus config` prints them: the cluster YAML's, or the defaults
    the live services run with (one source of defaults)."""
    from ops.effective import effective_policies, load_cluster
    from runtime.settings import ClusterConfig

    return effective_policies(load_cluster(config) if config else ClusterConfig())


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from .report import print_tables, write_outputs

    args = build_parser().parse_args(argv)
    if args.compare:
        from .report import compare_runs

        try:
            compare_runs(args.compare, Console() if Console().is_terminal else Console(width=170))
        except ValueError as e:
            build_parser().error(str(e))
        return 0
    policy = run_policy(args.config)
    if args.experiment != "headline":
        if args.watch:
            build_parser().error("--watch: the headline's only (no --experiment)")
        from .experiments.ablation import main as experiment

        if args.systems == ",".join(SYSTEM_NAMES):  # not given: the experiment's own four
            args.systems = None
        if args.duration_s == build_parser().get_default("duration_s"):
            args.duration_s = None
        return experiment(args, Console() if Console().is_terminal else Console(width=170), policy)
    args.devices = args.devices or 768
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    spec = ScenarioSpec(trace=args.trace, num_apps=args.apps, num_requests=args.requests,
                        duration_s=args.duration_s, compression=args.compression, window_s=args.window_s,
                        device=args.device, num_devices=args.devices, mix=args.mix, seed=args.seed, policy=policy,
                        device_effects=args.device_effects, oracle=args.oracle, refit_wall_s=args.refit_wall_s)
    console = Console() if Console().is_terminal else Console(width=170)
    trace = spec.build_trace()
    extra = None
    if args.watch:
        import functools

        from .watch import resolve_app, watch_extra

        try:
            resolve_app(trace.app_names, args.watch)
        except ValueError as e:
            build_parser().error(str(e))
        extra = functools.partial(watch_extra, args.watch)
    code = code_provenance()
    console.print(f"[bold]janus sim[/]: {trace.num_requests:,} requests, {trace.num_apps} apps, "
                  f"{trace.duration_s:.0f} s of trace on {args.devices} x {args.device}; systems: "
                  f"{', '.join(systems)}")
    console.print(f"code: {describe(code)}", highlight=False)
    start = time.perf_counter()
    profiles = None
    from .runner import uses_learned_oracle

    if any(uses_learned_oracle(s, spec.oracle) for s in systems):  # before the systems start: each reads the cache
        from .oracle_training import ensure_profiles

        from .runner import janus_policies, oracle_policy

        profiles = ensure_profiles(spec.build(), Path(spec.oracle_cache_dir), processes=args.processes,
                                   say=console.print, elastic=janus_policies(spec.policy)[0].elastic,
                                   policy=oracle_policy(spec.policy))
        fresh = {k: v for k, v in profiles.items() if not v["cached"]}
        console.print(f"learned oracle: {len(profiles)} kinds of instance profiled on the simulated device "
                      f"({sum(v['points'] for v in profiles.values())} grid points, at most "
                      f"{sum(v['device_s'] for v in profiles.values()) / 3600:.1f} device-hours); "
                      + (f"{len(fresh)} profiled now in {time.perf_counter() - start:.0f} s" if fresh
                         else "all from the cache"))
    plain_log = not console.is_terminal  # no live bar without a terminal: a line per 10 % instead
    logged: dict[str, int] = {}

    def log_progress(system: str, done: int, total: int) -> None:
        step = int(10 * done / max(1, total))
        if plain_log and step > logged.get(system, -1):
            logged[system] = step
            console.print(f"{system}: {done:,}/{total:,} requests replayed, {time.perf_counter() - start:.0f} s")

    with Progress(TextColumn("{task.description:>16}"), BarColumn(), TextColumn("{task.completed:,}/{task.total:,}"),
                  TimeElapsedColumn(), console=console) as progress:
        tasks = {s: progress.add_task(s, total=trace.num_requests) for s in systems}
        results = run_many(spec, systems, processes=args.processes, bin_s=args.bin_s,
                           on_progress=lambda s, i, n: (progress.update(tasks[s], completed=i),
                                                        log_progress(s, i, n)), extra=extra)
        for s in systems:
            progress.update(tasks[s], completed=trace.num_requests)
    wall_s = time.perf_counter() - start
    from .runner import RunFailure

    failures = [r for r in results if isinstance(r, RunFailure)]
    for f in failures:
        console.print(f"[red]{f.system} failed[/]:\n{f.error}")
    results = [r for r in results if not isinstance(r, RunFailure)]
    if not results:
        return 1
    print_tables(results, console)
    meta = dict(vars(args), config=str(args.config) if args.config else None, wall_s=wall_s,
                num_requests=trace.num_requests, policy=policy, oracle_profiles=profiles, code=code)
    paths = write_outputs(results, Path(args.out), meta)
    if args.watch:
        from .watch import write_watch

        paths += write_watch(results, Path(args.out), console)
    console.print(f"{wall_s:.0f} s in all; wrote " + ", ".join(str(p) for p in paths))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())

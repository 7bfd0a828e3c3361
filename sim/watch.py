"""`janus sim --watch APP`: one app's story in a run, to find out why it missed its SLOs (docs/sim.md, "Watching one
app"). Written per system to `<out>/watch-<app>-<system>.json`:

- plans: each elastic plan whose target for the app's model changed (time, prefill / decode instances, m*, why,
  debounced or not), and each steady plan that changed its pool or its devices;
- lifecycle: its instances' launches (load path and time), ready, drains, resumes and removals;
- blocked: each time the reconciler reported an instance of the app it wanted and could not bring up, and why (no
  free device, a worker not alive, a placement cooling down after a failure): a plan that waits for a device;
- requests: per request, arrival, prompt and answer tokens, first token and finish (null: failed), tokens on time;
- bursts: the requests grouped where arrivals are more than `BURST_GAP_S` apart, each with its tokens late and its
  first tokens past the TTFT SLO: where the app lost its tokens.

It reads what the run did (the plans the control plane made, the simulator's lifecycle log, the outcomes); it decides
nothing. Earlier stops wrapped the simulator by hand for the same story (docs/bench/sim.md runs 55-57)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from contracts import ElasticPlan, SteadyPlan

# Arrivals further apart than this start a new burst: longer than a 5 s load window and the scaler's reaction to it.
BURST_GAP_S = 20.0


def resolve_app(app_names, name: str) -> int:
    """The index of the app `name` names: its full name, or a prefix only it has ("app-52" for "app-52-c92")."""
    if name in app_names:
        return list(app_names).index(name)
    matches = [i for i, a in enumerate(app_names) if a.startswith(name)]
    if not matches:
        raise ValueError(f"--watch {name!r}: no app of this trace is named so (its apps: "
                         f"{', '.join(list(app_names)[:5])}, ...)")
    if len(matches) > 1:
        raise ValueError(f"--watch {name!r}: {len(matches)} apps of this trace are named so: "
                         f"{', '.join(app_names[i] for i in matches[:5])}{', ...' if len(matches) > 5 else ''}")
    return matches[0]


def plan_story(plans, model: str) -> list[dict]:
    """The plans that changed what `model` was given: elastic targets, steady pool and devices."""
    out: list[dict] = []
    last_target, last_steady = None, None
    for plan in plans:
        t_s = round(plan.created_unix_ms / 1e3, 3)
        if isinstance(plan, ElasticPlan):  # a tick's, or a wake's
            target = next((t for t in plan.targets if t.model == model), None)
            key = None if target is None else (target.num_prefill, target.num_decode, target.desired_replicas)
            if key != last_target:
                last_target = key
                out.append({"t_s": t_s, "plan": "elastic", "num_prefill": key[0] if key else 0,
                            "num_decode": key[1] if key else 0, "desired_replicas": key[2] if key else 0,
                            "is_debounced": plan.is_debounced, "reason": target.reason if target else "no target"})
        elif isinstance(plan, SteadyPlan):
            pool = "steady" if model in plan.steady_models else "elastic" if model in plan.elastic_models else "-"
            workers = sorted(b.worker_id for b in plan.bins if model in b.models)
            if (pool, workers) != last_steady:
                last_steady = (pool, workers)
                out.append({"t_s": t_s, "plan": f"steady ({plan.trigger})", "pool": pool, "workers": workers,
                            "reason": plan.pool_reasons.get(model, "")})
    return out


def lifecycle_story(lifecycle_log, app_of_instance: dict, app: int) -> list[dict]:
    return [{"t_s": round(t_s, 3), "instance": iid, "event": event, "detail": detail}
            for t_s, iid, event, detail in lifecycle_log if app_of_instance.get(iid) == app]


def blocked_story(blocked_log, model: str) -> list[dict]:
    """The reconciler's blocked reports that name `model`: by its instances' ids (`model@worker/role`) or as
    "N instance(s) of model: no free device"."""
    return [{"t_s": round(t_s, 3), "detail": detail} for t_s, detail in blocked_log
            if detail.startswith(f"{model}@") or f" of {model}:" in detail]


def bursts(arrival_s: np.ndarray, output_tokens: np.ndarray, first_token_s: np.ndarray,
           num_on_time: np.ndarray, ttft_slo_s: float, gap_s: float = BURST_GAP_S) -> list[dict]:
    """The requests (sorted by arrival) cut where two arrivals are more than `gap_s` apart."""
    if len(arrival_s) == 0:
        return []
    cuts = np.flatnonzero(np.diff(arrival_s) > gap_s) + 1
    out = []
    for idx in np.split(np.arange(len(arrival_s)), cuts):
        ttft_s = first_token_s[idx] - arrival_s[idx]
        failed = np.isnan(ttft_s)
        out.append({"from_s": round(float(arrival_s[idx[0]]), 3), "to_s": round(float(arrival_s[idx[-1]]), 3),
                    "requests": int(len(idx)), "tokens": int(output_tokens[idx].sum()),
                    "tokens_late": int((output_tokens[idx] - num_on_time[idx]).sum()),
                    "ttft_missed": int(np.sum(failed | (np.nan_to_num(ttft_s, nan=0.0) > ttft_slo_s))),
                    "failed": int(failed.sum())})
    return out


def watch_extra(name: str, scenario, result) -> dict:
    """`run_one`'s extra hook (`functools.partial(watch_extra, name)`): the app's story, JSON-ready."""
    trace = scenario.trace
    app = resolve_app(trace.app_names, name)
    rows = np.flatnonzero(trace.app_ids == app)  # trace rows are sorted by arrival
    out = result.outcomes
    arrival = trace.arrival_s[rows]
    first, finish = out.first_token_s[rows], out.finish_s[rows]

    def col(a) -> list:
        return [None if isinstance(v, float) and math.isnan(v) else v for v in np.round(a, 4).tolist()]

    return {"watch": {
        "app": trace.app_names[app], "system": result.system,
        "ttft_slo_s": float(scenario.ttft_slo_s[app]), "tpot_slo_s": float(scenario.tpot_slo_s[app]),
        "bursts": bursts(arrival, trace.output_tokens[rows], first, out.num_on_time_tokens[rows],
                         float(scenario.ttft_slo_s[app])),
        "plans": plan_story(result.plans, trace.app_names[app]),
        "lifecycle": lifecycle_story(result.lifecycle_log, result.app_of_instance, app),
        "blocked": blocked_story(result.blocked, trace.app_names[app]),
        "requests": {"arrival_s": col(arrival), "input_tokens": trace.input_tokens[rows].tolist(),
                     "output_tokens": trace.output_tokens[rows].tolist(), "first_token_s": col(first),
                     "finish_s": col(finish), "num_on_time_tokens": out.num_on_time_tokens[rows].tolist()},
    }}


def write_watch(results, out_dir: Path, console) -> list[Path]:
    """Each system's story to `watch-<app>-<system>.json`, and its bursts as a table."""
    from rich.table import Table

    paths = []
    for r in results:
        story = r.extra.get("watch")
        if story is None:
            continue
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"watch-{story['app']}-{r.system}.json"
        path.write_text(json.dumps(story, indent=1))
        paths.append(path)
        table = Table(title=f"{story['app']} on {r.system}: its bursts (arrivals {BURST_GAP_S:.0f} s apart or less)")
        for column in ("from s", "to s", "requests", "tokens", "late", "TTFT missed", "failed"):
            table.add_column(column, justify="right")
        for b in story["bursts"]:
            table.add_row(f"{b['from_s']:.1f}", f"{b['to_s']:.1f}", str(b["requests"]), f"{b['tokens']:,}",
                          f"{b['tokens_late']:,}", str(b["ttft_missed"]), str(b["failed"]))
        console.print(table)
    return paths

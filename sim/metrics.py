"""Token-level SLO attainment and the figures beside it.

Definitions (docs/sim.md, "Metrics"): token i (1-based) of a request is on time if delivered by
TTFT_SLO + (i - 1) * TPOT_SLO after the request's submission; every token of a failed (rejected, dropped) request is
late. Per request: TTFT attained if the first token came within TTFT_SLO; TPOT attained if the mean time per
output token after the first is within TPOT_SLO. Goodput: on-time tokens per second."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Outcomes:
    """What happened to each request of a trace (index = trace row). Filled by the simulator, or by `janus replay`
    from what the clients saw."""

    first_token_s: np.ndarray  # float64, NaN when the request failed
    finish_s: np.ndarray  # float64, NaN when the request failed
    num_on_time_tokens: np.ndarray  # int64

    @classmethod
    def empty(cls, num_requests: int) -> "Outcomes":
        return cls(np.full(num_requests, np.nan), np.full(num_requests, np.nan), np.zeros(num_requests, np.int64))

    @property
    def is_failed(self) -> np.ndarray:
        return np.isnan(self.first_token_s)


# A token this close after its deadline still counts as on time: float sums of step times land a rounding error
# either side of a deadline they meet exactly. Every on-time test of the simulator uses this one margin, so the fast
# paths and the token-by-token reference agree.
ON_TIME_EPS_S = 1e-9


def on_time_tokens(arrival_s: float, token_times_s, ttft_slo_s: float, tpot_slo_s: float) -> int:
    """The definition itself, token by token (the reference the fast paths are tested against)."""
    return sum(1 for i, t in enumerate(token_times_s)
               if t <= arrival_s + ttft_slo_s + i * tpot_slo_s + ON_TIME_EPS_S)


def on_time_in_uniform_run(first_emit_s, step_s, num_tokens, deadline_first_s, tpot_slo_s):
    """How many of `num_tokens` consecutive tokens are on time, when they leave every `step_s` from `first_emit_s`
    and the first of them is due at `deadline_first_s` (each later one `tpot_slo_s` later). Closed form, numpy-
    vectorised over any of the arguments: token x (0-based in the run) is on time iff
    first_emit + x * step <= deadline_first + x * tpot, a linear inequality in x."""
    first_emit_s = np.asarray(first_emit_s, dtype=np.float64)
    slack = np.asarray(deadline_first_s, dtype=np.float64) - first_emit_s + ON_TIME_EPS_S
    gain = tpot_slo_s - np.asarray(step_s, dtype=np.float64)  # slack change per token
    num_tokens = np.asarray(num_tokens, dtype=np.int64)
    with np.errstate(divide="ignore", invalid="ignore"):
        # slack >= 0: on time from x = 0 while slack + x * gain >= 0
        upto = np.where(gain >= 0, num_tokens, np.floor(slack / -gain) + 1)
        # slack < 0: late until slack + x * gain >= 0, i.e. from x = ceil(-slack / gain)
        from_x = np.where(gain > 0, np.ceil(-slack / gain), np.inf)
    count = np.where(slack >= 0, np.minimum(num_tokens, upto), np.maximum(0, num_tokens - from_x))
    return np.clip(count, 0, num_tokens).astype(np.int64)


@dataclass(frozen=True)
class Summary:
    """The headline figures of one run."""

    token_attainment: float
    ttft_attainment: float
    tpot_attainment: float
    request_attainment: float  # both TTFT and TPOT
    goodput_tps: float  # on-time tokens per second over the trace
    num_requests: int
    num_failed: int
    worst_app: str
    worst_app_token_attainment: float
    device_hours: float
    mean_active_devices: float


def request_flags(arrival_s, output_tokens, out: Outcomes, ttft_slo_s, tpot_slo_s):
    """(ttft_ok, tpot_ok) per request; `*_slo_s` are per-request arrays (or scalars)."""
    failed = out.is_failed
    ttft = out.first_token_s - arrival_s
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = (out.finish_s - out.first_token_s) / np.maximum(output_tokens - 1, 1)
    ttft_ok = ~failed & (ttft <= ttft_slo_s + ON_TIME_EPS_S)
    tpot_ok = ~failed & ((output_tokens <= 1) | (tpot <= tpot_slo_s + ON_TIME_EPS_S))
    return ttft_ok, tpot_ok


def per_app_token_attainment(app_ids, output_tokens, out: Outcomes, num_apps: int) -> np.ndarray:
    """Token attainment of each app (NaN for an app without requests)."""
    total = np.bincount(app_ids, weights=output_tokens, minlength=num_apps)
    good = np.bincount(app_ids, weights=out.num_on_time_tokens, minlength=num_apps)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, good / total, np.nan)


@dataclass(frozen=True)
class AppReport:
    """One app's result and why it lost tokens: the dispatcher's rejections by error code (no_instance: the model had
    no ready instance; overloaded: no instance could finish the prefill by the deadline) and when they happened."""

    name: str
    model: str  # shape and tensor parallelism
    num_requests: int
    token_attainment: float
    rejected: dict[str, int]
    first_rejection_s: float  # NaN without rejections
    last_rejection_s: float


def app_reports(app_names, models, num_requests, per_app_attainment, rejections) -> list[AppReport]:
    """Per app, from the run's rejections: a list of (time s, app, error code)."""
    by_app: dict[int, list[tuple[float, str]]] = {}
    for t, app, code in rejections:
        by_app.setdefault(int(app), []).append((float(t), code))
    reports = []
    for a, name in enumerate(app_names):
        events = by_app.get(a, [])
        codes: dict[str, int] = {}
        for _, code in events:
            codes[code] = codes.get(code, 0) + 1
        times = [t for t, _ in events]
        reports.append(AppReport(name, models[a], int(num_requests[a]), float(per_app_attainment[a]), codes,
                                 min(times) if times else float("nan"), max(times) if times else float("nan")))
    return reports


@dataclass(frozen=True)
class KindHours:
    """The device-hours one kind of instance held: an app's instances of one role in one pool."""

    app: str  # "" for the devices a system reserved with no instance on them (role "reserved")
    model: str
    role: str
    pool: str
    device_hours: float


def device_hours_by_kind(seconds_by_kind: dict, app_names, models) -> list[KindHours]:
    """`seconds_by_kind` ((app, role, pool) -> device-seconds, sim.device_ledger) with the apps' names and models,
    the largest first. App -1 is a system's reserve (device_ledger.RESERVED)."""
    rows = [KindHours(app_names[app] if app >= 0 else "", models[app] if app >= 0 else "", role, pool, seconds / 3600)
            for (app, role, pool), seconds in seconds_by_kind.items()]
    return sorted(rows, key=lambda k: (-k.device_hours, k.app, k.role, k.pool))


def worst_apps(reports: list[AppReport], count: int = 10) -> list[AppReport]:
    """The `count` apps with the lowest token attainment (apps without requests left out)."""
    ranked = sorted((r for r in reports if r.num_requests > 0), key=lambda r: r.token_attainment)
    return ranked[:count]


def summarise(trace, out: Outcomes, ttft_slo_s, tpot_slo_s, device_time_s=None, device_counts=None,
              min_app_requests: int = 1) -> Summary:
    """Headline figures. `device_time_s`/`device_counts`: the active-device step function (count from each time
    on); device-hours integrate it over the trace. The worst app is taken over apps with at least
    `min_app_requests` requests."""
    arrival, outputs, apps = trace.arrival_s, trace.output_tokens.astype(np.int64), trace.app_ids
    ttft_ok, tpot_ok = request_flags(arrival, outputs, out, ttft_slo_s, tpot_slo_s)
    n = max(1, len(arrival))
    per_app = per_app_token_attainment(apps, outputs, out, trace.num_apps)
    counts = np.bincount(apps, minlength=trace.num_apps)
    eligible = np.where(counts >= min_app_requests, per_app, np.nan)
    worst = int(np.nanargmin(eligible)) if np.isfinite(eligible).any() else 0
    span_s = trace_span_s(trace)
    device_hours, mean_devices = 0.0, 0.0
    if device_time_s is not None and len(device_time_s):
        device_hours = integrate_steps(device_time_s, device_counts, 0.0, span_s) / 3600.0
        mean_devices = device_hours * 3600.0 / span_s
    return Summary(
        token_attainment=float(out.num_on_time_tokens.sum() / max(1, outputs.sum())),
        ttft_attainment=float(ttft_ok.sum() / n),
        tpot_attainment=float(tpot_ok.sum() / n),
        request_attainment=float((ttft_ok & tpot_ok).sum() / n),
        goodput_tps=float(out.num_on_time_tokens.sum() / span_s),
        num_requests=len(arrival),
        num_failed=int(out.is_failed.sum()),
        worst_app=trace.app_names[worst] if trace.num_apps else "",
        worst_app_token_attainment=float(eligible[worst]) if np.isfinite(eligible).any() else float("nan"),
        device_hours=device_hours,
        mean_active_devices=mean_devices,
    )


def trace_span_s(trace) -> float:
    """The span device-hours are charged over: the trace's duration (a run's tail finishing requests is not)."""
    return max(trace.duration_s, 1e-9)


def integrate_steps(times_s, values, start_s: float, end_s: float) -> float:
    """Integral over [start_s, end_s] of the step function that takes values[k] from times_s[k] on (0 before)."""
    times_s = np.asarray(times_s, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    edges = np.clip(np.append(times_s, end_s), start_s, end_s)
    return float(np.sum(values * np.diff(edges)))


@dataclass(frozen=True)
class TimeSeries:
    """Per-bin figures for the plots: load, goodput, active devices, attainment over time."""

    bin_start_s: np.ndarray
    load_rps: np.ndarray
    goodput_tps: np.ndarray
    active_devices: np.ndarray
    token_attainment: np.ndarray  # of the requests that arrived in the bin (NaN if none)


def time_series(trace, out: Outcomes, bin_s: float, device_time_s=None, device_counts=None) -> TimeSeries:
    span_s = max(trace.duration_s, bin_s)
    num_bins = int(np.ceil(span_s / bin_s))
    edges = np.arange(num_bins + 1) * bin_s
    arrival_bin = np.minimum((trace.arrival_s / bin_s).astype(np.int64), num_bins - 1)
    load = np.bincount(arrival_bin, minlength=num_bins) / bin_s
    outputs = trace.output_tokens.astype(np.float64)
    total = np.bincount(arrival_bin, weights=outputs, minlength=num_bins)
    good = np.bincount(arrival_bin, weights=out.num_on_time_tokens.astype(np.float64), minlength=num_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        attainment = np.where(total > 0, good / total, np.nan)
    goodput = _spread_rate(out, edges)
    devices = np.zeros(num_bins)
    if device_time_s is not None and len(device_time_s):
        devices = np.array([integrate_steps(device_time_s, device_counts, a, b) / bin_s
                            for a, b in zip(edges[:-1], edges[1:])])
    return TimeSeries(edges[:-1], load, goodput, devices, attainment)


def _spread_rate(out: Outcomes, edges: np.ndarray) -> np.ndarray:
    """On-time tokens per second per bin, each request's on-time tokens spread evenly over its
    [first token, finish] interval (a difference array over a 0.1 s grid, then summed into the bins)."""
    ok = ~out.is_failed & (out.num_on_time_tokens > 0)
    cell_s = 0.1
    num_cells = int(np.ceil(edges[-1] / cell_s)) + 1
    first = np.clip((out.first_token_s[ok] / cell_s).astype(np.int64), 0, num_cells - 1)
    # a request shorter than a cell still lands whole in one cell
    last = np.clip(np.maximum((out.finish_s[ok] / cell_s).astype(np.int64) + 1, first + 1), 1, num_cells)
    per_cell = out.num_on_time_tokens[ok] / (last - first)
    diff = np.zeros(num_cells + 1)
    np.add.at(diff, first, per_cell)
    np.add.at(diff, last, -per_cell)
    cumulative = np.concatenate([[0.0], np.cumsum(np.cumsum(diff)[:num_cells])])
    idx = np.clip(np.round(edges / cell_s).astype(np.int64), 0, num_cells)
    return (cumulative[idx[1:]] - cumulative[idx[:-1]]) / np.diff(edges)

"""ServeGen client data -> a multi-app trace: each selected client becomes an app (62 by default, as in the paper).

The source (shared/traces/servegen_m_large, see its README) gives, per client, 600 s windows of mean request rate
and inter-arrival distribution (Gamma or Weibull, with its coefficient of variation) and 6-hour windows of token
length quantiles. We draw arrivals per client and window from that window's distribution and lengths from that
window's quantiles, then compress time so that `source_span_s` of history plays in `duration_s`.

Choices, and why:
- The window's `rate_rps` is taken as the truth and the distribution's *shape* as the burstiness: the fitted scale
  parameters do not always reproduce the window's rate (some Weibull fits are off by 2x), so the scale is reset to
  match the rate and the shape keeps the coefficient of variation.
- Apps are chosen by rank, evenly spread over all clients active in the span (rank quantiles), so the 62-app
  trace keeps the population's skew: the top ~12 % of apps carry ~80 % of the requests, as in the paper's
  production trace. Taking the 62 busiest instead would flatten the skew (their top 12 % carry only ~58 %).
- To hit `num_requests`, every inter-arrival time is divided by one factor on top of the time compression; this
  keeps each window's coefficient of variation (the bursts) and the window-to-window jumps.
- Clients without length data (15 of 162) borrow the lengths of the nearest-ranked client that has them.
"""
from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from math import gamma as gamma_fn
from pathlib import Path

import numpy as np

from .paths import traces_dir
from .trace import Trace

WINDOW_S = 600.0
LENGTH_WINDOW_S = 21_600.0
NUM_QUANTILES = 21


@dataclass(frozen=True)
class ServeGenClient:
    client_id: int
    windows: np.ndarray  # (num_windows, 4): start_s, rate_rps, shape (family-specific), family (0 none, 1 gamma, 2 weibull)
    length_starts_s: np.ndarray  # (num_length_windows,)
    input_q: np.ndarray  # (num_length_windows, 21), NaN rows where the window had none
    output_q: np.ndarray


def servegen_path() -> Path:
    return traces_dir() / "servegen_m_large" / "clients.jsonl.gz"


def load_clients(path: Path | None = None) -> list[ServeGenClient]:
    path = path or servegen_path()
    clients = []
    with gzip.open(path, "rt") as handle:
        for line in handle:
            row = json.loads(line)
            windows = np.array([[w[0], w[1], w[4], {"Gamma": 1, "Weibull": 2}.get(w[3], 0)] for w in row["windows"]],
                               dtype=np.float64)
            starts, inq, outq = [], [], []
            for entry in row.get("lengths") or []:
                starts.append(entry[0])
                inq.append(entry[1] if entry[1] else [np.nan] * NUM_QUANTILES)
                outq.append(entry[2] if entry[2] else [np.nan] * NUM_QUANTILES)
            clients.append(ServeGenClient(int(row["client"]), windows, np.array(starts, dtype=np.float64),
                                          np.array(inq, dtype=np.float64).reshape(-1, NUM_QUANTILES),
                                          np.array(outq, dtype=np.float64).reshape(-1, NUM_QUANTILES)))
    if not clients:
        raise ValueError(f"{path}: no clients")
    return clients


def mean_rate_rps(client: ServeGenClient, start_s: float, end_s: float) -> float:
    w = client.windows
    sel = (w[:, 0] >= start_s) & (w[:, 0] < end_s)
    return float(w[sel, 1].mean()) if sel.any() else 0.0


def select_clients(clients: list[ServeGenClient], num_apps: int, start_s: float, end_s: float,
                   min_rate_rps: float = 0.0) -> list[ServeGenClient]:
    """`num_apps` clients at evenly spaced ranks (by mean rate in the span) among those with a mean rate above
    `min_rate_rps`, busiest first."""
    rated = sorted(((mean_rate_rps(c, start_s, end_s), c.client_id, c) for c in clients), key=lambda t: (-t[0], t[1]))
    active = [c for rate, _, c in rated if rate > max(min_rate_rps, 0.0)]
    if len(active) < num_apps:
        # too few clients are busy enough: take the busiest `num_apps` with any traffic (skew then flattens)
        active = [c for rate, _, c in rated if rate > 0][:num_apps]
    if len(active) < num_apps:
        raise ValueError(f"only {len(active)} clients have traffic in [{start_s}, {end_s}); asked for {num_apps}")
    ranks = np.unique(np.round(np.linspace(0, len(active) - 1, num_apps)).astype(int))
    return [active[r] for r in ranks]


def _iat_unit_samples(rng: np.random.Generator, family: int, shape: float, size: int) -> np.ndarray:
    """Inter-arrival times of mean 1 with the window's shape (so the coefficient of variation is the window's)."""
    if family == 1 and shape > 0:
        return rng.gamma(shape, 1.0 / shape, size)
    if family == 2 and shape > 0:
        return rng.weibull(shape, size) / gamma_fn(1.0 + 1.0 / shape)
    return rng.exponential(1.0, size)


def _draw_arrivals(rng: np.random.Generator, client: ServeGenClient, start_s: float, end_s: float,
                   rate_scale: float) -> np.ndarray:
    """Arrival times in source seconds over [start_s, end_s), rates multiplied by `rate_scale`."""
    out = []
    for w_start, rate, shape, family in client.windows:
        if rate <= 0 or w_start + WINDOW_S <= start_s or w_start >= end_s:
            continue
        lo, hi = max(w_start, start_s), min(w_start + WINDOW_S, end_s)
        mean_iat = 1.0 / (rate * rate_scale)
        expected = (hi - lo) / mean_iat
        # a renewal process started at the window edge: the first gap drawn like any other
        t, chunks = lo, []
        while t < hi:
            size = int(expected * 1.3) + 16
            gaps = _iat_unit_samples(rng, int(family), shape, size) * mean_iat
            times = t + np.cumsum(gaps)
            chunks.append(times[times < hi])
            t = times[-1]
        out.extend(chunks)
    return np.concatenate(out) if out else np.empty(0)


def _sample_lengths(rng: np.random.Generator, starts_s: np.ndarray, quantiles: np.ndarray,
                    times_s: np.ndarray) -> np.ndarray:
    """Inverse-CDF sampling between the 21 quantiles of each request's 6-hour window (nearest window with data)."""
    valid = ~np.isnan(quantiles).any(axis=1)
    starts_s, quantiles = starts_s[valid], quantiles[valid]
    idx = np.clip(np.searchsorted(starts_s, times_s, side="right") - 1, 0, len(starts_s) - 1)
    pos = rng.random(len(times_s)) * (NUM_QUANTILES - 1)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, NUM_QUANTILES - 1)
    frac = pos - lo
    values = quantiles[idx, lo] * (1 - frac) + quantiles[idx, hi] * frac
    return np.maximum(np.round(values), 1).astype(np.int32)


def _has_lengths(client: ServeGenClient) -> bool:
    return len(client.input_q) > 0 and bool((~np.isnan(client.input_q).any(axis=1)).any())


def servegen_trace(num_apps: int = 62, duration_s: float = 1800.0, num_requests: int = 600_000,
                   source_start_s: float = 0.0, source_span_s: float = 86_400.0, seed: int = 0,
                   min_requests_per_app: int = 20, path: Path | None = None,
                   clients: list[ServeGenClient] | None = None) -> Trace:
    """A seeded, deterministic multi-app trace: `source_span_s` of the ServeGen history from `source_start_s`,
    compressed to `duration_s`, with about `num_requests` requests (Poisson-free: counts follow the windows'
    renewal processes). Every app expects at least `min_requests_per_app` requests. App i is `app-NN-cCCC` (NN: rank order, busiest first; CCCC: the ServeGen client id)."""
    if num_apps < 1 or duration_s <= 0 or num_requests < 1 or source_span_s <= 0:
        raise ValueError("servegen_trace: num_apps, duration_s, num_requests and source_span_s must be positive")
    clients = clients if clients is not None else load_clients(path)
    end_s = source_start_s + source_span_s
    # Clients too quiet to send `min_requests_per_app` after scaling are not apps of this trace; the scale
    # depends on the choice, so iterate to a fixed point (two or three rounds).
    min_rate_rps, chosen = 0.0, []
    for _ in range(8):
        picked = select_clients(clients, num_apps, source_start_s, end_s, min_rate_rps)
        expected = sum(mean_rate_rps(c, source_start_s, end_s) for c in picked) * source_span_s
        rate_scale = num_requests / expected
        if picked == chosen:
            break
        chosen = picked
        min_rate_rps = min_requests_per_app / (rate_scale * source_span_s)
    compression = source_span_s / duration_s
    rng = np.random.default_rng(seed)
    with_lengths = [c for c in chosen if _has_lengths(c)] or [c for c in clients if _has_lengths(c)]
    arrivals, app_ids, inputs, outputs, names = [], [], [], [], []
    for app_id, client in enumerate(chosen):
        times = _draw_arrivals(rng, client, source_start_s, end_s, rate_scale)
        donor = client if _has_lengths(client) else min(
            with_lengths, key=lambda c: abs(chosen.index(c) - app_id) if c in chosen else 10**9)
        inputs.append(_sample_lengths(rng, donor.length_starts_s, donor.input_q, times))
        outputs.append(_sample_lengths(rng, donor.length_starts_s, donor.output_q, times))
        arrivals.append((times - source_start_s) / compression)
        app_ids.append(np.full(len(times), app_id, dtype=np.int32))
        names.append(f"app-{app_id:02d}-c{client.client_id}")
    meta = dict(source_start_s=source_start_s, source_span_s=source_span_s, compression=compression,
                rate_scale=rate_scale, seed=seed, client_ids=[c.client_id for c in chosen])
    trace = Trace.build(np.concatenate(arrivals), np.concatenate(app_ids), np.concatenate(inputs),
                        np.concatenate(outputs), names, source="servegen_m_large", meta=meta)
    # Trace.build shifts the first arrival to 0; keep the span's own origin instead so window edges line up
    return trace

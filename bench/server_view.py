"""What the server saw during a client's run, from the gateway's own /metrics scraped before and after it: the
TTFT the gateway measured (arrival at the gateway to first token handed to the response) and how late the gateway's
event loop ran. Set beside a client's TTFT, it tells the server's time from the client's own (a load generator
sharing the cores with the cluster measures its own queueing too).

Quantiles come from the histograms' buckets, interpolated linearly inside the bucket as Prometheus'
`histogram_quantile` does: coarse (a p90 between 1 and 2.5 s reads as somewhere in there), but enough to tell
milliseconds from seconds."""
from __future__ import annotations

import math
import urllib.request
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

TTFT = "janus_gateway_ttft_seconds"
LOOP_LAG = "janus_event_loop_lag_seconds"


def scrape(url: str, timeout_s: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as r:  # noqa: S310 - the operator's own gateway
        return r.read().decode()


def buckets(text: str, name: str, **labels: str) -> dict[float, float]:
    """Cumulative counts per upper bound of histogram `name`, summed over every series whose labels include
    `labels` (e.g. every model and tenant)."""
    out: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == f"{name}_bucket" and all(s.labels.get(k) == v for k, v in labels.items()):
                le = float(s.labels["le"])
                out[le] = out.get(le, 0.0) + s.value
    return out


def delta(before: dict[float, float], after: dict[float, float]) -> dict[float, float]:
    return {le: after[le] - before.get(le, 0.0) for le in after}


def quantile(cumulative: dict[float, float], q: float) -> float:
    """The q-quantile of a histogram's cumulative buckets (NaN when empty): linear inside its bucket; in the
    +Inf bucket, the largest finite bound."""
    bounds = sorted(cumulative)
    total = cumulative[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return math.nan
    rank = q * total
    lower, below = 0.0, 0.0
    for le in bounds:
        count = cumulative[le]
        if count >= rank:
            if math.isinf(le):
                return lower
            inside = count - below
            return lower + (le - lower) * ((rank - below) / inside if inside > 0 else 1.0)
        lower, below = le, count
    return lower


def share_above(cumulative: dict[float, float], bound: float) -> float:
    """The share of observations above `bound` (a bucket bound)."""
    total = cumulative.get(math.inf, 0.0)
    return (total - cumulative.get(bound, 0.0)) / total if total > 0 else math.nan


@dataclass
class ServerView:
    num_first_tokens: int = 0  # TTFTs the gateway observed during the run
    ttft_p50_ms: float = math.nan
    ttft_p90_ms: float = math.nan
    loop_late_share: float = math.nan  # share of the gateway loop's 0.1 s samples that woke > 0.1 s late
    loop_lag_p99_ms: float = math.nan


def server_view(before: str, after: str, late_bound_s: float = 0.1) -> ServerView:
    ttft = delta(buckets(before, TTFT), buckets(after, TTFT))
    lag = delta(buckets(before, LOOP_LAG, service="gateway"), buckets(after, LOOP_LAG, service="gateway"))
    return ServerView(num_first_tokens=int(ttft.get(math.inf, 0.0)),
                      ttft_p50_ms=quantile(ttft, 0.5) * 1e3, ttft_p90_ms=quantile(ttft, 0.9) * 1e3,
                      loop_late_share=share_above(lag, late_bound_s) if lag else math.nan,
                      loop_lag_p99_ms=quantile(lag, 0.99) * 1e3 if lag else math.nan)

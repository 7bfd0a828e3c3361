"""A request trace as column arrays: what every workload source produces and the simulator replays open-loop.

Columns rather than objects: the headline run replays ~600 k requests, and one Python object per request costs
more than the simulation of it."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Trace:
    """Requests sorted by arrival. `app_ids[j]` indexes `app_names`; lengths are token counts (>= 1 each: the first
    output token always comes out of the prefill)."""

    arrival_s: np.ndarray  # float64, non-decreasing, starts at 0 after `normalised`
    app_ids: np.ndarray  # int32
    input_tokens: np.ndarray  # int32
    output_tokens: np.ndarray  # int32
    app_names: tuple[str, ...]
    source: str = ""
    meta: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        if not (len(self.app_ids) == len(self.input_tokens) == len(self.output_tokens) == n):
            raise ValueError("trace columns must have equal lengths")
        if n and np.any(np.diff(self.arrival_s) < 0):
            raise ValueError("trace arrivals must be sorted")
        if n and (self.input_tokens.min() < 1 or self.output_tokens.min() < 1):
            raise ValueError("token counts must be >= 1")
        if n and (self.app_ids.min() < 0 or self.app_ids.max() >= len(self.app_names)):
            raise ValueError("app id out of range of app_names")

    @classmethod
    def build(cls, arrival_s, app_ids, input_tokens, output_tokens, app_names, source: str = "",
              meta: dict | None = None) -> "Trace":
        """Sort (stably, so equal timestamps keep their file order), clip lengths to >= 1 and shift to start at 0."""
        arrival_s = np.asarray(arrival_s, dtype=np.float64)
        order = np.argsort(arrival_s, kind="stable")
        arrival_s = arrival_s[order]
        if len(arrival_s):
            arrival_s = arrival_s - arrival_s[0]
        return cls(
            arrival_s=arrival_s,
            app_ids=np.asarray(app_ids, dtype=np.int32)[order],
            input_tokens=np.maximum(np.asarray(input_tokens, dtype=np.int64)[order], 1).astype(np.int32),
            output_tokens=np.maximum(np.asarray(output_tokens, dtype=np.int64)[order], 1).astype(np.int32),
            app_names=tuple(app_names),
            source=source,
            meta=dict(meta or {}),
        )

    @property
    def num_requests(self) -> int:
        return len(self.arrival_s)

    @property
    def num_apps(self) -> int:
        return len(self.app_names)

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1]) if self.num_requests else 0.0

    def compressed(self, factor: float) -> "Trace":
        """Time compression: every inter-arrival gap divided by `factor` (> 1 speeds the trace up); order, apps and
        lengths unchanged."""
        if not factor > 0:
            raise ValueError(f"compression factor must be > 0, got {factor}")
        return self._with(arrival_s=self.arrival_s / factor, source=f"{self.source}/x{factor:g}")

    def window(self, start_s: float, end_s: float) -> "Trace":
        """The requests arriving in [start_s, end_s), shifted to start at 0."""
        lo, hi = np.searchsorted(self.arrival_s, [start_s, end_s], side="left")
        return Trace(self.arrival_s[lo:hi] - start_s, self.app_ids[lo:hi], self.input_tokens[lo:hi],
                     self.output_tokens[lo:hi], self.app_names, self.source, dict(self.meta))

    def head(self, num_requests: int) -> "Trace":
        n = max(0, num_requests)
        return Trace(self.arrival_s[:n], self.app_ids[:n], self.input_tokens[:n], self.output_tokens[:n],
                     self.app_names, self.source, dict(self.meta))

    def requests_per_app(self) -> np.ndarray:
        return np.bincount(self.app_ids, minlength=self.num_apps)

    def top_share(self, app_fraction: float) -> float:
        """Share of requests carried by the busiest `app_fraction` of the apps (rounded to the nearest app count,
        at least one): the skew figure the paper quotes (top 12 % of apps carry 80 % of requests)."""
        counts = np.sort(self.requests_per_app())[::-1]
        k = max(1, int(round(app_fraction * self.num_apps)))
        return float(counts[:k].sum() / max(1, counts.sum()))

    def _with(self, **changes) -> "Trace":
        fields = dict(arrival_s=self.arrival_s, app_ids=self.app_ids, input_tokens=self.input_tokens,
                      output_tokens=self.output_tokens, app_names=self.app_names, source=self.source,
                      meta=dict(self.meta))
        fields.update(changes)
        return Trace(**fields)


def rate_series(arrival_s: np.ndarray, bin_s: float, duration_s: float | None = None) -> np.ndarray:
    """Requests per second in consecutive bins of `bin_s`."""
    if not bin_s > 0:
        raise ValueError("bin_s must be > 0")
    end = duration_s if duration_s is not None else (float(arrival_s[-1]) if len(arrival_s) else 0.0)
    num_bins = max(1, int(np.ceil(end / bin_s)) or 1)
    counts = np.bincount(np.minimum((arrival_s / bin_s).astype(np.int64), num_bins - 1), minlength=num_bins)
    return counts / bin_s


def burst_ratio(arrival_s: np.ndarray, short_s: float = 5.0, long_s: float = 60.0, min_count: int = 20) -> float:
    """Peak of (rate over `short_s`) / (rate over the trailing `long_s`), as the traces README measures
    burstiness. Bins whose trailing window holds fewer than `min_count` requests are skipped (a jump from 0 to 1
    request is not a burst)."""
    if len(arrival_s) == 0:
        return 0.0
    short = rate_series(arrival_s, short_s)
    per_long = int(round(long_s / short_s))
    counts = short * short_s
    trailing = np.convolve(counts, np.ones(per_long), mode="full")[: len(counts)]
    # trailing[i] includes bin i; compare bin i to the window that ends just before it
    prev = np.concatenate([[0.0], trailing[:-1]])
    ok = (np.arange(len(counts)) >= per_long) & (prev >= min_count)
    if not ok.any():
        return 0.0
    return float(np.max(counts[ok] / (prev[ok] / per_long)))

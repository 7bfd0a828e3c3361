"""Per-model load from the windows of every dispatcher: each dispatcher sees only the requests its queue group
handed it, so a model's load is the sum over dispatchers of their latest windows (stale ones dropped). Here, below
the services, because the planners (planner/core/steady.py, elastic.py) and the oracle (oracle/core/intake.py) must
read one model's load the same way."""
from __future__ import annotations

from .telemetry import LoadFeatures, ModelLoadWindow


def merge_windows(windows: list[ModelLoadWindow]) -> ModelLoadWindow:
    """One window for one model out of several dispatchers' windows: rates add up, lengths are averaged with the
    request rates as weights (the variance pooled), TTFT attainment weighted by requests, token attainment by tokens
    due."""
    if not windows:
        raise ValueError("nothing to merge")
    if len(windows) == 1:
        return windows[0]
    rates = [w.request_rate_rps for w in windows]
    total_rate = sum(rates)
    weights = [r / total_rate for r in rates] if total_rate > 0 else [1.0 / len(windows)] * len(windows)
    in_mean = sum(wt * w.features.input_len_mean for wt, w in zip(weights, windows))
    in_second = sum(wt * (w.features.input_len_var + w.features.input_len_mean ** 2) for wt, w in zip(weights, windows))
    out_mean = sum(wt * w.features.output_len_mean for wt, w in zip(weights, windows))
    out_second = sum(wt * (w.features.output_len_var + w.features.output_len_mean ** 2)
                     for wt, w in zip(weights, windows))
    num_requests = sum(w.num_requests for w in windows)
    attained = [(w.ttft_attainment, w.num_requests) for w in windows if w.ttft_attainment is not None]
    attainment = None
    if attained and sum(n for _, n in attained) > 0:
        attainment = sum(a * n for a, n in attained) / sum(n for _, n in attained)
    num_tokens_due = sum(w.num_tokens_due for w in windows if w.token_attainment is not None)
    token_attainment = None
    if num_tokens_due > 0:
        token_attainment = sum(w.token_attainment * w.num_tokens_due for w in windows
                               if w.token_attainment is not None) / num_tokens_due
    return ModelLoadWindow(
        model=windows[0].model,
        window_s=max(w.window_s for w in windows),
        end_unix_ms=max(w.end_unix_ms for w in windows),
        num_requests=num_requests,
        request_rate_rps=total_rate,
        features=LoadFeatures(
            token_rate_tps=sum(w.features.token_rate_tps for w in windows),
            input_len_mean=in_mean,
            input_len_var=max(0.0, in_second - in_mean ** 2),
            output_len_mean=out_mean,
            output_len_var=max(0.0, out_second - out_mean ** 2),
        ),
        ttft_attainment=attainment,
        token_attainment=min(token_attainment, 1.0) if token_attainment is not None else None,
        num_tokens_due=num_tokens_due,
        num_rejected=sum(w.num_rejected for w in windows),
        num_late=sum(w.num_late for w in windows),
        queue_depth=sum(w.queue_depth for w in windows),
        dispatcher_id="+".join(sorted(w.dispatcher_id for w in windows)),
    )


class LoadBook:
    """The latest window of each (model, dispatcher); a dispatcher silent for `stale_after_windows` of its window
    length no longer counts (it died, or the model has no traffic through it)."""

    def __init__(self, stale_after_windows: float = 3.0) -> None:
        self.stale_after_windows = stale_after_windows
        self._latest: dict[str, dict[str, ModelLoadWindow]] = {}

    def record(self, window: ModelLoadWindow) -> None:
        """Keep the window as its dispatcher's latest (an older one arriving late is dropped)."""
        per_dispatcher = self._latest.setdefault(window.model, {})
        prev = per_dispatcher.get(window.dispatcher_id)
        if prev is None or window.end_unix_ms >= prev.end_unix_ms:
            per_dispatcher[window.dispatcher_id] = window

    def observe(self, window: ModelLoadWindow) -> ModelLoadWindow:
        """Record a window; returns the model's merged load as of this window."""
        self.record(window)
        return self.merged(window.model, window.end_unix_ms)  # type: ignore[return-value]

    def fresh(self, model: str, now_ms: float | None = None) -> list[ModelLoadWindow]:
        """The model's latest window of each dispatcher that still counts at `now_ms` (None: all); the newest one
        when every dispatcher is stale."""
        windows = list(self._latest.get(model, {}).values())
        if now_ms is not None and len(windows) > 1:
            fresh = [w for w in windows if now_ms - w.end_unix_ms <= self.stale_after_windows * w.window_s * 1000.0]
            windows = fresh or [max(windows, key=lambda w: w.end_unix_ms)]
        return windows

    def merged(self, model: str, now_ms: float | None = None) -> ModelLoadWindow | None:
        windows = self.fresh(model, now_ms)
        return merge_windows(windows) if windows else None

    def __contains__(self, model: str) -> bool:
        return model in self._latest

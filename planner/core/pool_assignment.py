"""Pool assignment: models with large or volatile traffic go to the elastic pool up front; they come back to the
steady pool only after they have been calm for a while (hysteresis), or, with `idle_return_s` set, at once when a
small one is idle (parked at zero in the elastic pool, its next request would wait for a start; in the steady pool it
shares a device).

Large: the conservative need bound (mean + k*sigma) takes more than `large_need_enter` of a device in some dimension;
such a model cannot share a device usefully. Volatile: the request rate's coefficient of variation over the trailing
`volatility_window_s`, after removing the Poisson noise a steady stream would show anyway (a rate measured over a
window of T seconds has variance rate/T), passes `volatility_enter`."""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from contracts import ModelLoadWindow, Pool

from .policy import PoolPolicy


@dataclass(frozen=True)
class PoolVerdict:
    """Where a model goes and why."""

    model: str
    pool: Pool
    peak_need: float
    volatility: float | None  # None: too little history to judge
    is_changed: bool
    reason: str


@dataclass
class _ModelState:
    pool: Pool | None = None
    calm_since_ms: float | None = None
    # (end_unix_ms, rate_rps, window_s)
    history: deque[tuple[float, float, float]] | None = None
    last_busy_ms: float | None = None  # end of the last window that saw a request


def excess_cv(samples: Iterable[tuple[float, float]]) -> float:
    """Coefficient of variation of rates beyond Poisson noise. `samples` are (rate_rps, window_s)."""
    pts = list(samples)
    if not pts:
        return 0.0
    rates = [r for r, _ in pts]
    mean = sum(rates) / len(rates)
    if mean <= 0:
        return 0.0
    var = sum((r - mean) ** 2 for r in rates) / max(1, len(rates) - 1)
    noise = sum(mean / w for _, w in pts) / len(pts)
    return math.sqrt(max(0.0, var - noise)) / mean


class PoolAssigner:
    """Feed it every load window (`observe`), ask it at planning time (`assign`). Time is passed in."""

    def __init__(self, policy: PoolPolicy | None = None) -> None:
        self.policy = policy or PoolPolicy()
        self._models: dict[str, _ModelState] = {}

    def observe(self, window: ModelLoadWindow) -> None:
        st = self._models.setdefault(window.model, _ModelState())
        if st.history is None:
            st.history = deque()
        st.history.append((window.end_unix_ms, window.request_rate_rps, window.window_s))
        if window.request_rate_rps > 0:
            st.last_busy_ms = window.end_unix_ms if st.last_busy_ms is None else max(st.last_busy_ms,
                                                                                       window.end_unix_ms)
        horizon_ms = window.end_unix_ms - self.policy.volatility_window_s * 1000.0
        while st.history and st.history[0][0] < horizon_ms:
            st.history.popleft()

    def volatility(self, model: str, now_ms: float) -> float | None:
        st = self._models.get(model)
        if st is None or not st.history:
            return None
        horizon_ms = now_ms - self.policy.volatility_window_s * 1000.0
        pts = [(r, w) for t, r, w in st.history if t >= horizon_ms]
        if len(pts) < self.policy.min_num_windows:
            return None
        return excess_cv(pts)

    def pool_of(self, model: str) -> Pool | None:
        st = self._models.get(model)
        return st.pool if st else None

    def assign(self, now_ms: float, peak_needs: Mapping[str, float]) -> dict[str, PoolVerdict]:
        """A verdict for every model in `peak_needs` (its largest need dimension, conservative bound). Models not
        listed are forgotten: they left the catalogue."""
        p = self.policy
        for gone in set(self._models) - set(peak_needs):
            del self._models[gone]
        verdicts: dict[str, PoolVerdict] = {}
        for model in sorted(peak_needs):
            need = peak_needs[model]
            vol = self.volatility(model, now_ms)
            st = self._models.setdefault(model, _ModelState())
            before = st.pool
            is_large = need >= p.large_need_enter
            # An idle model's volatility is its last burst's: it has nothing to serve, and parked in the elastic pool
            # (zero instances) its next request waits for a start. In the steady pool it keeps an instance that
            # shares a device, and goes elastic again when traffic comes back volatile.
            is_idle = (p.idle_return_s is not None and st.last_busy_ms is not None
                       and now_ms - st.last_busy_ms >= p.idle_return_s * 1000.0)
            is_volatile = vol is not None and vol >= p.volatility_enter and not is_idle
            if st.pool != Pool.ELASTIC:
                if is_large or is_volatile:
                    st.pool, st.calm_since_ms = Pool.ELASTIC, None
                    reason = _why(is_large, is_volatile, need, vol, p)
                else:
                    st.pool = Pool.STEADY
                    reason = "calm and small"
            else:
                is_still_large = need >= p.large_need_exit
                is_still_volatile = vol is not None and vol >= p.volatility_exit
                if is_idle and not is_still_large:
                    st.pool, st.calm_since_ms = Pool.STEADY, None
                    idle_s = (now_ms - st.last_busy_ms) / 1000.0  # type: ignore[operator]
                    reason = (f"idle for {idle_s:.0f} s >= {p.idle_return_s:g} s: back to steady at once "
                              "(small: an instance there shares a device)")
                elif is_still_large or is_still_volatile:
                    st.calm_since_ms = None
                    reason = "still " + _why(is_still_large, is_still_volatile, need, vol, p, is_exit=True)
                else:
                    if st.calm_since_ms is None:
                        st.calm_since_ms = now_ms
                    calm_s = (now_ms - st.calm_since_ms) / 1000.0
                    if calm_s >= p.calm_hold_s:
                        st.pool, st.calm_since_ms = Pool.STEADY, None
                        reason = f"calm for {calm_s:.0f} s >= {p.calm_hold_s:.0f} s: back to steady"
                    else:
                        reason = f"calm for {calm_s:.0f} s of {p.calm_hold_s:.0f} s: held in elastic (hysteresis)"
            verdicts[model] = PoolVerdict(model, st.pool, need, vol, before is not None and before != st.pool, reason)
        return verdicts


def _why(is_large: bool, is_volatile: bool, need: float, vol: float | None, p: PoolPolicy, is_exit: bool = False) -> str:
    large_at = p.large_need_exit if is_exit else p.large_need_enter
    vol_at = p.volatility_exit if is_exit else p.volatility_enter
    parts = []
    if is_large:
        parts.append(f"large: peak need {need:.2f} >= {large_at:.2f}")
    if is_volatile:
        parts.append(f"volatile: excess CV {vol:.2f} >= {vol_at:.2f}")
    return "; ".join(parts) or "elastic"

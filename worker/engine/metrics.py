"""Observed latency and throughput over a recent window. Times are passed in (seconds on any monotonic clock).

- TTFT: from the request reaching the engine to its first sampled token.
- TPOT: a finished request's (last token - first token) / (output tokens - 1).
- prefill tokens/s: prompt tokens computed / busy seconds of the steps that computed prompt tokens.
- decode tokens/s: decode tokens computed / busy seconds of the steps that decoded.
A step that does both counts its whole duration for each, so both rates are conservative in mixed steps.
Torch-free.
"""
from __future__ import annotations

import statistics
from collections import deque


class EngineMetrics:
    def __init__(self, window_s: float = 30.0, max_num_samples: int = 4096) -> None:
        self.window_s = window_s
        self._ttft_ms: deque[tuple[float, float]] = deque(maxlen=max_num_samples)
        self._tpot_ms: deque[tuple[float, float]] = deque(maxlen=max_num_samples)
        # (end time, duration, prefill tokens, decode tokens)
        self._steps: deque[tuple[float, float, int, int]] = deque(maxlen=max_num_samples)

    def record_ttft(self, now_s: float, ttft_ms: float) -> None:
        self._ttft_ms.append((now_s, ttft_ms))

    def record_tpot(self, now_s: float, tpot_ms: float) -> None:
        self._tpot_ms.append((now_s, tpot_ms))

    def record_step(self, now_s: float, duration_s: float, num_prefill_tokens: int, num_decode_tokens: int) -> None:
        self._steps.append((now_s, duration_s, num_prefill_tokens, num_decode_tokens))

    def _recent(self, samples: deque, now_s: float) -> list:
        horizon = now_s - self.window_s
        while samples and samples[0][0] < horizon:
            samples.popleft()
        return list(samples)

    def ttft_ms_p50(self, now_s: float) -> float | None:
        values = [v for _, v in self._recent(self._ttft_ms, now_s)]
        return statistics.median(values) if values else None

    def tpot_ms_p50(self, now_s: float) -> float | None:
        values = [v for _, v in self._recent(self._tpot_ms, now_s)]
        return statistics.median(values) if values else None

    def tokens_per_s(self, now_s: float) -> tuple[float | None, float | None]:
        """(prefill tokens/s, decode tokens/s)."""
        steps = self._recent(self._steps, now_s)
        prefill_s = sum(d for _, d, p, _ in steps if p)
        decode_s = sum(d for _, d, _, n in steps if n)
        prefill_tokens = sum(p for _, _, p, _ in steps)
        decode_tokens = sum(n for _, _, _, n in steps)
        prefill = prefill_tokens / prefill_s if prefill_s > 0 else None
        decode = decode_tokens / decode_s if decode_s > 0 else None
        return prefill, decode

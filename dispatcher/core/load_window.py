"""Per-model sliding load window: the numbers of contracts.ModelLoadWindow, published every 0.5 s."""
from __future__ import annotations

from collections import deque

from contracts import LoadFeatures, ModelLoadWindow


class LoadWindow:
    """Arrivals (with lengths), first tokens (on time or not), finished requests' on-time tokens and rejections of one
    model over the last window_s."""

    def __init__(self, model: str, window_s: float, started_ms: float) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.model = model
        self.window_ms = window_s * 1000.0
        self._started_ms = started_ms
        self._arrivals: deque[tuple[float, int, int]] = deque()  # (ms, prompt tokens, output tokens)
        self._first_tokens: deque[tuple[float, bool]] = deque()  # (ms, is on time)
        self._num_on_time = 0  # of the first tokens in the window
        self._rejections: deque[float] = deque()
        # token-level outcomes: (ms, tokens due, tokens on time) of finished or rejected requests, and their sums
        self._outcomes: deque[tuple[float, int, int]] = deque()
        self._num_tokens_due = 0
        self._num_tokens_on_time = 0

    def record_arrival(self, now_ms: float, num_prompt_tokens: int, num_output_tokens: int) -> None:
        self._arrivals.append((now_ms, num_prompt_tokens, num_output_tokens))

    def record_first_token(self, now_ms: float, is_on_time: bool) -> None:
        self._first_tokens.append((now_ms, is_on_time))
        self._num_on_time += bool(is_on_time)

    def record_rejection(self, now_ms: float, num_expected_tokens: int = 0) -> None:
        """A rejected request: a late first token, and each of its expected output tokens a late token."""
        self._rejections.append(now_ms)
        if num_expected_tokens > 0:
            self.record_outcome(now_ms, num_expected_tokens, 0)

    def record_outcome(self, now_ms: float, num_tokens: int, num_on_time_tokens: int) -> None:
        """A request finished with `num_tokens` output tokens, `num_on_time_tokens` of them on time (token i due
        by its TTFT deadline + (i - 1) * TPOT SLO: the worker counts them)."""
        if num_tokens <= 0:
            return
        on_time = min(max(num_on_time_tokens, 0), num_tokens)
        self._outcomes.append((now_ms, num_tokens, on_time))
        self._num_tokens_due += num_tokens
        self._num_tokens_on_time += on_time

    def _prune(self, now_ms: float) -> None:
        cutoff = now_ms - self.window_ms
        arrivals, first_tokens = self._arrivals, self._first_tokens
        while arrivals and arrivals[0][0] <= cutoff:
            arrivals.popleft()
        while first_tokens and first_tokens[0][0] <= cutoff:
            self._num_on_time -= bool(first_tokens.popleft()[1])
        while self._rejections and self._rejections[0] <= cutoff:
            self._rejections.popleft()
        outcomes = self._outcomes
        while outcomes and outcomes[0][0] <= cutoff:
            _, due, on_time = outcomes.popleft()
            self._num_tokens_due -= due
            self._num_tokens_on_time -= on_time

    def snapshot(self, now_ms: float, queue_depth: int, dispatcher_id: str = "") -> ModelLoadWindow:
        """The window ending at now_ms. Early on, rates use the time since the window started, not window_s."""
        self._prune(now_ms)
        span_s = max(min(self.window_ms, now_ms - self._started_ms), 1.0) / 1000.0
        num_requests = len(self._arrivals)
        if num_requests:
            prompts = [a[1] for a in self._arrivals]
            outputs = [a[2] for a in self._arrivals]
            sum_in, sum_out = sum(prompts), sum(outputs)
            in_mean = sum_in / num_requests
            out_mean = sum_out / num_requests
            # lists, not generators, in sum(): the same additions in the same order, a third faster (every model's
            # window is published every 0.5 s, over up to thousands of arrivals)
            in_var = sum([(x - in_mean) ** 2 for x in prompts]) / num_requests
            out_var = sum([(x - out_mean) ** 2 for x in outputs]) / num_requests
            token_rate = (sum_in + sum_out) / span_s
        else:
            in_mean = out_mean = in_var = out_var = token_rate = 0.0
        num_on_time = self._num_on_time
        num_late = len(self._first_tokens) - num_on_time
        num_rejected = len(self._rejections)
        num_outcomes = len(self._first_tokens) + num_rejected
        return ModelLoadWindow(
            model=self.model,
            window_s=span_s,
            end_unix_ms=now_ms,
            num_requests=num_requests,
            request_rate_rps=num_requests / span_s,
            features=LoadFeatures(
                token_rate_tps=token_rate, input_len_mean=in_mean, input_len_var=in_var, output_len_mean=out_mean,
                output_len_var=out_var,
            ),
            ttft_attainment=(num_on_time / num_outcomes) if num_outcomes else None,
            token_attainment=(self._num_tokens_on_time / self._num_tokens_due) if self._num_tokens_due else None,
            num_tokens_due=self._num_tokens_due,
            num_rejected=num_rejected,
            num_late=num_late,
            queue_depth=queue_depth,
            dispatcher_id=dispatcher_id,
        )

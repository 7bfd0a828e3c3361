"""The gateway's Prometheus series: requests, tokens, TTFT, TPOT, inter-token and end-to-end latency per model and
tenant, requests in flight. docs/operations.md maps them to vLLM's names."""
from __future__ import annotations

from contracts import TokenChunk
from runtime.metrics import LATENCY_BUCKETS_S, counter, gauge, histogram

REQUESTS = counter("janus_gateway_requests_total", "requests by outcome", ("model", "tenant", "status"))
TTFT_S = histogram("janus_gateway_ttft_seconds", "time to first token as the client sees it", ("model", "tenant"))
TPOT_S = histogram("janus_gateway_tpot_seconds", "mean time per output token after the first, per request",
                   ("model", "tenant"), buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0))
# vLLM's generation_tokens_total: every token a client got, streamed or in one body
OUTPUT_TOKENS = counter("janus_gateway_output_tokens_total", "tokens streamed to clients", ("model", "tenant"))
PROMPT_TOKENS = counter("janus_gateway_prompt_tokens_total", "prompt tokens of requests that got a first token",
                        ("model", "tenant"))
# a request may wait out the whole request timeout: buckets past the TTFT ones
E2E_S = histogram("janus_gateway_e2e_request_latency_seconds", "from arrival at the gateway to the last event",
                  ("model", "tenant"), buckets=LATENCY_BUCKETS_S + (120.0, 300.0))
INTER_TOKEN_S = histogram("janus_gateway_inter_token_latency_seconds",
                          "gap between consecutive token chunks of a streamed answer", ("model", "tenant"),
                          buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5))
IN_FLIGHT = gauge("janus_gateway_requests_in_flight", "requests admitted and not yet ended", ("model",))


def observe_request(model: str, tenant: str, status: str, *, ttft_s: float | None, last_token_s: float | None,
                    num_tokens: int, num_prompt_tokens: int = 0, e2e_s: float | None = None) -> None:
    """`ttft_s` and `last_token_s` count from the submission; `e2e_s` from the arrival (tokenising included).
    Prompt tokens are counted once a first token came: as vLLM does, the tokens of prompts that were prefilled."""
    REQUESTS.labels(model, tenant, status).inc()
    if num_tokens:
        OUTPUT_TOKENS.labels(model, tenant).inc(num_tokens)
    if e2e_s is not None:
        E2E_S.labels(model, tenant).observe(max(0.0, e2e_s))
    if ttft_s is not None:
        if num_prompt_tokens:
            PROMPT_TOKENS.labels(model, tenant).inc(num_prompt_tokens)
        TTFT_S.labels(model, tenant).observe(ttft_s)
        if last_token_s is not None and num_tokens > 1:
            TPOT_S.labels(model, tenant).observe((last_token_s - ttft_s) / (num_tokens - 1))


class InterTokenClock:
    """The gaps between consecutive token chunks of each request of a streamed answer, as the gateway hands them to
    the response (vLLM's inter-token latency; a non-streamed answer has none: its client sees no gaps)."""

    def __init__(self, labels_by_place: list[tuple[str, str]]) -> None:
        self._labels_by_place = labels_by_place  # a request's place in the batch -> (model, tenant)
        self._last_chunk_s: dict[int, float] = {}

    def see(self, place: int, event: object, now_s: float) -> None:
        if not isinstance(event, TokenChunk):
            return
        last_s = self._last_chunk_s.get(place)
        self._last_chunk_s[place] = now_s
        if last_s is not None:
            INTER_TOKEN_S.labels(*self._labels_by_place[place]).observe(now_s - last_s)

"""The gateway's Prometheus series: requests, TTFT and TPOT per model and tenant, requests in flight."""
from __future__ import annotations

from runtime.metrics import counter, gauge, histogram

REQUESTS = counter("janus_gateway_requests_total", "requests by outcome", ("model", "tenant", "status"))
TTFT_S = histogram("janus_gateway_ttft_seconds", "time to first token as the client sees it", ("model", "tenant"))
TPOT_S = histogram("janus_gateway_tpot_seconds", "mean time per output token after the first, per request",
                   ("model", "tenant"), buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0))
OUTPUT_TOKENS = counter("janus_gateway_output_tokens_total", "tokens streamed to clients", ("model", "tenant"))
IN_FLIGHT = gauge("janus_gateway_requests_in_flight", "requests admitted and not yet ended", ("model",))


def observe_request(model: str, tenant: str, status: str, *, ttft_s: float | None, last_token_s: float | None,
                    num_tokens: int) -> None:
    REQUESTS.labels(model, tenant, status).inc()
    if num_tokens:
        OUTPUT_TOKENS.labels(model, tenant).inc(num_tokens)
    if ttft_s is not None:
        TTFT_S.labels(model, tenant).observe(ttft_s)
        if last_token_s is not None and num_tokens > 1:
            TPOT_S.labels(model, tenant).observe((last_token_s - ttft_s) / (num_tokens - 1))

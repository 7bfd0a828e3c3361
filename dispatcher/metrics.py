"""The dispatcher's Prometheus series: queue depth and time, attainment, assignments and rejections per model."""
from __future__ import annotations

from runtime.metrics import LATENCY_BUCKETS_S, counter, gauge, histogram

QUEUE_DEPTH = gauge("janus_dispatcher_queue_depth", "requests waiting in the model's global queue", ("model",))
TTFT_ATTAINMENT = gauge("janus_dispatcher_ttft_attainment", "share of first tokens on time over the load window",
                        ("model",))
# the paper's measure: output tokens on time (token i due by the TTFT deadline + (i - 1) * TPOT SLO) over those due
TOKEN_ATTAINMENT = gauge("janus_dispatcher_token_attainment",
                         "share of output tokens on time over the load window (finished and refused requests)",
                         ("model",))
REQUEST_RATE = gauge("janus_dispatcher_request_rate_rps", "arrivals per second over the load window", ("model",))
ASSIGNED = counter("janus_dispatcher_assignments_total", "requests sent to an instance", ("model", "is_late"))
REJECTED = counter("janus_dispatcher_rejections_total", "requests refused or failed by the dispatcher",
                   ("model", "code"))
DECODES_MOVED = counter("janus_dispatcher_decodes_moved_total", "running decodes a draining decode instance was told "
                        "to move to an active one (dispatcher/core/moves.py)", ("model",))
REQUEUED = counter("janus_dispatcher_requeues_total", "requests back in the queue after an instance failed",
                   ("model",))
# vLLM's request_queue_time_seconds: from a request's arrival here (or its requeue after an instance failed) to its
# assignment to an instance. Most waits are a scheduling round: buckets below the 5 ms of the latency ones.
QUEUE_TIME_S = histogram("janus_dispatcher_request_queue_time_seconds",
                         "from arrival at the dispatcher (or requeue) to assignment to an instance", ("model",),
                         buckets=(0.0005, 0.001, 0.0025) + LATENCY_BUCKETS_S)

"""The dispatcher's Prometheus series: queue depth, attainment, assignments and rejections per model."""
from __future__ import annotations

from runtime.metrics import counter, gauge

QUEUE_DEPTH = gauge("janus_dispatcher_queue_depth", "requests waiting in the model's global queue", ("model",))
TTFT_ATTAINMENT = gauge("janus_dispatcher_ttft_attainment", "share of first tokens on time over the load window",
                        ("model",))
REQUEST_RATE = gauge("janus_dispatcher_request_rate_rps", "arrivals per second over the load window", ("model",))
ASSIGNED = counter("janus_dispatcher_assignments_total", "requests sent to an instance", ("model", "is_late"))
REJECTED = counter("janus_dispatcher_rejections_total", "requests refused or failed by the dispatcher",
                   ("model", "code"))
REQUEUED = counter("janus_dispatcher_requeues_total", "requests back in the queue after an instance failed",
                   ("model",))

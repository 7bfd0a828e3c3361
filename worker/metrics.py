"""The worker's Prometheus series: pages per kind, lifecycle transitions and their durations, batches, tokens/s."""
from __future__ import annotations

from runtime.metrics import counter, gauge, histogram

PAGES = gauge("janus_worker_pages", "device pages by state (free, or used by a model for weights or kv)",
              ("worker", "model", "kind"))
FRAGMENTATION = gauge("janus_worker_fragmentation", "free pages outside the largest free run / free pages",
                      ("worker",))
TRANSITIONS = counter("janus_worker_lifecycle_transitions_total", "model state transitions",
                      ("worker", "model", "from_state", "to_state"))
TRANSITION_S = histogram("janus_worker_lifecycle_transition_seconds", "how long a transition took",
                         ("worker", "to_state", "via"), buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
RUNNING = gauge("janus_worker_running_requests", "requests in the running batch", ("worker", "model"))
WAITING = gauge("janus_worker_waiting_requests", "requests admitted and waiting", ("worker", "model"))
DECODE_TPS = gauge("janus_worker_decode_tokens_per_second", "measured decode throughput", ("worker", "model"))
PREFILL_TPS = gauge("janus_worker_prefill_tokens_per_second", "measured prefill throughput", ("worker", "model"))


def observe_heartbeat(hb) -> None:
    """Set the gauges from the heartbeat the worker is about to send (one source of truth for both)."""
    w = hb.worker_id
    PAGES.labels(w, "", "free").set(hb.pages.num_pages_free)
    for model, kinds in hb.pages.pages_by_model.items():
        for kind, n in kinds.items():
            PAGES.labels(w, model, kind).set(n)
    FRAGMENTATION.labels(w).set(hb.pages.fragmentation)
    for st in hb.instances:
        RUNNING.labels(w, st.model).set(st.num_running)
        WAITING.labels(w, st.model).set(st.num_waiting)
        if st.decode_tokens_per_s is not None:
            DECODE_TPS.labels(w, st.model).set(st.decode_tokens_per_s)
        if st.prefill_tokens_per_s is not None:
            PREFILL_TPS.labels(w, st.model).set(st.prefill_tokens_per_s)


def observe_transition(event) -> None:
    TRANSITIONS.labels(event.worker_id, event.model, event.from_state.value, event.to_state.value).inc()
    TRANSITION_S.labels(event.worker_id, event.to_state.value, event.via or "-").observe(event.duration_ms / 1e3)

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


# label sets each worker set last time: a model that left the device must leave the scrape too, not stay frozen
_last_labels: dict[str, set[tuple]] = {}


def observe_heartbeat(hb) -> None:
    """Set the gauges from the heartbeat the worker is about to send (one source of truth for both)."""
    w = hb.worker_id
    now: set[tuple] = set()

    def put(metric, labels: tuple, value: float) -> None:
        metric.labels(*labels).set(value)
        now.add((metric, labels))

    put(PAGES, (w, "", "free"), hb.pages.num_pages_free)
    for model, kinds in hb.pages.pages_by_model.items():
        for kind, n in kinds.items():
            put(PAGES, (w, model, kind), n)
    FRAGMENTATION.labels(w).set(hb.pages.fragmentation)
    for st in hb.instances:
        put(RUNNING, (w, st.model), st.num_running)
        put(WAITING, (w, st.model), st.num_waiting)
        if st.decode_tokens_per_s is not None:
            put(DECODE_TPS, (w, st.model), st.decode_tokens_per_s)
        if st.prefill_tokens_per_s is not None:
            put(PREFILL_TPS, (w, st.model), st.prefill_tokens_per_s)
    for metric, labels in _last_labels.get(w, set()) - now:
        metric.remove(*labels)
    _last_labels[w] = now


def observe_transition(event) -> None:
    TRANSITIONS.labels(event.worker_id, event.model, event.from_state.value, event.to_state.value).inc()
    TRANSITION_S.labels(event.worker_id, event.to_state.value, event.via or "-").observe(event.duration_ms / 1e3)

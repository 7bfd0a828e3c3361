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
# vLLM's kv_cache_usage_perc (a ratio too, despite its name), over a model's engines on this worker. Blocks keeping a
# cached prefix for reuse count as free: an arriving request may take them.
KV_USAGE = gauge("janus_worker_kv_cache_usage_ratio", "KV blocks in use / KV blocks the engines may hold",
                 ("worker", "model"))
# vLLM's prefix_cache_queries / prefix_cache_hits, summed over a model's engines on this worker. Gauges of the engines'
# counts since their start (an engine rebuilt starts again at 0), so rate() over them needs no counter-reset handling.
PREFIX_QUERIES = gauge("janus_worker_prefix_cache_queries_tokens",
                       "prompt tokens looked up in the engines' prefix caches since engine start", ("worker", "model"))
PREFIX_HITS = gauge("janus_worker_prefix_cache_hits_tokens",
                    "prompt tokens found in the engines' prefix caches since engine start", ("worker", "model"))
PREFIX_HIT_RATE = gauge("janus_worker_prefix_cache_hit_rate", "prefix cache hits / queries (tokens) since engine start",
                        ("worker", "model"))


# label sets each worker set last time, per group of series: a model that left the device must leave the scrape too,
# not stay frozen
_last_labels: dict[tuple[str, str], set[tuple]] = {}


def _set_all(group: str, worker_id: str, values: list[tuple[object, tuple, float]]) -> None:
    """Set each (gauge, labels, value) and remove the label sets this worker set last time in `group` but not now."""
    now = set()
    for metric, labels, value in values:
        metric.labels(*labels).set(value)
        now.add((metric, labels))
    for metric, labels in _last_labels.get((group, worker_id), set()) - now:
        metric.remove(*labels)
    _last_labels[(group, worker_id)] = now


def observe_heartbeat(hb) -> None:
    """Set the gauges from the heartbeat the worker is about to send (one source of truth for both)."""
    w = hb.worker_id
    values = [(PAGES, (w, "", "free"), hb.pages.num_pages_free)]
    for model, kinds in hb.pages.pages_by_model.items():
        values += [(PAGES, (w, model, kind), n) for kind, n in kinds.items()]
    FRAGMENTATION.labels(w).set(hb.pages.fragmentation)
    values += [(KV_USAGE, (w, model), ratio) for model, ratio in kv_usage_by_model(hb.instances).items()]
    for st in hb.instances:
        values += [(RUNNING, (w, st.model), st.num_running), (WAITING, (w, st.model), st.num_waiting)]
        if st.decode_tokens_per_s is not None:
            values.append((DECODE_TPS, (w, st.model), st.decode_tokens_per_s))
        if st.prefill_tokens_per_s is not None:
            values.append((PREFILL_TPS, (w, st.model), st.prefill_tokens_per_s))
    _set_all("heartbeat", w, values)


def kv_usage_by_model(statuses) -> dict[str, float]:
    """Used / (used + free) KV blocks per model, summed over its instances that have an engine (the engine counts
    as free the blocks of pages it may still take: used + free is the most it may hold)."""
    sums: dict[str, list[int]] = {}
    for st in statuses:
        used_free = sums.setdefault(st.model, [0, 0])
        used_free[0] += st.num_kv_blocks_used
        used_free[1] += st.num_kv_blocks_free
    return {model: used / (used + free) for model, (used, free) in sums.items() if used + free}


def observe_prefix_cache(worker_id: str, stats_by_model: list[tuple[str, object]]) -> None:
    """Set the prefix cache series from each engine's stats ((model, EngineStats) pairs; the heartbeat's contract
    does not carry them)."""
    totals: dict[str, list[int]] = {}
    for model, st in stats_by_model:
        sums = totals.setdefault(model, [0, 0])
        sums[0] += getattr(st, "prefix_cache_queries", 0)
        sums[1] += getattr(st, "prefix_cache_hits", 0)
    values = []
    for model, (queries, hits) in totals.items():
        labels = (worker_id, model)
        values += [(PREFIX_QUERIES, labels, queries), (PREFIX_HITS, labels, hits),
                   (PREFIX_HIT_RATE, labels, hits / queries if queries else 0.0)]
    _set_all("prefix_cache", worker_id, values)


def observe_transition(event) -> None:
    TRANSITIONS.labels(event.worker_id, event.model, event.from_state.value, event.to_state.value).inc()
    TRANSITION_S.labels(event.worker_id, event.to_state.value, event.via or "-").observe(event.duration_ms / 1e3)

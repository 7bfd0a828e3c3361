"""Requeue with a bounded wait under an overload, end to end (gateway -> dispatcher -> worker over nats-server).

One worker whose engine prefills one request at a time, each taking PREFILL_S (the echo engine, slowed down on
purpose: a deterministic overload, independent of how fast this machine is), and a burst of NUM_REQUESTS requests
for a model with a TTFT SLO of SLO_S: several times more prefill work than fits in max_num_relaxations SLOs.

- Default policy (requeue): requests that miss their deadline are kept, relaxed one SLO at a time, and served late;
  one that still cannot be served is refused only when even a free instance could no longer make its twice-relaxed
  deadline: no earlier than arrival + (1 + max_num_relaxations) SLOs - the planning margin - its prefill time. Then
  it is a 503 `overloaded` with Retry-After.
- `dispatcher: {overload: reject}` (the old default): what cannot be on time is refused at once.

Timing asserts are one-sided where load could move them: a loaded machine only delays answers, and the lower bound
comes from the dispatcher's own arithmetic, not from how fast anything ran.
"""
from __future__ import annotations

import asyncio
import contextlib
import math
import time
from pathlib import Path

import httpx
import pytest

from dispatcher.core.policy import DispatchPolicy
from worker.engine.echo import EchoEngine, EchoStats
from worker.shell.service import WorkerService

from .cluster import start_cluster, wait_until

MODEL = "demo-tiny"
SLO_S = 1.0  # the test model's TTFT SLO
PREFILL_S = 0.15  # what one prefill takes on the slowed engine (one at a time)
PROMPT = list(range(3, 19))  # the engine reports len(PROMPT) / PREFILL_S tokens/s: the dispatcher predicts PREFILL_S
NUM_REQUESTS = 30  # 4.5 s of prefill work for a burst whose bounded wait ends after 2.8 s
POLICY = DispatchPolicy()
MARGIN_S = POLICY.deadline_margin_frac * SLO_S
# the earliest a requeued request can be refused: its deadline relaxed max_num_relaxations times, less the planning
# margin and its own predicted prefill (from then on not even a free instance could make it)
BOUNDED_WAIT_S = (1 + POLICY.relaxation_factor * POLICY.max_num_relaxations) * SLO_S - MARGIN_S - PREFILL_S
CLOCK_SLACK_S = 0.05  # the client's monotonic clock against the services' wall clock
LATE_ANSWER_SLACK_S = 8.0  # how late past the bounded wait a refusal may come on a badly loaded machine


class SlowPrefillEcho(EchoEngine):
    """The echo engine with a prefill that takes PREFILL_S and admits one new request per step, as a device busy
    with one prompt at a time would; decoding stays instant."""

    def step(self):
        with self._lock:
            admitted = self._inbox.pop(0) if self._inbox else None
        if admitted is not None:
            time.sleep(PREFILL_S)  # the engine loop's own thread: the services' event loop runs on
        with self._lock:
            held, self._inbox = self._inbox, [admitted] if admitted is not None else []
        outputs = super().step()
        with self._lock:
            self._inbox[:0] = held  # still waiting, in arrival order, ahead of anything added meanwhile
        return outputs

    def stats(self) -> EchoStats:
        st = super().stats()
        st.prefill_tokens_per_s = len(PROMPT) / PREFILL_S  # what the dispatcher predicts prefill times from
        return st


class SlowPrefillWorker(WorkerService):
    def _build_engine(self, path: Path, owner: str, load_weights: bool = True):
        return SlowPrefillEcho()


def _config(demo_models_dir: Path, dispatcher: dict) -> dict:
    return {"models": [{"name": MODEL, "path": str(demo_models_dir / MODEL), "ttft_slo_ms": SLO_S * 1000}],
            "workers": {"engine": "echo"}, "dispatcher": dispatcher}


@contextlib.asynccontextmanager
async def _one_worker_cluster(nats_url: str, demo_models_dir: Path, dispatcher: dict, tag: str):
    """A cluster of one SlowPrefillWorker, once the dispatcher routes to its instance; yields the gateway URL."""
    cluster = await start_cluster(nats_url, _config(demo_models_dir, dispatcher), demo_models_dir,
                                  worker_cls=SlowPrefillWorker, tag=tag)
    try:
        # only this cluster's instance: a record an earlier cluster left behind would take requests it never answers
        view = cluster.dispatcher.core._view
        await wait_until(lambda: {r.worker_id for r in view.prefill_instances(MODEL)} == {f"{tag}-worker-0"},
                         timeout_s=10, tasks=cluster.tasks)
        yield cluster.url
    finally:
        await cluster.stop()


async def _burst(nats_url: str, demo_models_dir: Path, dispatcher: dict,
                 tag: str) -> list[tuple[float, httpx.Response]]:
    """Start a one-worker cluster, send NUM_REQUESTS at once; (seconds until the answer, answer) for each."""
    async with _one_worker_cluster(nats_url, demo_models_dir, dispatcher, tag) as url:
        limits = httpx.Limits(max_connections=NUM_REQUESTS + 4)
        async with httpx.AsyncClient(base_url=url, timeout=60.0, limits=limits) as client:
            async def one() -> tuple[float, httpx.Response]:
                started = time.monotonic()
                r = await client.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT, "max_tokens": 2})
                return time.monotonic() - started, r

            return await asyncio.gather(*(one() for _ in range(NUM_REQUESTS)))


def _check_refusal(r: httpx.Response) -> None:
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["code"] == "overloaded" and body["error"]["type"] == "overloaded_error", body
    assert r.headers.get("retry-after") == str(max(1, math.ceil(SLO_S))), dict(r.headers)


def _statuses(results) -> dict[int, int]:
    out: dict[int, int] = {}
    for _, r in results:
        out[r.status_code] = out.get(r.status_code, 0) + 1
    return out


async def test_requeue_serves_late_then_refuses_only_after_the_bounded_wait(nats_url, demo_models_dir):
    assert POLICY.overload == "requeue"  # the default this test is about: no `dispatcher:` override below
    results = await _burst(nats_url, demo_models_dir, {}, tag="requeue")
    statuses = _statuses(results)
    assert set(statuses) <= {200, 503}, statuses
    served = [t for t, r in results if r.status_code == 200]
    refused = [(t, r) for t, r in results if r.status_code == 503]
    # (a) served late rather than refused: answers well past the deadline, from a queue that held them
    assert sum(t > SLO_S for t in served) >= 3, sorted(served)
    # (a) no 503 before the bounded wait is spent...
    assert refused, f"{NUM_REQUESTS * PREFILL_S:.1f} s of prefill cannot all fit in {BOUNDED_WAIT_S:.2f} s"
    earliest = min(t for t, _ in refused)
    assert earliest >= BOUNDED_WAIT_S - CLOCK_SLACK_S, (earliest, BOUNDED_WAIT_S)
    # (b) ...and then a 503 `overloaded` with Retry-After, without waiting on indefinitely
    for t, r in refused:
        _check_refusal(r)
        assert t < BOUNDED_WAIT_S + LATE_ANSWER_SLACK_S, t


async def test_reject_by_config_refuses_at_once(nats_url, demo_models_dir):
    results = await _burst(nats_url, demo_models_dir, {"overload": "reject"}, tag="reject")
    statuses = _statuses(results)
    assert set(statuses) <= {200, 503}, statuses
    refused = [(t, r) for t, r in results if r.status_code == 503]
    # at most a deadline's worth of work is served (on a loaded machine, where the burst takes longer to get
    # through the gateway than the deadline, none at all: what reaches the dispatcher too late is refused too)
    assert len(refused) >= NUM_REQUESTS // 2, statuses
    for _, r in refused:
        _check_refusal(r)
    # at once: long before requeue could refuse anything (in practice within a few hundred ms). Most, not all: on a
    # loaded machine the in-process cluster's event loop can fall seconds behind, and a straggler with it
    early = [t for t, _ in refused if t < BOUNDED_WAIT_S - CLOCK_SLACK_S]
    assert len(early) >= 0.8 * len(refused), sorted(t for t, _ in refused)


# A prompt whose predicted prefill (at the rate the engine reports) is past the whole bounded wait: no instance could
# ever give it its first token in time, idle or not (the engine itself still takes PREFILL_S).
LONG_PROMPT = list(range(3, 3 + 400))
LONG_PREFILL_S = len(LONG_PROMPT) * PREFILL_S / len(PROMPT)  # 3.75 s
assert LONG_PREFILL_S > BOUNDED_WAIT_S + PREFILL_S


@pytest.mark.parametrize("dispatcher", [{}, {"overload": "reject"}], ids=["requeue", "reject"])
async def test_a_prompt_too_long_for_its_slo_is_served_late_not_refused(nats_url, demo_models_dir, dispatcher):
    # It was a 503 `overloaded` on an idle cluster, and every retry got the same: now it is served, late.
    tag = f"long-{dispatcher.get('overload', 'requeue')}"
    async with _one_worker_cluster(nats_url, demo_models_dir, dispatcher, tag) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60.0) as client:
            r = await client.post("/v1/completions", json={"model": MODEL, "prompt": LONG_PROMPT, "max_tokens": 3})
            assert r.status_code == 200, r.text
            usage = r.json()["usage"]
            assert (usage["prompt_tokens"], usage["completion_tokens"]) == (len(LONG_PROMPT), 3), usage
            # a short prompt after it is served as before
            r = await client.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT, "max_tokens": 2})
            assert r.status_code == 200, r.text


@pytest.mark.parametrize("dispatcher,expected", [({}, "requeue"), ({"overload": "reject"}, "reject")])
def test_the_cluster_yaml_picks_the_overload_policy(dispatcher, expected, demo_models_dir):
    from runtime.settings import ClusterConfig

    cluster = ClusterConfig.model_validate(_config(demo_models_dir, dispatcher))
    assert DispatchPolicy(**cluster.dispatcher).overload == expected

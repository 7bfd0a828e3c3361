"""Token-level attainment on the live path, over a real nats-server: a worker counts a finished request's on-time
tokens (contracts.RequestOutcome), the dispatcher that sent the request folds them into the model's load window,
and the published window (what the oracle and the planners read) carries them."""
from __future__ import annotations

import httpx
import pytest

from contracts import ModelLoadWindow, RequestOutcome, subjects

from ..scrape import samples, scrape
from .cluster import start_cluster, wait_for

MODEL = "demo-tiny"
MAX_TOKENS = 5


@pytest.fixture(scope="module")
async def cluster(nats_url, demo_models_dir):
    config = {"models": [{"name": MODEL, "path": str(demo_models_dir / MODEL), "ttft_slo_ms": 5000}],
              "workers": {"engine": "echo"}}
    cluster = await start_cluster(nats_url, config, demo_models_dir, num_workers=1, tag="tokatt")
    yield cluster
    await cluster.stop()


async def test_a_completion_reaches_the_published_window_as_token_attainment(cluster, bus_factory):
    dispatcher = cluster.dispatcher
    windows: list[ModelLoadWindow] = []

    async def on_window(window: ModelLoadWindow, env) -> None:
        if window.dispatcher_id == dispatcher.instance:  # an earlier module's dispatcher may still be winding down
            windows.append(window)

    bus = await bus_factory()
    await bus.subscribe(subjects.model_telemetry(MODEL), ModelLoadWindow, on_window, traced=False)
    # an outcome of a request this dispatcher never sent (another dispatcher's): heard, never counted
    await bus.publish(subjects.REQUEST_OUTCOME, RequestOutcome(
        request_id="someone-elses", model=MODEL, worker_id="w", instance_id="i", num_output_tokens=1000,
        num_on_time_tokens=0, finish_reason="stop"), propagate=False)
    await bus.nc.flush()
    async with httpx.AsyncClient(base_url=cluster.url, timeout=30.0) as client:
        r = await client.post("/v1/completions", json={"model": MODEL, "prompt": [11, 12, 13],
                                                        "max_tokens": MAX_TOKENS})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == MAX_TOKENS

    counted = await wait_for(lambda: next((w for w in reversed(windows) if w.num_tokens_due), None), timeout_s=15,
                             what="a published load window with the completion's tokens due")
    assert counted.num_tokens_due == MAX_TOKENS  # the completion's tokens, and not the foreign outcome's
    assert counted.token_attainment is not None and 0.0 <= counted.token_attainment <= 1.0
    # its stream ended: the dispatcher has nothing left to fail for it should the instance die now
    await wait_for(lambda: len(dispatcher._streaming) == 0, timeout_s=5, what="the streaming book emptied")

    async def gauge() -> list[float]:  # the gauge follows the windows the dispatcher publishes every 0.5 s
        return samples(await scrape(dispatcher.metrics_url), "janus_dispatcher_token_attainment", model=MODEL)

    (value,) = await wait_for(gauge, timeout_s=10, what="the dispatcher's token-attainment gauge")
    assert 0.0 <= value <= 1.0

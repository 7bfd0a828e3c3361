"""One request through every hop (gateway -> dispatcher -> worker -> gateway) over a real nats-server, with the
echo engine (no model math) so the test is about the path: HTTP API, errors, streaming, traces."""
from __future__ import annotations

import json

import httpx
import pytest

from ..scrape import samples, scrape
from .cluster import start_cluster, wait_for


# What a client waits for an answer. httpx's 5 s default is the gateway's own submit timeout: late in a full bus run
# one request in a few hundred reaches the dispatcher only when that timeout ends (the gateway's publish sits unsent
# until then; seen with the in-process cluster only), and with requeue (the default) it is then served late, not
# refused. These tests check what comes back, not how fast.
CLIENT_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
async def echo_cluster(nats_url, demo_models_dir, span_exporter):
    config = {
        "models": [{"name": "demo-tiny", "path": str(demo_models_dir / "demo-tiny"), "ttft_slo_ms": 5000},
                   {"name": "demo-small", "path": str(demo_models_dir / "demo-small"), "ttft_slo_ms": 5000}],
        "workers": {"engine": "echo"},
    }
    cluster = await start_cluster(nats_url, config, demo_models_dir, num_workers=2, tag="echo")
    yield cluster
    await cluster.stop()


async def test_non_streamed_completion_returns_text_and_usage(echo_cluster):
    async with httpx.AsyncClient(base_url=echo_cluster.url, timeout=CLIENT_TIMEOUT_S) as client:
        r = await client.post("/v1/completions", json={"model": "demo-tiny", "prompt": [11, 12, 13],
                                                        "max_tokens": 5})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["model"] == "demo-tiny"
    assert body["choices"][0]["text"] == "<11><12><13><11><12>"  # the echo engine cycles the prompt
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8,
                             "prompt_tokens_details": {"cached_tokens": 0}}  # the echo engine caches nothing


async def test_streamed_chat_arrives_as_sse_chunks_then_done(echo_cluster):
    chunks = []
    async with httpx.AsyncClient(base_url=echo_cluster.url, timeout=CLIENT_TIMEOUT_S) as client:
        async with client.stream("POST", "/v1/chat/completions", json={
                "model": "demo-small", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                "stream": True, "stream_options": {"include_usage": True}}) as r:
            assert r.status_code == 200, (await r.aread()).decode()
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    chunks.append(line[6:])
    assert chunks[-1] == "[DONE]"
    events = [json.loads(c) for c in chunks[:-1]]
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    assert text.count("<") == 4
    finals = [e for e in events if e["choices"] and e["choices"][0]["finish_reason"]]
    assert finals[0]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["usage"]["completion_tokens"] == 4


async def test_models_are_listed(echo_cluster):
    async with httpx.AsyncClient(base_url=echo_cluster.url, timeout=CLIENT_TIMEOUT_S) as client:
        r = await client.get("/v1/models")
    assert {m["id"] for m in r.json()["data"]} == {"demo-tiny", "demo-small"}


@pytest.mark.parametrize("body,status,code,param", [
    ({"model": "nope", "prompt": "x", "max_tokens": 1}, 404, "unknown_model", "model"),
    ({"prompt": "x", "max_tokens": 1}, 400, "invalid_request", "model"),
    ({"model": "demo-tiny", "prompt": "x", "max_tokens": "many"}, 400, "invalid_request", "max_tokens"),
    ({"model": "demo-tiny", "prompt": "x", "max_tokens": 0}, 400, "invalid_request", "max_tokens"),
    ({"model": "demo-tiny", "prompt": "x", "max_tokens": 10**7}, 400, "context_length_exceeded", "max_tokens"),
    ({"model": "demo-tiny", "messages": []}, 400, "invalid_request", "messages"),
])
async def test_bad_input_gets_an_openai_error_and_never_reaches_the_dispatcher(echo_cluster, body, status, code,
                                                                               param):
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    before = echo_cluster.dispatcher.num_received
    async with httpx.AsyncClient(base_url=echo_cluster.url, timeout=CLIENT_TIMEOUT_S) as client:
        r = await client.post(path, json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["param"] == param and err["message"]
    assert echo_cluster.dispatcher.num_received == before


async def test_malformed_json_and_oversized_bodies(echo_cluster):
    before = echo_cluster.dispatcher.num_received
    async with httpx.AsyncClient(base_url=echo_cluster.url, timeout=CLIENT_TIMEOUT_S) as client:
        r = await client.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
        big = {"model": "demo-tiny", "prompt": "x" * (2 << 20), "max_tokens": 1}
        r = await client.post("/v1/completions", json=big)
        assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
    assert echo_cluster.dispatcher.num_received == before


async def test_one_request_is_one_trace_across_gateway_dispatcher_and_worker(echo_cluster, span_exporter):
    span_exporter.clear()
    async with httpx.AsyncClient(base_url=echo_cluster.url, timeout=CLIENT_TIMEOUT_S) as client:
        r = await client.post("/v1/completions", json={"model": "demo-tiny", "prompt": [7], "max_tokens": 2})
    assert r.status_code == 200
    spans = span_exporter.get_finished_spans()
    gateway = [s for s in spans if s.name == "gateway completions"]
    assert len(gateway) == 1
    trace_id = gateway[0].context.trace_id
    names = {s.name for s in spans if s.context.trace_id == trace_id}
    assert {"gateway completions", "dispatcher janus.req.demo-tiny", "dispatcher assign",
            "worker generate"} <= names, names


async def test_gateway_and_dispatcher_metrics_are_scraped_with_plausible_values(echo_cluster):
    async with httpx.AsyncClient(base_url=echo_cluster.url, timeout=CLIENT_TIMEOUT_S) as client:
        for _ in range(3):
            r = await client.post("/v1/completions", json={"model": "demo-tiny", "prompt": [9, 8], "max_tokens": 3})
            assert r.status_code == 200
        gw = (await client.get("/metrics")).text
    assert sum(samples(gw, "janus_gateway_requests_total", model="demo-tiny", status="ok")) >= 3
    ttft_count = sum(samples(gw, "janus_gateway_ttft_seconds_count", model="demo-tiny"))
    assert ttft_count >= 3
    ttft_sum = sum(samples(gw, "janus_gateway_ttft_seconds_sum", model="demo-tiny"))
    assert 0 < ttft_sum / ttft_count < 5.0  # seconds: a plausible mean TTFT for the echo engine
    assert sum(samples(gw, "janus_gateway_output_tokens_total", model="demo-tiny")) >= 9
    await _streamed_request_moves_the_vllm_style_series(echo_cluster, gw)

    async def dispatcher_queue_depth() -> str | None:  # the gauge follows the load windows it publishes every 0.5 s
        text = await scrape(echo_cluster.dispatcher.metrics_url)
        return text if samples(text, "janus_dispatcher_queue_depth", model="demo-tiny") else None

    disp = await wait_for(dispatcher_queue_depth, timeout_s=10, what="the dispatcher's queue-depth gauge")
    assert sum(samples(disp, "janus_dispatcher_assignments_total", model="demo-tiny")) >= 3
    assert samples(disp, "janus_dispatcher_queue_depth", model="demo-tiny") == [0.0]  # all answered
    waits = sum(samples(disp, "janus_dispatcher_request_queue_time_seconds_count", model="demo-tiny"))
    assert waits >= 4  # one per assignment: the 3 requests above and the streamed one
    assert 0 <= sum(samples(disp, "janus_dispatcher_request_queue_time_seconds_sum", model="demo-tiny")) / waits < 5.0


async def _streamed_request_moves_the_vllm_style_series(cluster, before: str) -> None:
    """Prompt tokens as the usage counts them, one more end-to-end latency, a gap between each two token chunks."""
    def total(text: str, name: str) -> float:
        return sum(samples(text, name, model="demo-tiny"))

    texts, usage = [], None
    async with httpx.AsyncClient(base_url=cluster.url, timeout=CLIENT_TIMEOUT_S) as client:
        async with client.stream("POST", "/v1/completions", json={
                "model": "demo-tiny", "prompt": [9, 8, 7], "max_tokens": 4,
                "stream": True, "stream_options": {"include_usage": True}}) as r:
            assert r.status_code == 200, (await r.aread()).decode()
            async for line in r.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    event = json.loads(line[6:])
                    usage = event.get("usage") or usage
                    texts += [c["text"] for c in event["choices"] if c["text"]]  # one per token chunk: "<n>"
    e2e = "janus_gateway_e2e_request_latency_seconds_count"

    async def recorded() -> str | None:  # the request is recorded as its stream closes, maybe after [DONE] went out
        text = await scrape(f"{cluster.url}/metrics")
        return text if total(text, e2e) > total(before, e2e) else None

    after = await wait_for(recorded, timeout_s=10, what="the streamed request's end-to-end latency")
    assert usage is not None and usage["prompt_tokens"] == 3 and len(texts) >= 2
    assert total(after, "janus_gateway_prompt_tokens_total") - total(before, "janus_gateway_prompt_tokens_total") \
        == usage["prompt_tokens"]
    assert total(after, "janus_gateway_output_tokens_total") - total(before, "janus_gateway_output_tokens_total") \
        == usage["completion_tokens"]
    assert total(after, e2e) - total(before, e2e) == 1
    itl = "janus_gateway_inter_token_latency_seconds_count"
    assert total(after, itl) - total(before, itl) == len(texts) - 1
    e2e_s = "janus_gateway_e2e_request_latency_seconds_sum"
    assert 0 < (total(after, e2e_s) - total(before, e2e_s)) < CLIENT_TIMEOUT_S


async def test_worker_metrics_show_pages_transitions_and_batches(echo_cluster):
    worker = echo_cluster.services["echo-worker-0"]
    async with httpx.AsyncClient(base_url=echo_cluster.url, timeout=CLIENT_TIMEOUT_S) as client:
        for _ in range(2):
            r = await client.post("/v1/completions", json={"model": "demo-small", "prompt": [3, 4], "max_tokens": 2})
            assert r.status_code == 200
    me = {"worker": "echo-worker-0"}

    async def idle_again() -> str | None:  # the gauges follow heartbeats: one sent after the requests ended
        text = await scrape(worker.metrics_url)
        return text if samples(text, "janus_worker_running_requests", model="demo-small", **me) == [0.0] else None

    text = await wait_for(idle_again, timeout_s=10, what="echo-worker-0's running-requests gauge back at 0")
    # the echo engine holds no pages: the whole pool is free
    assert samples(text, "janus_worker_pages", kind="free", **me) == [float(worker.pages.num_pages)]
    assert sum(samples(text, "janus_worker_lifecycle_transitions_total", to_state="active", **me)) == 2
    assert sum(samples(text, "janus_worker_lifecycle_transition_seconds_count", to_state="active", **me)) == 2
    assert samples(text, "janus_worker_running_requests", model="demo-small", **me) == [0.0]

"""schemathesis against the gateway's own OpenAPI document: generated bodies, valid and not, never make the gateway
fail (no 5xx), every error is an OpenAI-style body, and the gateway keeps serving afterwards."""
from __future__ import annotations

import asyncio

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from .faults import cluster_config, start

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def echo_gateway(tmp_path_factory, demo_models_dir):
    config = cluster_config(demo_models_dir, workers={"count": 1, "engine": "echo"},
                            gateway={"max_request_bytes": 65536})
    cluster = asyncio.run(start(tmp_path_factory.mktemp("fuzz"), config))
    yield cluster.gateway_url
    cluster.stop()


def _operations(url: str):
    doc = httpx.get(f"{url}/openapi.json").json()
    return doc, schemathesis.openapi.from_dict(doc)


def test_generated_requests_never_break_the_gateway(echo_gateway):
    doc, schema = _operations(echo_gateway)
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models"} <= set(doc["paths"])
    seen_statuses: set[int] = set()
    for op in schema.get_all_operations():
        operation = op.ok()

        @settings(max_examples=40, deadline=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy())
        def check(case):
            response = case.call(base_url=echo_gateway, timeout=60)
            seen_statuses.add(response.status_code)
            assert response.status_code < 500, (case.body, response.text[:500])
            if response.status_code >= 400:
                err = response.json()["error"]
                assert err["message"] and err["type"] and err["code"]

        check()
    assert 200 in seen_statuses and any(400 <= s < 500 for s in seen_statuses)
    # and it still serves
    r = httpx.post(f"{echo_gateway}/v1/completions", json={"model": "demo-tiny", "prompt": [1, 2], "max_tokens": 2})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2

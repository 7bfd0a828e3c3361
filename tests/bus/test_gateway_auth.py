"""API keys map to tenants, per-tenant limits answer 429, and no key ever reaches the logs."""
from __future__ import annotations

import asyncio
import logging

import httpx
import pytest

from .cluster import start_cluster, wait_for

KEY_A = "sk-tenant-a-7f3e9c1d"
KEY_B = "sk-tenant-b-0a8b2c4e"


@pytest.fixture(scope="module")
async def keyed_cluster(nats_url, demo_models_dir):
    config = {
        "models": [{"name": "demo-tiny", "path": str(demo_models_dir / "demo-tiny"), "ttft_slo_ms": 5000}],
        "workers": {"engine": "echo"},
        "gateway": {"api_keys": {KEY_A: "a", KEY_B: "b"},
                    "tenants": {"a": {"rate_rps": 1, "burst": 2}, "b": {"max_concurrency": 1}}},
    }
    cluster = await start_cluster(nats_url, config, demo_models_dir, tag="auth")
    yield cluster
    await cluster.stop()


BODY = {"model": "demo-tiny", "prompt": [3, 4], "max_tokens": 2}


async def test_keys_are_required_and_checked(keyed_cluster, caplog):
    caplog.set_level(logging.DEBUG)
    async with httpx.AsyncClient(base_url=keyed_cluster.url) as client:
        r = await client.post("/v1/completions", json=BODY)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        r = await client.post("/v1/completions", json=BODY, headers={"Authorization": "Bearer sk-wrong-123456"})
        assert r.status_code == 401
        r = await client.post("/v1/completions", json=BODY, headers={"Authorization": f"Bearer {KEY_B}"})
        assert r.status_code == 200
    for secret in (KEY_A, KEY_B, "sk-wrong-123456"):
        assert secret not in caplog.text


async def test_rate_limit_per_tenant(keyed_cluster):
    async with httpx.AsyncClient(base_url=keyed_cluster.url) as client:
        codes = [(await client.post("/v1/completions", json=BODY,
                                    headers={"Authorization": f"Bearer {KEY_A}"})).status_code for _ in range(4)]
    assert codes[:2] == [200, 200] and 429 in codes[2:]


async def test_concurrency_limit_per_tenant(keyed_cluster):
    async with httpx.AsyncClient(base_url=keyed_cluster.url, timeout=30) as client:
        # the echo engine streams 2000 tokens in ~0.1 s, so one stream may end before a second request arrives:
        # eight sent at once overlap for sure (each takes NATS round trips), and the limit of one refuses the rest
        long = {"model": "demo-tiny", "prompt": [3, 4], "max_tokens": 2000}
        codes = [r.status_code for r in await asyncio.gather(*(
            client.post("/v1/completions", json=long, headers={"Authorization": f"Bearer {KEY_B}"})
            for _ in range(8)))]
        assert 200 in codes and 429 in codes and set(codes) == {200, 429}, codes
        limiter = keyed_cluster.gateway.limiter
        await wait_for(lambda: limiter.in_flight("b") == 0, timeout_s=10, what="tenant b's requests all ended")
        third = await client.post("/v1/completions", json=BODY, headers={"Authorization": f"Bearer {KEY_B}"})
        assert third.status_code == 200

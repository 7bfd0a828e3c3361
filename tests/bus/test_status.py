"""`janus status --json` and the gateway's status page against a running cluster (the page in headless Chromium,
its screenshot kept under artifacts/)."""
from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from .cluster import start_cluster, wait_for

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"


@pytest.fixture(scope="module")
async def status_cluster(nats_url, demo_models_dir):
    config = {"models": [{"name": "demo-tiny", "path": str(demo_models_dir / "demo-tiny")},
                         {"name": "demo-small", "path": str(demo_models_dir / "demo-small")}],
              "workers": {"engine": "echo"}}
    cluster = await start_cluster(nats_url, config, demo_models_dir, num_workers=2, tag="status")
    async with httpx.AsyncClient(base_url=cluster.url) as client:
        for model in ("demo-tiny", "demo-small"):
            await client.post("/v1/completions", json={"model": model, "prompt": [4, 5], "max_tokens": 2})

    def described() -> bool:
        """The gateway's view (its status page) has both workers' heartbeats, their four instances ready and
        active, and a load window of each model."""
        snap = cluster.gateway.view.snapshot()
        ours = [i for i in snap["instances"] if i["worker_id"].startswith("status-")]
        models = {m["model"]: m for m in snap["models"]}
        return ({"status-worker-0", "status-worker-1"} <= {d["worker_id"] for d in snap["devices"]}
                and len(ours) == 4 and all(i["is_ready"] and i["state"] == "active" for i in ours)
                and all("queue_depth" in models.get(m, {}) for m in ("demo-tiny", "demo-small")))

    await wait_for(described, timeout_s=30, what="heartbeats of both workers and a load window of each model")
    yield cluster
    await cluster.stop()


async def test_janus_status_json_describes_the_running_cluster(status_cluster, nats_url):
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ops.cli", "status", "--json", "--nats", nats_url, "--wait-s", "1.5",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    snap = json.loads(out)
    workers = {d["worker_id"] for d in snap["devices"]}
    assert {"status-worker-0", "status-worker-1"} <= workers
    ours = [i for i in snap["instances"] if i["worker_id"].startswith("status-")]
    assert len(ours) == 4 and all(i["is_ready"] and i["state"] == "active" for i in ours)
    models = {m["model"]: m for m in snap["models"]}
    assert models["demo-tiny"]["replicas"]["steady"] >= 2 and "queue_depth" in models["demo-tiny"]


async def test_status_page_renders_in_headless_chromium(status_cluster):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Debian chromium is not installed (make test installs it when run as root)")
    async with httpx.AsyncClient(base_url=status_cluster.url) as client:
        snap = (await client.get("/status.json")).json()
    assert any(d["worker_id"] == "status-worker-0" for d in snap["devices"])
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "status-page.png"
    shot.unlink(missing_ok=True)
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--virtual-time-budget=5000", f"--user-data-dir={ARTIFACTS / 'chromium-profile'}"]
    url = f"{status_cluster.url}/status"
    dom = await asyncio.to_thread(subprocess.run, [chromium, *flags, "--dump-dom", url], capture_output=True,
                                  text=True, timeout=120)
    assert "status-worker-0" in dom.stdout and "instances ready" in dom.stdout, dom.stderr[-2000:]
    assert "demo-small" in dom.stdout
    await asyncio.to_thread(subprocess.run, [chromium, *flags, f"--screenshot={shot}", "--window-size=1280,1100",
                                             url], capture_output=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 10_000

"""A local cluster of real processes (the `janus up` launcher) for fault injection, and a load to put through it."""
from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import httpx

from ops.launcher import Cluster
from runtime.client import Outcome, stream_completion, summarise
from runtime.settings import ClusterConfig, JanusSettings


def cluster_config(models_dir: Path, **overrides) -> ClusterConfig:
    base = {
        "models": [{"name": "demo-tiny", "path": str(models_dir / "demo-tiny"), "ttft_slo_ms": 30000,
                    "tpot_slo_ms": 1000}],
        "workers": {"count": 2, "max_num_seqs": 8},
        "gateway": {"request_timeout_s": 120},
    }
    for key, value in overrides.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    return ClusterConfig.model_validate(base)


async def start(state_dir: Path, config: ClusterConfig, *, num_nats_nodes: int = 1) -> Cluster:
    settings = JanusSettings(state_dir=state_dir)
    cluster = Cluster(settings, config, config_path=None, gateway_port=0, num_nats_nodes=num_nats_nodes)
    try:
        await cluster.start(timeout_s=240)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def child(cluster: Cluster, instance: str):
    return next(c for c in cluster.children if c.instance == instance)


def kill9(cluster: Cluster, instance: str) -> None:
    os.kill(child(cluster, instance).proc.pid, signal.SIGKILL)
    child(cluster, instance).proc.wait()


LONG = {"model": "demo-tiny", "prompt": "Tell me a long story", "max_tokens": 300, "temperature": 0,
        "ignore_eos": True}


async def load(url: str, num_requests: int, body: dict = LONG, *, stagger_s: float = 0.0) -> list[Outcome]:
    async with httpx.AsyncClient(base_url=url, timeout=None) as client:
        async def one(i: int) -> Outcome:
            await asyncio.sleep(i * stagger_s)
            return await stream_completion(client, body, timeout_s=150)

        return list(await asyncio.gather(*(one(i) for i in range(num_requests))))


def report(name: str, outcomes: list[Outcome]) -> dict:
    summary = summarise(outcomes)
    print(f"\n[{name}] sent {summary['sent']}, completed {summary['completed']}, failed with a reason "
          f"{summary['failed']} {summary['failure_codes']}, lost {summary['lost']}")
    for message in sorted({o.message for o in outcomes if o.status != "completed"})[:5]:
        print(f"    {message}")
    return summary

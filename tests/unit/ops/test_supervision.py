"""The launcher's supervising loop on real (tiny) child processes: a crash loop is restarted with back-off, then
given up on loudly, and `supervise` returns why (`janus up` then stops everything and exits with EXIT_GAVE_UP)."""
from __future__ import annotations

import asyncio
import logging
import sys

from ops.launcher import Child, Cluster
from runtime.restart_budget import RestartBudget, RestartPolicy
from runtime.settings import ClusterConfig, JanusSettings

POLICY = RestartPolicy(max_num_restarts=2, refill_period_s=60.0, first_backoff_s=0.05, max_backoff_s=0.1)


def _cluster(tmp_path, *children_code: str) -> Cluster:
    cluster = Cluster(JanusSettings(state_dir=tmp_path), ClusterConfig(), config_path=None, restart_policy=POLICY)
    cluster.children = [Child(service="worker", instance=f"worker-{i}", args=[sys.executable, "-c", code],
                              budget=RestartBudget(POLICY)) for i, code in enumerate(children_code)]
    for child in cluster.children:
        cluster.spawn(child)
    return cluster


async def test_a_crash_loop_is_restarted_then_given_up_on_loudly(tmp_path, caplog):
    cluster = _cluster(tmp_path, "import sys; print('bad config'); sys.exit(2)", "import time; time.sleep(60)")
    try:
        with caplog.at_level(logging.WARNING, logger="janus.up"):
            gave_up = await asyncio.wait_for(cluster.supervise(asyncio.Event(), period_s=0.02), 30)
        crashing, healthy = cluster.children
        assert gave_up is not None and gave_up.startswith("worker-0: 2 restarts")
        assert crashing.num_restarts == 2 and crashing.gave_up and healthy.gave_up is None
        restarts = [r for r in caplog.records if "restarting in" in r.getMessage()]
        assert len(restarts) == 2 and all(r.levelno == logging.WARNING for r in restarts)
        (error,) = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert "GIVING UP on worker-0" in error.getMessage() and "bad config" in error.getMessage()  # its log tail
    finally:
        cluster.stop(timeout_s=5)


async def test_a_stopped_loop_returns_none_and_stop_restarts_nothing(tmp_path):
    cluster = _cluster(tmp_path, "import time; time.sleep(60)")
    stop = asyncio.Event()
    task = asyncio.create_task(cluster.supervise(stop, period_s=0.02))
    await asyncio.sleep(0.1)
    stop.set()
    assert await task is None
    cluster.stop(timeout_s=5)
    assert cluster.notice_exits(0.0) == [] and cluster.children[0].num_restarts == 0

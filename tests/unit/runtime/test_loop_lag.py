"""The event-loop lag monitor (runtime/loop_lag.py): a loop blocked for a while shows as that much lag, in the
monitor, in its Prometheus series and as a warning line."""
from __future__ import annotations

import asyncio
import logging
import time

from runtime.loop_lag import LOOP_LAG_S, LoopLagMonitor


def _count(service: str) -> float:
    return next(s.value for m in LOOP_LAG_S.collect() for s in m.samples
                if s.name.endswith("_count") and s.labels.get("service") == service)


async def test_a_blocked_loop_is_measured_and_reported(caplog):
    monitor = LoopLagMonitor("lag-test", interval_s=0.02, warn_after_s=0.2)
    task = asyncio.create_task(monitor.run())
    try:
        await asyncio.sleep(0.2)  # free: many samples
        free_samples = _count("lag-test")
        assert free_samples >= 3
        with caplog.at_level(logging.WARNING, logger="janus.loop"):
            time.sleep(0.35)  # a call that does not yield: the monitor's timer is due meanwhile
            await asyncio.sleep(0.1)
        assert monitor.max_lag_s >= 0.3 and monitor.num_stalls >= 1
        assert _count("lag-test") > free_samples
        assert any("event loop blocked for" in r.getMessage() for r in caplog.records)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_services_health_reply_says_how_late_its_loop_ran():
    from runtime.service import Service
    from runtime.settings import ClusterConfig, JanusSettings

    class Idle(Service):
        name = "idle"

        async def start(self, bus) -> None:
            pass

    service = Idle(JanusSettings(instance="idle-0"), ClusterConfig())
    service.loop_lag = LoopLagMonitor("idle", interval_s=0.02, warn_after_s=0.2)
    task = asyncio.create_task(service.loop_lag.run())
    try:
        await asyncio.sleep(0.05)
        time.sleep(0.3)
        await asyncio.sleep(0.05)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    detail = service.health().detail
    assert int(detail["loop_max_lag_ms"]) >= 250 and int(detail["loop_stalls"]) >= 1

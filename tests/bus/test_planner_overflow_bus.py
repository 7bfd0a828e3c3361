"""Through a real nats-server: the steady planner service plans early when a steady model's requests queue at the
dispatchers, long before its period. Stand-ins as in test_planner_bus.py: the table oracle on the oracle subjects
and scripted worker heartbeats."""
from __future__ import annotations

import asyncio
import time

import pytest

from runtime.service import run_service
from runtime.settings import ClusterConfig, JanusSettings
from tests.bus.planner_bus_helpers import beat_and_load, serve_oracle
from tests.polling import wait_for
from tests.unit.planner.planner_test_oracles import TableOracle, window
from tests.unit.planner.planner_test_workers import ScriptedWorkers

pytestmark = pytest.mark.slow

WORKERS = ["ow0", "ow1"]


async def test_a_queueing_steady_model_gets_an_early_plan(nats_url, bus_factory, tmp_path):
    from planner.steady_service import SteadyPlannerService

    bus = await bus_factory("overflow-test")
    await serve_oracle(bus, TableOracle(needs={"calm": (0.2, 0.2, 0.2)}))
    workers = ScriptedWorkers(WORKERS)
    queue_depth = {"calm": 0}

    def windows(now: float) -> dict:
        return {model: window(model, 0.5, now, window_s=2.0).model_copy(update={"queue_depth": depth})
                for model, depth in queue_depth.items()}

    planner = {"steady": {"period_s": 600.0, "overflow_num_windows": 3, "overflow_min_interval_s": 60.0},
               "startup_delay_s": 0.3}
    cluster = ClusterConfig.model_validate({"models": [{"name": "calm"}], "planner": planner})
    steady = SteadyPlannerService(JanusSettings(nats_url=nats_url, instance="t-steady", state_dir=tmp_path), cluster)
    tasks = [asyncio.create_task(beat_and_load(bus, workers, WORKERS, windows, 0.1)),
             asyncio.create_task(run_service(steady, install_signals=False))]

    def windows_seen_or_a_plan(num_windows: int, num_plans: int):
        """The planner took in `num_windows` load windows since its last plan (`_windows`, handed to the core at the
        next plan), or it planned again: what a check that no early plan came waits for. A window triggers an early
        plan as it arrives, so once the planner has seen enough windows to trigger one, none coming is the answer;
        polled rather than a fixed sleep, so a loaded machine delivering windows late cannot pass the check early."""
        return lambda: len(steady._windows) >= num_windows or steady.num_plans > num_plans

    try:
        await wait_for(lambda: steady.last_plan is not None, timeout_s=30, what="the startup plan")
        assert steady.last_plan.trigger == "startup" and steady.last_plan.steady_models == ("calm",)
        # ten windows without a queue (three queued in a row would trigger)
        await wait_for(windows_seen_or_a_plan(10, 1), timeout_s=30, what="ten load windows after the startup plan")
        assert steady.num_plans == 1 and steady.num_overflow_plans == 0, "no queue, no early plan"

        queue_depth["calm"] = 4
        started = time.monotonic()
        await wait_for(lambda: steady.last_plan.trigger == "overflow", timeout_s=30, what="an overflow plan")
        assert time.monotonic() - started < 10.0  # not the 600 s period
        assert steady.num_overflow_plans == 1 and steady.health_detail()["overflow_plans"] == "1"
        # the plan is made: six more windows, all queued, come after it (three in a row would trigger again)
        await wait_for(windows_seen_or_a_plan(len(steady._windows) + 6, 2), timeout_s=30,
                       what="six queued load windows after the overflow plan")
        assert steady.overflow.overflowing(["calm"]) == ["calm"], "the model queues on"
        assert steady.num_plans == 2 and steady.num_overflow_plans == 1, \
            "the next early plan waits overflow_min_interval_s"
    finally:
        steady.stopped.set()
        tasks[0].cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

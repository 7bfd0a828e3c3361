"""The oracle as the planner cores see it (a sync `OracleLike`), answered by the oracle service over the bus.

The cores are synchronous and call the oracle in the middle of a decision (the elastic scaler's binary search asks
several rounds). The shells therefore run a core's decision in a worker thread (`asyncio.to_thread`); this client
hands each question to the event loop and waits for the reply there, so the loop keeps serving meanwhile."""
from __future__ import annotations

import asyncio

from contracts import CapacityQuery, CapacityReply, ElasticityQuery, ElasticityReply, subjects
from runtime.bus import Bus


class BusOracle:
    def __init__(self, bus: Bus, loop: asyncio.AbstractEventLoop, timeout_s: float = 2.0) -> None:
        self.bus = bus
        self.loop = loop
        self.timeout_s = timeout_s
        self.num_calls = 0

    def _call(self, subject: str, query, reply_type):
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:  # it would wait on itself forever
            raise RuntimeError("BusOracle blocks: call it from a worker thread (asyncio.to_thread)")
        self.num_calls += 1
        future = asyncio.run_coroutine_threadsafe(
            self.bus.request(subject, query, reply_type, timeout_s=self.timeout_s), self.loop)
        return future.result(timeout=self.timeout_s + 1.0)

    def capacity(self, query: CapacityQuery) -> CapacityReply:
        return self._call(subjects.ORACLE_CAPACITY, query, CapacityReply)

    def elasticity(self, query: ElasticityQuery) -> ElasticityReply:
        return self._call(subjects.ORACLE_ELASTICITY, query, ElasticityReply)

"""Waiting in a test for something to happen: poll a condition until it holds, with a deadline, instead of sleeping a
fixed time and asserting after. The test goes on as soon as the condition holds (no time lost on a quiet machine),
waits longer when the machine is loaded (no flake), and fails naming what it waited for."""
from __future__ import annotations

import asyncio
import inspect
import time


async def wait_for(predicate, *, what: str, timeout_s: float = 90.0, tasks=(), interval_s: float = 0.05):
    """Poll `predicate` until it returns something truthy, and return that. What it returns may be awaitable (an
    async check: a scrape, a request), then it is awaited. Past `timeout_s`, TimeoutError naming `what`. A task of
    `tasks` (a service's) that ended meanwhile is surfaced at once, instead of waiting out the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        for task in tasks:
            if task.done():
                task.result()  # its exception, if it failed
                raise RuntimeError(f"a service stopped while waiting for {what}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:g} s")
        await asyncio.sleep(interval_s)

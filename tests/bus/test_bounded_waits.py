"""Waits of the service runtime end: a first connection NATS never answers, a stop asked for while connecting, a
service whose stop() hangs, and a test's wait for its services to stop each end in time with a clear message
naming what was waited for."""
from __future__ import annotations

import asyncio
import socket
import time

import pytest

from runtime.bus import Bus
from runtime.service import Service, cancel_and_wait, run_service
from runtime.settings import ClusterConfig, JanusSettings
from tests.bus.cluster import stop_services, wait_until


def _dead_url() -> str:
    with socket.socket() as s:  # a port nobody listens on (free a moment ago)
        s.bind(("127.0.0.1", 0))
        return f"nats://127.0.0.1:{s.getsockname()[1]}"


class Stuck(Service):
    """Starts, then never finishes stopping."""

    name = "stuck"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.is_started = False

    async def start(self, bus) -> None:
        self.is_started = True

    async def stop(self) -> None:
        await asyncio.Event().wait()


def _settings(url: str, instance: str) -> JanusSettings:
    return JanusSettings(nats_url=url, instance=instance, metrics_port=None)


async def test_a_first_connection_nats_never_answers_fails_naming_the_server():
    url = _dead_url()
    started = time.monotonic()
    with pytest.raises(ConnectionError, match=f"no connection to NATS at {url} within 1 s"):
        await Bus.connect(url, "probe", connect_timeout_s=0.2, first_connect_timeout_s=1.0)
    assert time.monotonic() - started < 5.0


async def test_a_service_asked_to_stop_while_connecting_stops():
    svc = Stuck(_settings(_dead_url(), "stuck-connecting"), ClusterConfig())
    task = asyncio.create_task(run_service(svc, install_signals=False))
    await asyncio.sleep(0.5)  # connecting, again and again
    svc.stopped.set()
    assert await asyncio.wait_for(task, 5.0) is None
    assert not svc.is_started and svc.bus is None


async def test_a_stop_that_hangs_is_abandoned_naming_where_it_waited(nats_url):
    svc = Stuck(_settings(nats_url, "stuck-1"), ClusterConfig())
    svc.stop_timeout_s = 0.5
    task = asyncio.create_task(run_service(svc, install_signals=False))
    await wait_until(lambda: svc.is_started, timeout_s=10, tasks=[task])
    svc.stopped.set()
    with pytest.raises(TimeoutError, match=r"stuck stuck-1: stop\(\) did not finish within 0.5 s") as err:
        await asyncio.wait_for(task, 10.0)
    assert "in Stuck.stop" in str(err.value)
    assert svc.bus.nc.is_closed  # the connection is closed anyway


async def test_stop_services_names_the_service_that_does_not_stop(nats_url):
    svc = Stuck(_settings(nats_url, "stuck-2"), ClusterConfig())
    task = asyncio.create_task(run_service(svc, install_signals=False))
    await wait_until(lambda: svc.is_started, timeout_s=10, tasks=[task])
    with pytest.raises(TimeoutError, match=r"1 of 1 service task\(s\) did not stop within 0.5 s") as err:
        await stop_services({"stuck": svc}, [task], timeout_s=0.5)
    assert "- stuck stuck-2:" in str(err.value) and "in Stuck.stop" in str(err.value)
    assert task.done() and svc.bus.nc.is_closed  # cancelled, and its connection closed on the way out


async def test_cancel_and_wait_ends_a_loop_whose_cancellation_nats_drops(bus_factory):
    """A periodic loop publishing to JetStream, stopped as the planners stop theirs. On Python 3.11 a single
    `task.cancel()` is lost in about one stop in ten here (nats-py's request returns a reply that arrived in the same
    loop turn: asyncio.wait_for drops the cancellation), and `await task` then waits forever."""
    from nats.js.api import StreamConfig

    bus = await bus_factory("cancel-test")
    await bus.js.add_stream(StreamConfig(name="CANCEL_TEST", subjects=["cancel-test.>"]))

    async def periodic():
        while True:
            await bus.js.publish("cancel-test.x", b"x" * 200)
            await asyncio.sleep(0.001)

    try:
        for _ in range(30):
            task = asyncio.create_task(periodic())
            await asyncio.sleep(0.005)
            await cancel_and_wait(task, timeout_s=5.0)
            assert task.done()
    finally:
        await bus.js.delete_stream("CANCEL_TEST")


async def test_cancel_and_wait_names_a_task_that_will_not_end():
    release = asyncio.Event()

    async def stubborn():
        while not release.is_set():
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                pass

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0.05)  # running: a task cancelled before its first step just ends
    with pytest.raises(TimeoutError, match=r"the test: 1 task\(s\) still running 0.3 s after being cancelled: "
                                           r".*in test_cancel_and_wait_names_a_task_that_will_not_end\.<locals>"):
        await cancel_and_wait(task, timeout_s=0.3, what="the test")
    release.set()
    await asyncio.wait_for(task, 5.0)

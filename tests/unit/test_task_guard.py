"""tests/task_guard.py: a test that hangs, or leaves tasks, services or processes running, fails by itself, what it
left is stopped, and the modules after it run normally (no cascade of errors through the rest of the session).

Runs a small pytest session in a subprocess (pytester) with the guard installed as tests/conftest.py installs it."""
from __future__ import annotations

from pathlib import Path

pytest_plugins = ["pytester"]

REPO_ROOT = Path(__file__).resolve().parents[2]

CONFTEST = """
from tests.task_guard import (no_service_outlives_its_module, nothing_outlives_its_test, pytest_runtest_call,
                              pytest_runtest_setup)
"""

INI = """
[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = session
asyncio_default_test_loop_scope = session
timeout = 10
"""

# func_only: pytest-timeout counts the test function only, so a 3 s timeout is not spent on pytest's own reporting.
# 3 s, not 1: the guard's deadline comes a quarter of it early and cancels again a tenth of it later, which left
# 0.05 s before pytest-timeout at 1 s (on a loaded machine pytest-timeout came first); 0.45 s at 3 s.
HANGS = """
import asyncio, os, subprocess
import pytest

SERVICES = []  # held, as a test holds its service tasks (an unreferenced pending task may be garbage-collected)


async def run_service():  # named like runtime.service.run_service: a service that never stops
    await asyncio.Event().wait()


@pytest.mark.timeout(3, func_only=True)
async def test_hangs_with_a_service_and_a_process():
    SERVICES.append(asyncio.create_task(run_service()))
    proc = subprocess.Popen(["sleep", "60"])
    with open(os.environ["GUARD_PID_FILE"], "w") as f:
        f.write(str(proc.pid))
    never = asyncio.Event()
    await never.wait()


@pytest.mark.timeout(3, func_only=True)
async def test_hangs_in_its_finally_too():
    service = asyncio.create_task(run_service())
    try:
        await asyncio.Event().wait()
    finally:
        await service  # the CI hang: a finally waiting for a service that does not stop


@pytest.mark.timeout(3, func_only=True)
async def test_outlives_pytest_timeout():
    # swallows cancellation for 5 s: pytest-timeout stops it from outside (3 s), and its task is left pending
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    while True:
        try:
            await asyncio.sleep(0.5)
        except asyncio.CancelledError:
            if loop.time() - t0 > 5.0:
                raise


async def test_the_next_one_passes():  # on the same loop, right after three hung tests
    await asyncio.sleep(0.01)


async def test_leaks_a_task():
    asyncio.create_task(asyncio.sleep(3600))
"""

MODULE_LEAK = """
import asyncio
import pytest

HELD = []


async def leaked_forever():
    await asyncio.Event().wait()


@pytest.fixture(scope="module")
async def leaky():
    HELD.append(asyncio.create_task(leaked_forever()))
    yield  # and never stopped


async def test_uses_a_leaky_module_fixture(leaky):
    pass
"""

AFTER = """
import asyncio, os
import pytest


async def run_service():
    await asyncio.Event().wait()


@pytest.fixture(scope="module")
async def service():  # a module's service lives across its tests: not a leak of the test that started it
    task = asyncio.create_task(run_service())
    yield task
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_nothing_of_the_earlier_modules_is_running(service):
    assert not service.done()
    others = [t for t in asyncio.all_tasks() if t is not service and not t.done()
              and getattr(t.get_coro(), "__qualname__", "") in ("run_service", "leaked_forever")]
    assert not others
    pid = int(open(os.environ["GUARD_PID_FILE"]).read())
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split(") ")[-1][:1] == "Z"


async def test_a_module_service_survives_between_its_tests(service):
    await asyncio.sleep(0.01)
    assert not service.done()


def test_sync():
    pass
"""


def test_a_hung_or_leaky_test_fails_alone_and_later_modules_run_clean(pytester, monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    monkeypatch.setenv("GUARD_PID_FILE", str(tmp_path / "pid"))
    monkeypatch.setenv("COLUMNS", "400")  # whole lines in the short summary
    pytester.makeconftest(CONFTEST)
    pytester.makeini(INI)
    pytester.makepyfile(test_a_hangs=HANGS, test_b_module_leak=MODULE_LEAK, test_c_after=AFTER)
    unneeded = ("cacheprovider", "schemathesis", "hypothesispytest", "anyio")  # seconds of start-up
    result = pytester.runpytest_subprocess(*(a for p in unneeded for a in ("-p", f"no:{p}")), "-rfEp", "-q", timeout=90)

    result.stdout.fnmatch_lines_random([
        "PASSED test_a_hangs.py::test_the_next_one_passes",  # a hung test fails alone
        # the deadline cancels a hung test before pytest-timeout, naming where it and its tasks waited
        "FAILED test_a_hangs.py::test_hangs_with_a_service_and_a_process - Failed: the test did not finish within*",
        "FAILED test_a_hangs.py::test_hangs_in_its_finally_too - Failed: the test did not finish within*",
        "FAILED test_a_hangs.py::test_outlives_pytest_timeout - Failed: Timeout*",
        # what each left is reported on that test, and stopped
        "ERROR test_a_hangs.py::test_hangs_with_a_service_and_a_process - Failed: *left things running*",
        "ERROR test_a_hangs.py::test_outlives_pytest_timeout - Failed: *left things running*",
        "ERROR test_a_hangs.py::test_leaks_a_task - Failed: *left things running*",
        "ERROR test_b_module_leak.py::test_uses_a_leaky_module_fixture - Failed: test_b_module_leak left things*",
    ])
    result.stdout.fnmatch_lines_random([
        "*test_a_hangs.py:*in test_hangs_with_a_service_and_a_process: await never.wait()*",
        "*1 service task(s) still running:*",
        "*processes left running (killed): *sleep 60*",
        "*the test was still running, waiting at:*",
        "*test_a_hangs.py:*in test_outlives_pytest_timeout: await asyncio.sleep(0.5)*",
        "*1 task(s) left running:*",
    ])
    # the later module is untouched: its tests pass, its module-scoped service is not taken for a leak
    result.assert_outcomes(passed=6, failed=3, errors=4)

"""What a test starts ends with it: a test that hangs or leaves something running fails by itself, and what it left
is cleaned up, so the tests after it run as if it had not been there.

Every async test and fixture shares one event loop (the session's) and one nats-server. Without this, one hung test
leaves its services running on them: they answer the next modules' requests, and a check that looks at the whole
loop blames every later module for them.

- Ownership: every asyncio task is tagged, when it is created, with the test (or the module, for tasks created by
  module-scoped fixtures) in whose context it was created (a ContextVar read by the loop's task factory). Tasks of
  session-scoped fixtures belong to no one and are left alone; so are a module-scoped service's tasks during a test.
- A deadline: an async test is cancelled some seconds before pytest-timeout would stop it (timeout minus
  min(60 s, a quarter)), so its own `finally:` blocks stop what it started, and it fails with the await chain it was
  stuck in and those of its other unfinished tasks. pytest-timeout stays the backstop; its traceback only shows the
  loop idling in select(), which is why the deadline comes first.
- After each test (and each module), what it owns is reaped: the test's own task when it is still running (it hung
  past pytest-timeout), then its service tasks (`run_service`) get a moment to stop, then every remaining task is
  cancelled, NATS connections it left open are closed, and child processes it started are killed. Anything found
  fails that test (an error at teardown) with what it was and where it waited; the next test starts clean.
"""
from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import os
import signal
import time
import weakref
from pathlib import Path

import pytest

SERVICE_CORO = "run_service"  # runtime.service.run_service: a service left running answers others' requests
DEADLINE_MARGIN_S = 60.0  # an async test is cancelled this long (at most a quarter of its timeout) before the timeout
RECANCEL_S = 5.0  # a test whose clean-up hangs after the deadline is cancelled again this often


class Owner:
    """A test or a module; the tasks created in its context are its."""

    def __init__(self, label: str, timeout_s: float | None) -> None:
        self.label = label
        self.timeout_s = timeout_s or None
        self.main: asyncio.Task | None = None  # the test's own task (set by the deadline wrapper)

    def grace_s(self, most_s: float) -> float:
        """How long a clean-up step waits: `most_s`, less for a test with a short timeout."""
        return most_s if self.timeout_s is None else max(0.2, min(most_s, 0.1 * self.timeout_s))


_OWNER: contextvars.ContextVar[Owner | None] = contextvars.ContextVar("janus_test_owner", default=None)
_TASK_OWNERS: "weakref.WeakKeyDictionary[asyncio.Task, Owner]" = weakref.WeakKeyDictionary()


def _owned_task_factory(loop, coro, *, context=None):
    task = asyncio.Task(coro, loop=loop, context=context)
    owner = context.get(_OWNER) if context is not None else _OWNER.get()
    if owner is not None:
        _TASK_OWNERS[task] = owner
    return task


def _install_task_factory() -> None:
    loop = asyncio.get_running_loop()
    if loop.get_task_factory() is not _owned_task_factory:
        assert loop.get_task_factory() is None, "another task factory is installed on the test loop"
        loop.set_task_factory(_owned_task_factory)


def _timeout_settings(item) -> tuple[float | None, bool]:
    """pytest-timeout's timeout for the item (None: none), and whether it counts the test function only."""
    try:
        from pytest_timeout import _get_item_settings

        settings = _get_item_settings(item)
        return settings.timeout or None, bool(settings.func_only)
    except Exception:  # noqa: BLE001 - pytest-timeout absent or changed: no deadline
        return None, False


def _timeout_s(item) -> float | None:
    return _timeout_settings(item)[0]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item._janus_started = time.monotonic()  # pytest-timeout's clock starts about now (it counts set-up too)


# --- where a task waits ---
def await_chain(task: asyncio.Task) -> str:
    """The task's coroutine and each coroutine it awaits, innermost last, and what the innermost waits on."""
    lines = []
    obj = task.get_coro()
    for _ in range(40):
        frame = getattr(obj, "cr_frame", None) or getattr(obj, "gi_frame", None) or getattr(obj, "ag_frame", None)
        if frame is None:
            break
        code = frame.f_code
        if code.co_qualname != _DEADLINE_WRAPPER:  # the deadline's own frame says nothing
            try:
                line = inspect.getframeinfo(frame, context=1).code_context[0].strip()
            except Exception:  # noqa: BLE001 - no source
                line = ""
            lines.append(f"  {code.co_filename}:{frame.f_lineno} in {code.co_qualname}: {line}")
        obj = getattr(obj, "cr_await", None) or getattr(obj, "gi_yieldfrom", None) or getattr(obj, "ag_await", None)
    waiter = getattr(task, "_fut_waiter", None)
    if waiter is not None:
        lines.append(f"  waiting on {_short_repr(waiter)}")
    return "\n".join(lines) or f"  {task!r}"


def _short_repr(obj, limit: int = 300) -> str:
    text = repr(obj)
    return text if len(text) <= limit else text[:limit] + "..."


def _coro_name(task: asyncio.Task) -> str:
    return getattr(task.get_coro(), "__qualname__", "") or ""


def _describe(tasks) -> str:
    return "\n".join(f"- task {_coro_name(t) or t.get_name()}:\n{await_chain(t)}" for t in tasks)


# --- an async test's deadline ---
def _with_deadline(fn, limit_s: float, timeout_s: float):
    recancel_s = min(RECANCEL_S, max(0.2, 0.1 * timeout_s))

    @functools.wraps(fn)
    async def run_with_deadline(*args, **kwargs):
        task = asyncio.current_task()
        owner = _OWNER.get()
        if owner is not None:
            owner.main = task
        loop = asyncio.get_running_loop()
        expired: list[str] = []
        handles: list[asyncio.TimerHandle] = []

        def expire() -> None:
            if task.done():
                return
            if not expired:
                others = [t for t in asyncio.all_tasks(loop)
                          if t is not task and not t.done() and owner is not None and _TASK_OWNERS.get(t) is owner]
                expired.append(f"it was waiting at:\n{await_chain(task)}" +
                               (f"\nits other unfinished tasks:\n{_describe(others)}" if others else ""))
            task.cancel(f"the test's deadline ({limit_s:.1f} s) passed")
            handles.append(loop.call_later(recancel_s, expire))  # its clean-up may hang too

        handles.append(loop.call_later(limit_s, expire))
        try:
            result = await fn(*args, **kwargs)
        except asyncio.CancelledError:
            if not expired:
                raise
            pytest.fail(f"the test did not finish within {limit_s:.1f} s (pytest-timeout: {timeout_s:g} s) and was "
                        f"cancelled; {expired[0]}", pytrace=False)
        finally:
            for handle in handles:
                handle.cancel()
        if expired:  # the test swallowed the cancellation
            pytest.fail(f"the test did not finish within {limit_s:.1f} s; {expired[0]}", pytrace=False)
        return result

    return run_with_deadline


_DEADLINE_WRAPPER = "_with_deadline.<locals>.run_with_deadline"


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_call(item):
    """Give an async test its deadline: pytest-asyncio runs `item.obj`, so it runs the bounded one."""
    fn = getattr(item, "obj", None)
    target = getattr(item, "_synchronization_target_attr", None)  # pytest-asyncio's test items only
    timeout_s, func_only = _timeout_settings(item)
    if not (timeout_s and inspect.iscoroutinefunction(fn) and target and target[0] is item and target[1] == "obj"):
        return (yield)
    started = getattr(item, "_janus_started", None)
    spent = 0.0 if func_only or started is None else time.monotonic() - started
    limit_s = max(0.1, timeout_s - min(DEADLINE_MARGIN_S, 0.25 * timeout_s) - spent)
    item.obj = _with_deadline(fn, limit_s, timeout_s)
    try:
        return (yield)
    finally:
        item.obj = fn


# --- reaping what an owner left ---
def live_children() -> set[int]:
    """Processes this test session started that are still running (zombies and nats-server excluded)."""
    pid = os.getpid()
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in children:
            try:
                if Path(f"/proc/{child}/stat").read_text().split(") ")[-1][:1] == "Z":
                    continue
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if "nats-server" not in cmdline:
                out.add(int(child))
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return "?"


async def _kill(pids: set[int], grace_s: float) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while pids & live_children() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    for pid in pids & live_children():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _nats_client_of(task: asyncio.Task):
    """The nats-py connection a task works for (its read loop, flusher, a subscription's callbacks), if any."""
    from nats.aio.client import Client

    frame = getattr(task.get_coro(), "cr_frame", None)
    this = frame.f_locals.get("self") if frame is not None else None
    for candidate in (this, getattr(this, "_conn", None), getattr(this, "_nc", None)):
        if isinstance(candidate, Client):
            return candidate
    return None


async def _wait_for_owned(left, timeout_s: float) -> None:
    """Wait up to `timeout_s` for the tasks `left()` names to finish, those that appear meanwhile included: an async
    generator a test dropped unfinished is closed, when the collector finds it, by a task the loop creates then
    (`async_generator_athrow`), which needs its turn like the others."""
    deadline = time.monotonic() + timeout_s
    while (tasks := left()) and (remaining := deadline - time.monotonic()) > 0:
        done, _ = await asyncio.wait(tasks, timeout=remaining)
        if not done:
            break


async def reap(owner: Owner, children_before: set[int]) -> list[str]:
    """Stop what `owner` left running; returns what it was (empty: nothing)."""
    me = asyncio.current_task()

    def left() -> list[asyncio.Task]:
        return [t for t in asyncio.all_tasks() if t is not me and not t.done() and _TASK_OWNERS.get(t) is owner]

    problems: list[str] = []
    for _ in range(3):  # tasks cancelled as the test ended (a closed connection's loops) finish in a turn or two
        if not left():
            break
        await asyncio.sleep(0)
    tasks = left()
    if tasks:
        main = owner.main if owner.main is not None and not owner.main.done() else None
        if main is not None:  # hung past pytest-timeout: its finally blocks stop what it started
            problems.append(f"the test was still running, waiting at:\n{await_chain(main)}")
            main.cancel("reaped: the test outlived its timeout")
            await asyncio.wait([main], timeout=owner.grace_s(15.0))
        services = [t for t in left() if _coro_name(t) == SERVICE_CORO]
        # a service stops gracefully when asked, a request in flight ends at its timeout: give them a moment
        await _wait_for_owned(left, owner.grace_s(5.0 if services else 3.0))
        services = [t for t in services if not t.done()]
        if services:
            problems.append(f"{len(services)} service task(s) still running:\n{_describe(services)}")
        tasks = left()
        clients = {id(c): c for c in map(_nats_client_of, tasks) if c is not None and not c.is_closed}
        others = [t for t in tasks if _nats_client_of(t) is None]
        if others and not problems:
            problems.append(f"{len(others)} task(s) left running:\n{_describe(others)}")
        for t in others:
            t.cancel("reaped: left running by a finished test")
        for client in clients.values():  # closed, not just stopped: the server would keep its subscriptions
            try:
                await asyncio.wait_for(client.close(), owner.grace_s(5.0))
            except Exception:  # noqa: BLE001 - it is going anyway
                pass
        if clients:
            problems.append(f"{len(clients)} NATS connection(s) left open: "
                            + ", ".join(str(c.options.get("name") or "?") for c in clients.values()))
        tasks = left()
        for t in tasks:
            t.cancel("reaped: left running by a finished test")
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=owner.grace_s(5.0))
            if pending:
                problems.append(f"{len(pending)} task(s) ignore cancellation:\n{_describe(pending)}")
    stray = live_children() - children_before - {os.getpid()}
    deadline = time.monotonic() + owner.grace_s(3.0)
    while stray and time.monotonic() < deadline:  # one that was just told to stop may be exiting
        await asyncio.sleep(0.05)
        stray &= live_children()
    if stray:
        problems.append("processes left running (killed): " + "; ".join(f"{p}: {_cmdline(p)}" for p in sorted(stray)))
        await _kill(stray, owner.grace_s(5.0))
    return problems


async def _guard(label: str, node):
    """Own what is created in this context; on the way out, reap it and fail `label` if anything was left."""
    _install_task_factory()
    owner = Owner(label, _timeout_s(node))
    _OWNER.set(owner)  # pytest-asyncio carries this into the context of what the test or module runs
    children_before = live_children()
    yield
    problems = await reap(owner, children_before)
    if problems:
        pytest.fail(f"{label} left things running (now stopped):\n" + "\n".join(problems), pytrace=False)


@pytest.fixture(scope="module", autouse=True)
async def no_service_outlives_its_module(request):
    """Module-scoped fixtures' tasks and processes end with the module (their tests have their own guard)."""
    async for _ in _guard(request.module.__name__, request.node):
        yield


@pytest.fixture(autouse=True)
async def nothing_outlives_its_test(request):
    """A test's tasks, NATS connections and processes end with it: if not, it fails, and they are stopped."""
    async for _ in _guard(request.node.nodeid, request.node):
        yield

"""How the operator's tools (`janus status`, `janus audit`) reach NATS: where the URL and the login come from, and a
first connection that gives up in seconds with one line saying what was tried and how to fix it.

Services wait a minute for NATS (runtime/bus.py: FIRST_CONNECT_TIMEOUT_S: they start before it in a container
platform); a person at a terminal should not. docs/operations.md, "Watching it".
"""
from __future__ import annotations

import logging
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from .bus import Bus, is_login_refusal
from .security import operator_login
from .settings import JanusSettings

# A tool tries the first connection this long (each attempt at most TOOL_ATTEMPT_TIMEOUT_S), then says why it gave up.
TOOL_FIRST_CONNECT_S = 4.0
TOOL_ATTEMPT_TIMEOUT_S = 1.5
# Past this, whatever nats-py is still doing, the process prints its line and exits: the promise is "within 10 s"
# of the command's start, and interpreter start and imports take a second or two of it on a loaded host.
TOOL_HARD_LIMIT_S = 7.0
EXIT_NO_NATS = 1


class ToolConnectError(Exception):
    """No connection to NATS; `str()` is one line: what was tried, from where, and how to fix it."""


@dataclass(frozen=True)
class NatsTarget:
    url: str
    source: str  # where the URL came from, as the failure line names it
    user: str | None
    password: str | None
    login_source: str


def settings_for(state_dir: str | Path | None = None, nats_url: str | None = None) -> JanusSettings:
    overrides: dict = {}
    if state_dir:
        overrides["state_dir"] = Path(state_dir)
    if nats_url:
        overrides["nats_url"] = nats_url
    return JanusSettings(**overrides)


def nats_target(settings: JanusSettings, explicit_url: str | None) -> NatsTarget:
    """--nats, else $JANUS_NATS_URL, else the URL a local `janus up` left in its state directory, else the default;
    the login: $JANUS_NATS_USER / _PASSWORD, else the operator of the state directory's credentials.json."""
    state_file = Path(settings.state_dir) / "nats.url"
    if explicit_url:
        url, source = explicit_url, "--nats"
    elif "JANUS_NATS_URL" in os.environ:
        url, source = os.environ["JANUS_NATS_URL"], "$JANUS_NATS_URL"
    elif state_file.exists():
        url, source = state_file.read_text().strip(), f"{state_file}, written by `janus up`"
    else:
        url, source = settings.nats_url, f"the default; no {state_file}"
    user, password = operator_login(settings)
    if settings.nats_user:
        login = "$JANUS_NATS_USER"
    elif user:
        login = str(Path(settings.state_dir) / "credentials.json")
    else:
        login = "no login"
    return NatsTarget(url, source, user, password, login)


def failure_line(target: NatsTarget, error: object) -> str:
    text = " ".join(str(error).split())
    if is_login_refusal(text):
        return (f"NATS at {target.url} (from {target.source}) refused the login ({target.login_source}): {text}; "
                "set JANUS_NATS_USER / JANUS_NATS_PASSWORD, or pass --state-dir of the `janus up` that runs it")
    return (f"no NATS at {target.url} (from {target.source}) within {TOOL_FIRST_CONNECT_S:g} s: {text}; start one "
            "with `janus up` (it writes <state-dir>/nats.url), pass --state-dir of the one running, or --nats URL "
            "(or set JANUS_NATS_URL)")


async def connect_tool(tool: str, target: NatsTarget) -> Bus:
    """The first connection, given up on after TOOL_FIRST_CONNECT_S (and, as a last resort, the whole process after
    TOOL_HARD_LIMIT_S). Raises ToolConnectError with `failure_line`."""
    watchdog = threading.Timer(TOOL_HARD_LIMIT_S, _give_up_now, (tool, target))
    watchdog.daemon = True
    watchdog.start()
    try:
        return await Bus.connect(target.url, tool, user=target.user, password=target.password,
                                 connect_timeout_s=TOOL_ATTEMPT_TIMEOUT_S,
                                 first_connect_timeout_s=TOOL_FIRST_CONNECT_S)
    except (ConnectionError, OSError, ValueError) as exc:
        raise ToolConnectError(failure_line(target, _last_error(exc))) from None
    finally:
        watchdog.cancel()


def _last_error(exc: Exception) -> str:
    """Bus.connect's message names the URL already; keep only its last error (an attempt that timed out has none)."""
    text = str(exc)
    marker = "(last error: "
    if marker in text:
        text = text[text.index(marker) + len(marker):]
        text = text[:-1] if text.endswith(")") else text
    return text.strip() or f"no answer within {TOOL_ATTEMPT_TIMEOUT_S:g} s per attempt"


def quiet_connection_warnings() -> None:
    """A tool's process says what went wrong in its one line: not each failed attempt as a warning on stderr."""
    logging.getLogger("janus.bus").setLevel(logging.ERROR)


def _give_up_now(tool: str, target: NatsTarget) -> None:
    print(f"janus {tool}: {failure_line(target, 'the connection attempt did not end')}", file=sys.stderr, flush=True)
    os._exit(EXIT_NO_NATS)

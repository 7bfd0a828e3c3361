"""`janus status` and `janus audit` as a person runs them: NATS and its login found in the state directory a
`janus up` wrote, and a NATS that is not there is one line and a non-zero exit within 10 s, never a hang
(runtime/tools.py). Each runs the real CLI as a subprocess against a real nats-server with users."""
from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
from pathlib import Path

import pytest

from contracts import PlanStatus, subjects
from planner.shell import ensure_plans_stream, publish_event
from runtime.bus import Bus
from runtime.nats_server import EmbeddedNats
from runtime.security import load_or_create_credentials, write_nats_config, write_private

REPO = Path(__file__).resolve().parents[2]
PROMISED_S = 10.0  # issue 28: a tool that cannot reach NATS says so within 10 s


def _env() -> dict[str, str]:
    """No NATS URL, login or state dir from the environment: what the tool finds is what the state dir says."""
    drop = {"JANUS_NATS_URL", "JANUS_NATS_USER", "JANUS_NATS_PASSWORD", "JANUS_STATE_DIR"}
    return {k: v for k, v in os.environ.items() if k not in drop}


async def _janus(*args: str, timeout_s: float = 60.0) -> tuple[int, str, str, float]:
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "ops.cli", *args, cwd=REPO, env=_env(),
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"janus {' '.join(args)} still running after {timeout_s} s") from None
    return proc.returncode, out.decode(), err.decode(), time.monotonic() - started


def _closed_port() -> int:
    with socket.socket() as sock:  # bound and closed again: nothing listens there
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def up_state_dir(tmp_path):
    """What `janus up` leaves for the tools: nats.url and credentials.json, for a nats-server with its users."""
    state = tmp_path / "state"
    state.mkdir()
    creds = load_or_create_credentials(state / "credentials.json")
    conf = write_nats_config(state / "nats.conf", creds)
    nats = EmbeddedNats(state / "nats", extra_args=["-c", str(conf)]).start()
    (state / "nats.url").write_text(nats.url)
    yield state, nats, creds
    nats.stop()


def _assert_one_line_within_promise(rc: int, err: str, elapsed_s: float, *needles: str) -> str:
    assert rc != 0
    assert elapsed_s < PROMISED_S, f"took {elapsed_s:.1f} s"
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("tool", [["status"], ["audit", "--all"]])
async def test_a_bad_nats_url_is_one_line_and_an_exit_within_10_s(tool):
    url = f"nats://127.0.0.1:{_closed_port()}"
    rc, out, err, elapsed_s = await _janus(*tool, "--nats", url)
    line = _assert_one_line_within_promise(rc, err, elapsed_s, f"janus {tool[0]}: no NATS at {url} (from --nats)",
                                           "janus up", "--nats URL")
    assert out == "", out
    assert "Connect call failed" in line  # the last error, as nats-py saw it


async def test_an_unroutable_address_gives_up_within_10_s_too():
    """Each attempt waits for a SYN that is never answered (no refusal): bounded per attempt and in all."""
    url = "nats://10.255.255.1:4222"
    rc, _, err, elapsed_s = await _janus("status", "--nats", url)
    _assert_one_line_within_promise(rc, err, elapsed_s, f"no NATS at {url}")


async def test_a_stale_state_dir_names_the_file_it_read(tmp_path):
    state = tmp_path / "stale"
    state.mkdir()
    url = f"nats://127.0.0.1:{_closed_port()}"
    (state / "nats.url").write_text(url)  # a `janus up` that has stopped since
    rc, _, err, elapsed_s = await _janus("audit", "--state-dir", str(state))
    _assert_one_line_within_promise(rc, err, elapsed_s, f"no NATS at {url}", str(state / "nats.url"))


async def test_janus_audit_finds_nats_and_the_operator_login_in_the_state_dir(up_state_dir):
    state, nats, creds = up_state_dir
    bus = await Bus.connect(nats.url, "reconciler", user="reconciler", password=creds["reconciler"])
    try:
        await ensure_plans_stream(bus, 3600.0)
        for i in range(3):
            await publish_event(bus, subjects.PLAN_STATUS,
                                PlanStatus(plan_id=f"tool-{i}", kind="elastic", status="done", unix_ms=float(i)))
    finally:
        await bus.close()
    rc, out, err, _ = await _janus("audit", "--all", "--json", "--state-dir", str(state))
    assert rc == 0, err
    plan_ids = [json.loads(line)["event"]["plan_id"] for line in out.strip().splitlines()]
    assert plan_ids == ["tool-0", "tool-1", "tool-2"]

    rc, out, err, _ = await _janus("audit", "--verify", "--state-dir", str(state))
    assert rc == 0 and "intact: 3 event(s)" in out, out + err


async def test_janus_status_finds_nats_in_the_state_dir(up_state_dir):
    state, _, _ = up_state_dir
    rc, out, err, _ = await _janus("status", "--json", "--wait-s", "0.2", "--state-dir", str(state))
    assert rc == 0, err
    snap = json.loads(out)
    assert snap["devices"] == [] and snap["instances"] == []  # a server with no cluster on it: nothing, no error
    assert snap["leaders"] == []  # no planner has campaigned: no lease bucket


async def test_janus_status_names_the_leading_copy_of_each_planner(up_state_dir):
    """Two copies of the elastic scaler campaign with their own NATS user; `janus status` (the operator login) reads
    the leases bucket and names the one that leads."""
    from planner.leader import Leadership

    state, nats, creds = up_state_dir
    campaigns = []
    for n in range(2):
        bus = await Bus.connect(nats.url, "elastic-scaler", user="elastic-scaler", password=creds["elastic-scaler"])
        campaigns.append(Leadership(bus, "elastic-scaler", f"scaler-{n}"))
        await campaigns[-1].start()
    try:
        deadline = time.monotonic() + 10
        while sum(c.is_leader() for c in campaigns) != 1:
            assert time.monotonic() < deadline, "no copy took the lease"
            await asyncio.sleep(0.05)
        (leader,) = [c for c in campaigns if c.is_leader()]
        rc, out, err, _ = await _janus("status", "--json", "--wait-s", "0.2", "--state-dir", str(state))
        assert rc == 0, err
        assert json.loads(out)["leaders"] == [{"role": "elastic-scaler", "holder": leader.holder}]
        rc, out, err, _ = await _janus("status", "--wait-s", "0.2", "--state-dir", str(state))
        assert rc == 0 and f"leaders: elastic-scaler {leader.holder}" in out, out + err
    finally:
        for c in campaigns:
            await c.stop()
            await c.bus.close()


async def test_a_wrong_password_is_one_line_naming_the_login(up_state_dir):
    state, _, creds = up_state_dir
    write_private(state / "credentials.json", json.dumps({**creds, "operator": "not-the-password"}))
    rc, _, err, elapsed_s = await _janus("status", "--state-dir", str(state))
    _assert_one_line_within_promise(rc, err, elapsed_s, "refused the login", str(state / "credentials.json"))

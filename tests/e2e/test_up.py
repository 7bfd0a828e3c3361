"""`janus up` (what `make up` runs) serves the official openai client: every service a separate OS process."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

pytestmark = pytest.mark.slow


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="ignore")
            state = Path(f"/proc/{pid}/stat").read_text().split()[2]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append(int(pid))
    return found


@pytest.fixture(scope="module")
def janus_up(tmp_path_factory):
    state = tmp_path_factory.mktemp("up-state")
    janus = Path(sys.executable).parent / "janus"
    # --no-profile: the first start would otherwise profile both demo models for minutes (the oracle's training
    # sets); this test is about serving
    proc = subprocess.Popen([str(janus), "up", "--port", "0", "--state-dir", str(state), "--no-profile"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url, lines = None, []
    deadline = time.monotonic() + 300
    while url is None and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "gateway at " in line:
            url = line.split("gateway at ", 1)[1].split()[0]
    assert url, "janus up did not print its gateway URL:\n" + "".join(lines)
    yield url, proc, state
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        proc.wait(90)


def test_openai_client_streams_a_chat_and_gets_a_completion(janus_up):
    url, _, _ = janus_up
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=120)
    assert {m.id for m in client.models.list()} == {"demo-tiny", "demo-small"}

    stream = client.chat.completions.create(model="demo-tiny", messages=[{"role": "user", "content": "Hello!"}],
                                            max_tokens=8, temperature=0, stream=True,
                                            extra_body={"ignore_eos": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(chunks) >= 3 and text
    assert chunks[-1].choices[0].finish_reason == "length"

    done = client.completions.create(model="demo-small", prompt="The quick brown fox", max_tokens=5, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert done.choices[0].finish_reason == "length" and done.choices[0].text
    assert done.usage.completion_tokens == 5 and done.usage.prompt_tokens > 0

    again = client.completions.create(model="demo-small", prompt="The quick brown fox", max_tokens=5, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert again.choices[0].text == done.choices[0].text  # greedy is deterministic across requests and workers


def test_bad_requests_get_openai_errors(janus_up):
    url, _, _ = janus_up
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="demo-tiny", prompt="x", max_tokens=0)
    assert "max_tokens" in str(err.value)


def test_janus_trace_shows_a_requests_spans_from_gateway_dispatcher_and_worker(janus_up):
    """The trace id of the response header, given to `janus trace`, shows the request's spans from the three
    services (the file exporter `janus up` turns on); a caller's own traceparent is continued."""
    url, _, state = janus_up
    body = {"model": "demo-tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
            "temperature": 0, "ignore_eos": True}
    answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    trace_id = answer.headers["x-janus-trace-id"]
    assert len(trace_id) == 32 and int(trace_id, 16) != 0

    janus = Path(sys.executable).parent / "janus"
    deadline, out = time.monotonic() + 30, None
    wanted = {"janus-gateway", "janus-dispatcher", "janus-worker"}
    while time.monotonic() < deadline:  # each process writes its spans every 0.3 s, from its own thread
        out = subprocess.run([str(janus), "trace", trace_id, "--state-dir", str(state), "--width", "120"],
                             capture_output=True, text=True, timeout=60)
        if out.returncode == 0 and "worker generate" in out.stdout and \
                all(f" {service} " in out.stdout for service in wanted):
            break
        time.sleep(0.5)
    assert out is not None and out.returncode == 0, out.stderr if out else "janus trace never ran"
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"trace {trace_id}: ")
    for service in wanted:
        assert any(f" {service} " in line for line in lines[2:]), f"no span of {service}:\n{out.stdout}"
    assert any("POST /v1/chat/completions" in line for line in lines[2:])
    assert any("dispatcher assign" in line for line in lines[2:])
    assert any("worker generate" in line for line in lines[2:])
    assert all(len(line) <= 120 for line in lines[1:])
    # the request's server span (FastAPI's own, or the gateway's on an older FastAPI) is the root, at 0 ms
    assert "POST /v1/chat/completions" in lines[2] and not lines[2].startswith(" ")
    assert lines[2].split("|")[0].split()[-2] == "0.0"

    # a caller's traceparent: the gateway continues that trace and says so
    caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    again = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120,
                       headers={"traceparent": f"00-{caller_trace}-00f067aa0ba902b7-01"})
    assert again.status_code == 200 and again.headers["x-janus-trace-id"] == caller_trace

    # the gateway's refusals are traced too
    bad = httpx.post(f"{url}/v1/chat/completions", json={**body, "max_tokens": 0}, timeout=60)
    assert bad.status_code == 400 and len(bad.headers["x-janus-trace-id"]) == 32


def test_ctrl_c_stops_everything_and_leaves_no_process(janus_up):
    _, proc, state = janus_up
    assert _processes_mentioning(str(state)), "services should be running"
    proc.send_signal(signal.SIGINT)
    assert proc.wait(90) == 0
    deadline = time.monotonic() + 10
    while _processes_mentioning(str(state)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_mentioning(str(state)) == []

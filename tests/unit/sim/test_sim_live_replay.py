"""`janus replay`: client-side token times to the simulator's report; and one short replay against `janus up`."""
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from sim.trace_client import ClientRecord, error_code_of, main, outcomes_from_records, parse_sse_line, tokens_in_chunk
from sim.trace import Trace

from .shared_data import needs_traces


def test_sse_lines_and_token_counts():
    chunk = {"choices": [{"index": 0, "text": "ab", "logprobs": {"tokens": ["", ""], "token_logprobs": [-1.0, -2.0]},
                          "finish_reason": None}]}
    assert parse_sse_line("data: " + json.dumps(chunk)) == chunk
    assert tokens_in_chunk(chunk) == 2
    assert tokens_in_chunk({"choices": [{"text": "x", "logprobs": None}]}) == 1
    assert tokens_in_chunk({"choices": [], "usage": {"completion_tokens": 3}}) == 0
    assert parse_sse_line("data: [DONE]") is None and parse_sse_line(": keep-alive") is None


def test_error_bodies_give_their_code():
    assert error_code_of({"error": {"message": "busy", "type": "server_error", "code": "overloaded"}}) == "overloaded"
    assert error_code_of({"error": "plain text"}) == ""
    assert error_code_of({"choices": []}) == "" and error_code_of(["not", "a", "dict"]) == ""


def test_client_times_become_the_same_outcomes_as_the_simulator():
    trace = Trace.build([0.0, 1.0, 2.0], [0, 0, 0], [5, 5, 5], [3, 3, 2], ("m",))
    records = [ClientRecord([0.5, 0.6, 0.7]),  # all on time (TTFT 1 s, TPOT 0.1 s)
               ClientRecord([2.5, 2.55, 2.9]),  # first late (1.5 s > 1 s); 2nd due 2.1 late; 3rd due 2.2 late
               ClientRecord([2.1], is_failed=True)]  # broke off: failed
    out = outcomes_from_records(trace, records, 1.0, 0.1)
    assert list(out.num_on_time_tokens) == [3, 0, 0]
    assert np.isnan(out.first_token_s[2]) and out.finish_s[0] == 0.7


def _wait_until_every_model_answers(url: str, timeout_s: float = 180.0) -> None:
    """`janus up` prints its URL once the services run; a model may still be loading. The replay measures the
    served stack, so wait until each listed model completes one token (a loaded box can take a while)."""
    import httpx

    headers = {"Authorization": "Bearer unused"}
    models = [m["id"] for m in httpx.get(url + "/v1/models", headers=headers, timeout=30).json()["data"]]
    deadline = time.monotonic() + timeout_s
    for model in models:
        while True:
            resp = httpx.post(url + "/v1/completions", json={"model": model, "prompt": [11, 12], "max_tokens": 1}, headers=headers,
                              timeout=60)
            if resp.status_code == 200:
                break
            assert time.monotonic() < deadline, f"{model} never answered: {resp.status_code} {resp.text[:200]}"
            time.sleep(1.0)


@pytest.mark.slow
@needs_traces
def test_replay_against_janus_up(tmp_path):
    janus = Path(sys.executable).parent / "janus"
    # The replay scores with generous SLOs; the stack must plan with them too, or a loaded CI box (a demo-small
    # prefill of ~0.7 s, a few queued) makes the dispatcher reject for the default 2 s TTFT SLO.
    config = tmp_path / "cluster.yaml"
    config.write_text("models:\n"
                      "  - {name: demo-tiny, demo: demo-tiny, ttft_slo_ms: 60000, tpot_slo_ms: 10000}\n"
                      "  - {name: demo-small, demo: demo-small, ttft_slo_ms: 60000, tpot_slo_ms: 10000}\n")
    proc = subprocess.Popen([str(janus), "up", "--port", "0", "--state-dir", str(tmp_path / "state"),
                             "--config", str(config), "--no-profile"],  # no minutes of first-start profiling
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url, deadline = None, time.monotonic() + 300
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if "gateway at " in line:
                url = line.split("gateway at ", 1)[1].split()[0]
        assert url, "janus up did not start"
        _wait_until_every_model_answers(url)
        out = tmp_path / "report"
        code = main(["--gateway", url, "--trace", "arena", "--max-requests", "12", "--compression", "20",
                     "--max-input-tokens", "32", "--max-output-tokens", "8", "--ttft-slo-ms", "60000",
                     "--tpot-slo-ms", "10000", "--out", str(out)])
        assert code == 0
        summary = json.loads((out / "summary.json").read_text())["systems"][0]
        # generous SLOs on a live demo stack: every request answered, every token on time
        assert summary["num_failed"] == 0
        assert summary["token_attainment"] == 1.0
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(90)

"""bench/clients.py: reading guidellm's and aiperf's exports (samples trimmed from a real run against `janus up`),
and a client that hangs is killed at its timeout and reported as failed."""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from bench.clients import Outcome, read_aiperf, read_guidellm, report, run_client, write_summary
from bench.common import run_bounded

DATA = Path(__file__).parent / "data"
NO_GATEWAY = "http://127.0.0.1:9/metrics"  # nothing listens: the run goes on without the server's view


def test_reads_guidellm_report():
    figures = read_guidellm(DATA / "guidellm.json")
    assert (figures.completed, figures.errored, figures.incomplete) == (GUIDELLM_COMPLETED, 0, 0)
    assert 0 < figures.ttft_p50_ms <= figures.ttft_p90_ms
    assert figures.itl_p50_ms > 0 and figures.output_tokens_per_s > 0


def test_reads_aiperf_exports():
    figures = read_aiperf(DATA / "aiperf")
    assert (figures.completed, figures.errored) == (AIPERF_COMPLETED, 0)
    assert 0 < figures.ttft_p50_ms <= figures.ttft_p90_ms
    assert figures.itl_p50_ms > 0 and figures.output_tokens_per_s > 0


def test_aiperf_failures_count_as_errored(tmp_path):
    out = tmp_path / "aiperf"
    out.mkdir()
    (out / "profile_export_aiperf.json").write_text((DATA / "aiperf" / "profile_export_aiperf.json").read_text())
    records = [line for line in (DATA / "aiperf" / "profile_export.jsonl").read_text().splitlines() if line.strip()]
    failed = json.loads(records[0]) | {"error": {"code": 503, "type": "Service Unavailable", "message": "overloaded"}}
    (out / "profile_export.jsonl").write_text("\n".join([json.dumps(failed)] + records[1:]) + "\n")
    figures = read_aiperf(out)
    assert (figures.completed, figures.errored) == (AIPERF_COMPLETED - 1, 1)


def test_a_hung_client_is_killed_at_its_timeout_and_reported(tmp_path):
    start = time.monotonic()
    outcome = run_client("sleeper", ["sleep", "60"], "0", 1.0, tmp_path, lambda: read_guidellm(tmp_path / "none"),
                         NO_GATEWAY)
    assert time.monotonic() - start < 15
    assert outcome.ran.timed_out and outcome.failed and outcome.figures is None
    assert outcome.problem == "timed out after 1 s"
    args = argparse.Namespace(model="demo-tiny", gateway="http://x", rate=1.0, duration_s=1, prompt_tokens=1,
                              output_tokens=1, out=tmp_path)
    assert "timed out after 1 s" in report([outcome], args)
    summary = json.loads(write_summary([outcome], args).read_text())
    assert summary["runs"][0]["failed"] and summary["runs"][0]["ran"]["timed_out"]


def test_the_timeout_kills_the_whole_process_group(tmp_path):
    """aiperf and guidellm spawn workers: those must not outlive a run that timed out."""
    pid_file = tmp_path / "child.pid"
    ran = run_bounded(["sh", "-c", f"sleep 60 & echo $! > {pid_file}; wait"], 1.0, tmp_path / "log")
    assert ran.timed_out and not ran.ok and ran.returncode is None
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(child)


def test_a_run_that_exits_non_zero_fails(tmp_path):
    outcome = run_client("false", ["false"], "0", 10.0, tmp_path, lambda: read_guidellm(DATA / "guidellm.json"),
                         NO_GATEWAY)
    assert isinstance(outcome, Outcome) and outcome.failed and outcome.problem == "exited with 1"
    assert outcome.figures is not None  # what the export says is still read


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for its new parent to reap it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


GUIDELLM_COMPLETED = 60  # the samples' counts: a 30 s run at 2 req/s, and its first 12 aiperf records
AIPERF_COMPLETED = 12

"""Per-process settings of a worker (worker/shell/process_env.py): torch's thread count and Mooncake's log level, the
latter checked on the real library in a fresh process (it reads its level once, when it loads)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from worker.shell.process_env import configure_worker_process, quiet_mooncake_logs, torch_threads_for


def test_torch_threads_default_to_one_on_a_cpu_and_follow_the_environment():
    assert torch_threads_for("cpu", {}) == 1
    assert torch_threads_for("cuda:0", {}) is None  # torch's own default feeds an accelerator
    assert torch_threads_for("cuda:1", {"JANUS_TORCH_THREADS": "4"}) == 4
    assert torch_threads_for("cpu", {"JANUS_TORCH_THREADS": " 3 "}) == 3
    for bad in ("0", "-2", "many", "1.5"):
        with pytest.raises(ValueError, match="JANUS_TORCH_THREADS"):
            torch_threads_for("cpu", {"JANUS_TORCH_THREADS": bad})


def test_configure_applies_the_thread_count_and_keeps_an_operators_log_settings():
    previous = torch.get_num_threads()
    try:
        env = {"JANUS_TORCH_THREADS": "2", "MC_LOG_LEVEL": "ERROR"}
        setup = configure_worker_process("cpu", "INFO", environ=env)
        assert setup.num_torch_threads == 2 and torch.get_num_threads() == 2
        assert setup.mooncake_log_level == "ERROR" and env["MC_LOG_LEVEL"] == "ERROR"
        untouched = configure_worker_process("cpu", "INFO", uses_torch=False, environ={"JANUS_TORCH_THREADS": "3"})
        assert untouched.num_torch_threads is None and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(previous)
    env: dict[str, str] = {}
    assert quiet_mooncake_logs("DEBUG", env) == "INFO" and env == {"MC_LOG_LEVEL": "INFO", "GLOG_minloglevel": "0"}


_START_TRANSFER = """
from worker.dataplane.transfer import MooncakeTransfer
t = MooncakeTransfer.start()
print("session", t.session)
t.close()
"""


def _transfer_engine_log(janus_log_level: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("MC_LOG_LEVEL", "GLOG_minloglevel")}
    env["JANUS_LOG_LEVEL"] = janus_log_level
    done = subprocess.run([sys.executable, "-c", _START_TRANSFER], env=env, capture_output=True, text=True,
                          timeout=60, cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
                              os.path.abspath(__file__))))))
    assert done.returncode == 0 and "session" in done.stdout, done.stderr[-2000:]
    return done.stderr


def test_mooncake_logs_only_warnings_unless_the_worker_logs_at_debug():
    quiet = _transfer_engine_log("INFO")
    assert not [line for line in quiet.splitlines() if line.startswith("I")], quiet  # no glog INFO line
    chatty = _transfer_engine_log("DEBUG")
    assert [line for line in chatty.splitlines() if line.startswith("I")]  # INFO lines come back at DEBUG

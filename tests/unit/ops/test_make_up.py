"""`make up PORT=...` hands the port to `janus up` (what the README says), next to CONFIG and UP_ARGS."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def _dry_run(*variables: str) -> str:
    """The commands `make up` would run (-n: none is run, setup included)."""
    return subprocess.run(["make", "-n", "up", *variables], cwd=REPO, capture_output=True, text=True, check=True,
                          timeout=60).stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_port_reaches_janus_up():
    janus_up = [line for line in _dry_run("PORT=8123", "CONFIG=c.yaml").splitlines() if " up " in f"{line} "]
    assert len(janus_up) == 1
    assert janus_up[0].split()[1:] == ["up", "--config", "c.yaml", "--port", "8123"]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_without_port_the_config_decides():
    janus_up = [line for line in _dry_run().splitlines() if " up " in f"{line} "]
    assert "--port" not in janus_up[0]

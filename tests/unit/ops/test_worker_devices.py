"""One device per worker: `workers.devices` (or `count` workers of a device kind, one each), what `janus up` gives
each worker (JANUS_DEVICE), `janus up --dry-run`, and two workers on one accelerator refused unless allowed
(docs/operations.md: Devices). No accelerator is needed: nothing opens a device here."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ops.effective import ConfigError, load_cluster
from ops.launcher import Cluster, worker_devices
from runtime.settings import DEVICE_ENV, JanusSettings, WorkersSpec

REPO = Path(__file__).resolve().parents[3]
EIGHT = [f"cuda:{i}" for i in range(8)]


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return path


def _up(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("JANUS_CONFIG", "JANUS_TRANSFER_HOST")}
    return subprocess.run([sys.executable, "-m", "ops.cli", "up", "--state-dir", str(tmp_path / "state"), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=120, env=env)


def _worker_rows(stdout: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split() for line in stdout.splitlines() if line.startswith("worker-")}


@pytest.mark.parametrize("workers", ["{devices: [%s]}" % ", ".join(EIGHT), "{count: 8, device: cuda}"])
def test_eight_workers_get_eight_devices_in_the_dry_run(tmp_path, workers):
    config = _write(tmp_path, f"workers: {workers}\n")
    done = _up(tmp_path, "--config", str(config), "--dry-run", "--port", "8123")
    assert done.returncode == 0, done.stderr
    rows = _worker_rows(done.stdout)
    assert sorted(rows) == sorted(f"worker-{i}" for i in range(8))
    assert {rows[f"worker-{i}"][2] for i in range(8)} == set(EIGHT)
    assert all(rows[f"worker-{i}"][2] == f"cuda:{i}" for i in range(8))
    assert " ".join(rows["worker-0"][3:]) == "transfer host 127.0.0.1"
    assert "http://127.0.0.1:8123" in done.stdout  # the gateway's address
    assert "nats-0" in done.stdout and "steady-planner-0" in done.stdout
    assert not (tmp_path / "state").exists()  # nothing started, nothing written


def test_the_launcher_gives_each_worker_its_own_device_in_its_environment(tmp_path):
    cluster = load_cluster(_write(tmp_path, "workers: {devices: [%s]}\n" % ", ".join(EIGHT)))
    local = Cluster(JanusSettings(state_dir=tmp_path / "state"), cluster, config_path=None)
    children = local.plan_children()
    envs = {c.instance: local.child_env(c) for c in children}
    workers = [c for c in children if c.service == "worker"]
    assert [envs[c.instance][DEVICE_ENV] for c in workers] == EIGHT
    assert all(DEVICE_ENV not in envs[c.instance] for c in children if c.service != "worker")
    # the rest of the command line is what `janus serve` expects, with the worker's id
    assert workers[3].args[workers[3].args.index("--id") + 1] == "worker-3"


def test_a_cpu_is_shared_and_an_indexed_device_kind_is_not(tmp_path):
    assert WorkersSpec(count=3).devices_for(3) == ["cpu"] * 3
    assert WorkersSpec(count=2, device="cuda").devices_for(4) == [f"cuda:{i}" for i in range(4)]
    assert WorkersSpec(count=2, device="cuda:1", share_devices=True).devices_for(2) == ["cuda:1", "cuda:1"]
    with pytest.raises(ConfigError, match="cuda:0 under workers 0 and 1"):
        load_cluster(_write(tmp_path, "workers: {count: 2, device: cuda:0}\n"))
    with pytest.raises(ConfigError, match=r"workers.devices: puts cuda:2 under workers 0 and 2.*share_devices"):
        load_cluster(_write(tmp_path, "workers: {devices: [cuda:2, cuda:1, cuda:2]}\n"))
    # `janus up --workers` cannot stretch a device list, nor put a second worker on one accelerator
    listed = load_cluster(_write(tmp_path, "workers: {devices: [cuda:0, cuda:1]}\n"))
    with pytest.raises(ConfigError, match="3 workers for the 2 devices"):
        worker_devices(listed, 3)
    one = load_cluster(_write(tmp_path, "workers: {device: cuda:0, count: 1}\n"))
    with pytest.raises(ConfigError, match="cuda:0 under workers 0 and 1"):
        worker_devices(one, 2)


@pytest.mark.parametrize("text, needle", [
    ("workers: {count: 2, device: cuda:0}\n", "workers.device: puts cuda:0 under workers 0 and 1"),
    ("workers: {count: 2, devices: [cuda:0, cuda:1, cuda:2]}\n", "workers.count: 2 workers for the 3 devices"),
    ("workers: {device: cpu, devices: [cuda:0]}\n", "workers.device: disagrees with workers.devices (cuda)"),
])
def test_a_device_mistake_is_one_line_naming_its_yaml_path(tmp_path, text, needle):
    done = _up(tmp_path, "--config", str(_write(tmp_path, text)), "--dry-run")
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and needle in done.stderr, done.stderr


def test_two_workers_on_one_accelerator_when_the_config_says_so(tmp_path):
    config = _write(tmp_path, "workers: {count: 2, device: cuda:0, share_devices: true}\n")
    done = _up(tmp_path, "--config", str(config), "--dry-run")
    assert done.returncode == 0, done.stderr
    assert [row[2] for row in _worker_rows(done.stdout).values()] == ["cuda:0", "cuda:0"]


def test_the_heartbeat_reports_the_device_the_worker_opened():
    from worker.shell.heartbeat import device_info
    from worker.xtensor import XTensor, XTensorConfig

    pages = XTensor.open("cpu", 8 << 20, XTensorConfig(page_size_bytes=2 << 20))
    try:
        info = device_info(pages)
    finally:
        pages.close()
    assert (info.kind, info.device, info.hbm_bytes) == ("cpu", "cpu", 8 << 20)


def test_a_joining_worker_is_named_by_its_machine_and_device_unless_told(monkeypatch):
    from ops.cli import build_parser, cmd_join, joining_worker_id

    assert joining_worker_id("cuda:3", "gpu1") == "gpu1-cuda3"
    assert joining_worker_id(None, "box") == "box-worker"
    served = []
    monkeypatch.setattr("ops.cli.cmd_serve", lambda args: served.append(args) or 0)
    monkeypatch.delenv(DEVICE_ENV, raising=False)
    args = build_parser().parse_args(["join", "--nats", "nats://10.0.0.1:4222,nats://10.0.0.2:4222",
                                      "--device", "cuda:1"])
    assert cmd_join(args) == 0
    (joined,) = served
    assert (joined.service, joined.nats, joined.device) == ("worker", "nats://10.0.0.1:4222,nats://10.0.0.2:4222",
                                                              "cuda:1")
    assert joined.id.endswith("-cuda1")
    with pytest.raises(SystemExit):  # the cluster's URLs are what joining means
        build_parser().parse_args(["join"])

"""docker-compose.yml is valid Compose and runs only real `janus serve` entry points (no Docker engine here)."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import yaml

from ops.cli import build_parser
from ops.services import SERVICES

REPO = Path(__file__).resolve().parents[2]


def _compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def test_compose_file_validates_against_the_compose_spec():
    schema = json.loads((REPO / "tests" / "data" / "compose-spec.json").read_text())
    jsonschema.validate(_compose(), schema)


def test_every_janus_command_is_a_real_entry_point():
    services = _compose()["services"]
    parser = build_parser()
    served = set()
    for name, svc in services.items():
        command = svc.get("command")
        if not command or command[0] != "janus":
            assert svc.get("image", "").startswith(("nats", "jaegertracing", "prom", "grafana")), name
            continue
        args = parser.parse_args(command[1:])  # raises SystemExit on an unknown command or flag
        if args.command == "serve":
            assert args.service in SERVICES, f"{name}: {args.service} is not a service"
            served.add(args.service)
    assert served == set(SERVICES), f"services without a container: {set(SERVICES) - served}"


def test_nats_has_jetstream_and_workers_scale():
    services = _compose()["services"]
    assert "-js" in services["nats"]["command"]
    assert services["worker"]["deploy"]["replicas"] >= 2
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "libibverbs1" in dockerfile and '".[cpu]"' in dockerfile
    assert (REPO / "deploy" / "cluster.docker.yaml").exists()


def test_the_gateway_healthcheck_probes_readiness():
    """A container runtime or load balancer must route by /ready (503 without NATS or dispatchers), not /health."""
    services = _compose()["services"]
    probe = " ".join(services["gateway"]["healthcheck"]["test"])
    assert "/ready" in probe and "/health" not in probe
    assert services["nats"]["healthcheck"]["test"]
    assert services["dispatcher"]["depends_on"]["nats"]["condition"] == "service_healthy"


def test_the_ha_profile_runs_two_copies_of_each_planner():
    """One in the default profile, a standby in "ha" (leader election: planner/leader.py)."""
    services = _compose()["services"]
    for planner in ("steady-planner", "elastic-scaler", "reconciler"):
        copies = [svc for svc in services.values() if svc.get("command") == ["janus", "serve", planner]]
        assert len(copies) == 2, planner
        assert sorted(tuple(svc.get("profiles", ())) for svc in copies) == [(), ("ha",)], planner
    assert "JANUS_TRANSFER_HOST" not in services["worker"].get("environment", {})  # each its own, from its interface


def test_nats_runs_with_the_users_of_janus_nats_config_and_each_service_is_its_own_user(tmp_path):
    """`janus nats-config` writes compose.env; with it (`docker compose --env-file`), every variable the file needs
    is set, NATS loads that nats.conf, and each container logs in as its service's user with its password."""
    import re

    from ops.cli import main
    from runtime.security import compose_password_var, load_or_create_credentials, user_for_service

    assert main(["nats-config", "--out", str(tmp_path)]) == 0
    env = dict(line.split("=", 1) for line in (tmp_path / "compose.env").read_text().splitlines())
    assert env["JANUS_NATS_CONF"] == str((tmp_path / "nats.conf").resolve())
    assert (tmp_path / "compose.env").stat().st_mode & 0o077 == 0
    creds = load_or_create_credentials(tmp_path / "credentials.json")

    text = (REPO / "docker-compose.yml").read_text()
    for name, default in re.findall(r"\$\{(\w+)(?::-([^}]*))?", text):  # ${VAR:?message} or ${VAR:-default}
        assert name in env or default, f"docker-compose.yml needs {name}, which compose.env does not set"

    def resolved(value: str) -> str:
        return re.sub(r"\$\{(\w+)(?::[?-][^}]*)?\}", lambda m: env[m.group(1)], value)

    services = _compose()["services"]
    nats = services["nats"]
    conf_path = nats["command"][nats["command"].index("-c") + 1]
    mounts = {resolved(v).split(":")[1]: resolved(v).split(":")[0] for v in nats["volumes"] if ":" in v}
    assert mounts[conf_path] == env["JANUS_NATS_CONF"]
    assert "-js" in nats["command"]
    for name, svc in services.items():
        command = svc.get("command") or []
        if command[:2] != ["janus", "serve"]:
            continue
        user = svc["environment"]["JANUS_NATS_USER"]
        assert user == user_for_service(command[2]), name
        assert svc["environment"]["JANUS_NATS_PASSWORD"].startswith("${" + compose_password_var(user) + ":?")
        assert resolved(svc["environment"]["JANUS_NATS_PASSWORD"]) == creds[user], name
        assert svc["environment"]["JANUS_NATS_URL"] == "nats://nats:4222"


def test_the_gpu_profile_runs_a_worker_on_the_cuda_image_with_a_gpu():
    services = _compose()["services"]
    gpu = {name: svc for name, svc in services.items() if "gpu" in svc.get("profiles", ())}
    assert list(gpu) == ["worker-gpu"]
    worker = gpu["worker-gpu"]
    args = build_parser().parse_args(worker["command"][1:])
    assert (args.service, args.device) == ("worker", "cuda:0")
    (device,) = worker["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert len(device.get("device_ids", [])) == 1 or device.get("count") == 1  # one GPU a worker
    assert worker["image"] == "janus:cuda" and worker["build"]["dockerfile"] == "Dockerfile.cuda"
    assert "deploy" not in services["worker"] or "resources" not in services["worker"]["deploy"]  # CPU workers: none

"""docker-compose.yml is valid Compose and runs only real `janus serve` entry points (no Docker engine here)."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import yaml

from runtime.cli import build_parser
from runtime.services import SERVICES

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

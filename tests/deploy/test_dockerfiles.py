"""Both images (Dockerfile: CPU, Dockerfile.cuda: GPU hosts) run as the same non-root uid with the same entry point,
install the torch and Mooncake builds of their kind, and are built under the names deploy/k8s's overlays and
docker-compose run (no Docker engine here: the files are parsed)."""
from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
K8S_UID = 10001  # deploy/k8s's securityContext.runAsUser


def instructions(name: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", (REPO / name).read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def last(name: str, keyword: str) -> str:
    values = [rest for k, rest in instructions(name) if k == keyword]
    assert values, f"{name} has no {keyword}"
    return values[-1]


def make_targets() -> dict[str, list[str]]:
    targets, current = {}, None
    for line in (REPO / "Makefile").read_text().splitlines():
        if re.match(r"^[\w-]+:", line):
            current = line.split(":", 1)[0]
            targets[current] = []
        elif line.startswith("\t") and current:
            targets[current].append(line.strip())
    return targets


def built_tag(dockerfile: str) -> str:
    """The image name the Makefile builds from `dockerfile`."""
    for commands in make_targets().values():
        for command in commands:
            args = shlex.split(command)
            if args[:2] != ["docker", "build"]:
                continue
            used = args[args.index("-f") + 1] if "-f" in args else "Dockerfile"
            if used == dockerfile:
                return args[args.index("-t") + 1]
    raise AssertionError(f"the Makefile builds no image from {dockerfile}")


def overlay_image(overlay: str) -> str:
    kustomization = yaml.safe_load((REPO / "deploy" / "k8s" / "overlays" / overlay / "kustomization.yaml").read_text())
    (image,) = [i for i in kustomization["images"] if i["name"] == "janus"]
    return f"{image['newName']}:{image['newTag']}"


def test_both_images_run_as_the_non_root_uid_of_the_manifests_with_one_entry_point():
    for name in ("Dockerfile", "Dockerfile.cuda"):
        user = last(name, "USER")
        uid = user.split(":")[0]
        assert uid.isdigit() and int(uid) == K8S_UID, f"{name}: USER {user}"  # numeric: runAsNonRoot can check it
        assert json.loads(last(name, "ENTRYPOINT")) == []
        assert json.loads(last(name, "CMD")) == ["janus", "--help"]
        env = last(name, "ENV")
        for setting in ("JANUS_STATE_DIR=/var/lib/janus", "JANUS_CONFIG=/etc/janus/cluster.yaml", "HOME=/tmp"):
            assert setting in env, f"{name}: {setting}"
        runs = " ".join(rest for k, rest in instructions(name) if k == "RUN")
        assert "chown 10001:10001 /var/lib/janus" in runs, name


def test_each_image_installs_the_torch_and_mooncake_build_of_its_kind():
    cpu = " ".join(rest for k, rest in instructions("Dockerfile") if k == "RUN")
    cuda = " ".join(rest for k, rest in instructions("Dockerfile.cuda") if k == "RUN")
    assert "download.pytorch.org/whl/cpu" in cpu and '".[cpu]"' in cpu and "[cuda]" not in cpu
    assert re.search(r"download\.pytorch\.org/whl/(cu\d+|\$\{TORCH_CUDA\})", cuda) and '".[cuda]"' in cuda
    assert "[cpu]" not in cuda
    assert re.fullmatch(r"cu\d+", last("Dockerfile.cuda", "ARG").split("=", 1)[1])
    assert last("Dockerfile.cuda", "FROM").startswith("nvidia/cuda:")
    # one torch version for both, the one scripts/setup.sh installs on CPU hosts
    versions = {re.search(r"torch==([\d.]+)", text).group(1) for text in (cpu, cuda)}
    assert len(versions) == 1
    # the same source trees are copied into both
    copies = [[rest for k, rest in instructions(name) if k == "COPY"] for name in ("Dockerfile", "Dockerfile.cuda")]
    assert copies[0] == copies[1]


def test_the_images_copy_and_install_every_package():
    """Every top-level package (ops/ included) is installed by pyproject.toml and copied into both images."""
    packages = {p.parent.name for p in REPO.glob("*/__init__.py")} - {"tests"}
    include = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    assert {pattern.rstrip("*") for pattern in include} == packages
    for name in ("Dockerfile", "Dockerfile.cuda"):
        copied = {rest.split()[0] for k, rest in instructions(name) if k == "COPY"}
        assert packages <= copied, (name, packages - copied)


def test_the_overlays_and_compose_run_the_images_the_makefile_builds():
    assert overlay_image("cpu-demo") == built_tag("Dockerfile") == "janus:dev"
    assert overlay_image("gpu") == built_tag("Dockerfile.cuda") == "janus:cuda"
    services = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    assert services["gateway"]["image"] == built_tag("Dockerfile")
    gpu = [svc for svc in services.values() if "gpu" in svc.get("profiles", ())]
    assert gpu and all(svc["image"] == built_tag("Dockerfile.cuda") for svc in gpu)
    assert all(svc["build"]["dockerfile"] == "Dockerfile.cuda" for svc in gpu)
    docs = (REPO / "docs" / "operations.md").read_text()
    assert "make image-cuda" in docs and "docker build -f Dockerfile.cuda -t janus:cuda ." in docs

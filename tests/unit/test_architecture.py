"""The house rules of docs/architecture.md ("Layers", "Layout and house rules"), enforced: import-linter contracts in
.importlinter, and every package placed in a layer."""
from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_import_contracts_hold():
    lint = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run([str(lint), "--config", str(REPO / ".importlinter")], cwd=REPO, capture_output=True,
                            text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "BROKEN" not in result.stdout


def test_every_package_sits_in_exactly_one_layer():
    """A new top-level package is analysed and layered, or this fails: no package lives outside the house rules."""
    packages = {p.parent.name for p in REPO.glob("*/__init__.py")} - {"tests"}
    config = configparser.ConfigParser()
    config.read(REPO / ".importlinter")
    assert set(config["importlinter"]["root_packages"].split()) == packages
    layers = [line.strip() for line in config["importlinter:contract:layers"]["layers"].strip().splitlines()]
    placed = [name.strip() for layer in layers for name in layer.split("|")]
    assert sorted(placed) == sorted(packages), "each package in exactly one layer"
    assert layers[-2:] == ["runtime", "contracts"] and layers[0] == "sim"
    services = {"gateway", "dispatcher", "oracle", "planner", "worker"}
    assert {name.strip() for name in layers[-3].split("|")} == services and "|" in layers[-3]  # independent


def test_no_absolute_machine_paths_in_the_tree():
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True).stdout.split()
    offenders = []
    for name in tracked:
        path = REPO / name
        if path.suffix not in {".py", ".md", ".yml", ".yaml", ".toml", ".cfg", ".sh", ".json"} or not path.exists():
            continue
        text = path.read_text(errors="ignore")
        # spelt in pieces so this file does not match itself
        if any(marker in text for marker in ("/" + "work/main", "/" + "work/shared", "/" + "root/")):
            offenders.append(name)
    assert not offenders, offenders

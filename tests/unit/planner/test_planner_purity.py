"""The planner cores are pure: importing them pulls in no bus, no web framework, no torch, no service shell."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
FORBIDDEN = ("nats", "fastapi", "torch", "gpytorch", "runtime", "planner.steady_service", "planner.elastic_service",
             "planner.reconciler_service", "planner.bus_oracle", "planner.shell")


def test_planner_core_imports_nothing_impure():
    modules = sorted(p.stem for p in (REPO / "planner" / "core").glob("*.py") if p.stem != "__init__")
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module('planner.core.' + m)\n"
        f"bad = [m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r} or m in {FORBIDDEN!r}]\n"
        "print(','.join(sorted(bad)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"planner.core imported {out.stdout.strip()}"
    assert len(modules) >= 10

"""The Grafana dashboard only queries series the code declares (a renamed metric breaks this test, not the
dashboard in production)."""
from __future__ import annotations

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _declared() -> set[str]:
    names = set()
    for path in REPO.glob("*/**/*.py"):
        if ".venv" in path.parts:
            continue
        names |= set(re.findall(r'"(janus_[a-z_]+)"', path.read_text()))
    return names


def test_dashboard_queries_declared_series_only():
    dash = json.loads((REPO / "deploy" / "grafana" / "dashboards" / "janus.json").read_text())
    used = set()
    for panel in dash["panels"]:
        for target in panel["targets"]:
            used |= set(re.findall(r"\b(janus_[a-z_]+)", target["expr"]))
    base = {re.sub(r"_(bucket|count|sum)$", "", name) for name in used}
    missing = base - _declared()
    assert not missing, f"the dashboard queries series nobody declares: {sorted(missing)}"
    assert len(dash["panels"]) >= 8

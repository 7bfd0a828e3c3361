"""`janus sim` end to end on a few seconds of the headline trace: tables, summary.json, the figure."""
import json

import pytest

from sim.cli import main

from .shared_data import needs_traces

pytestmark = pytest.mark.slow  # ~5 s on an idle machine: two systems, trace generation, a figure


@needs_traces
def test_cli_writes_summary_and_figure(tmp_path, capsys):
    code = main(["--apps", "12", "--requests", "6000", "--duration-s", "60", "--window-s", "10", "--devices", "96",
                 "--systems", "static,janus", "--processes", "1", "--out", str(tmp_path)])
    assert code == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [s["system"] for s in summary["systems"]] == ["static", "janus"]
    static = next(s for s in summary["systems"] if s["system"] == "static")
    assert static["device_hours_vs_static"] == 1.0
    assert 0.0 <= static["token_attainment"] <= 1.0
    png = (tmp_path / "figure.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    printed = capsys.readouterr().out
    assert "token" in printed and "janus" in printed
    assert "worst apps of janus" in printed
    worst = next(s for s in summary["systems"] if s["system"] == "janus")["worst_apps"]
    assert worst and all(set(w) >= {"name", "model", "num_requests", "token_attainment", "rejected"} for w in worst)
    assert [w["token_attainment"] for w in worst] == sorted(w["token_attainment"] for w in worst)

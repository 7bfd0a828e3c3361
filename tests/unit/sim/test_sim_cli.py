"""`janus sim` end to end on a few seconds of the headline trace: tables, summary.json, the figure."""
import json
from pathlib import Path

import pytest

from sim.cli import main

from .shared_data import needs_traces

pytestmark = pytest.mark.slow  # ~5 s on an idle machine: two systems, trace generation, a figure


@needs_traces
def test_cli_writes_summary_and_figure(tmp_path, capsys):
    code = main(["--apps", "12", "--requests", "6000", "--duration-s", "60", "--window-s", "10", "--devices", "96",
                 "--systems", "static,janus", "--processes", "1", "--out", str(tmp_path),
                 "--oracle", "clairvoyant"])  # not the default learned one: no profiling in a test of the CLI
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
    janus = next(s for s in summary["systems"] if s["system"] == "janus")
    assert janus["counters"]["events"] > 0 and janus["counters"]["rejected"] >= 0  # the run's counters are kept
    assert [w["token_attainment"] for w in worst] == sorted(w["token_attainment"] for w in worst)
    # one source of defaults: what the simulated Janus ran with is what `janus config` says the services run with
    from ops.effective import effective_policies
    from runtime.settings import ClusterConfig

    assert summary["meta"]["policy"] == effective_policies(ClusterConfig())
    # and the code it ran (sim/provenance.py): the tree the `sim` package came from
    import sim

    assert summary["meta"]["code"]["source_dir"] == str(Path(sim.__file__).resolve().parent.parent)
    assert "code: " in printed


@needs_traces
def test_cli_runs_janus_with_the_policies_of_a_cluster_yaml(tmp_path):
    config = tmp_path / "cluster.yaml"
    config.write_text("planner:\n  elastic:\n    max_num_replicas: 7\ndispatcher:\n  window_s: 3.0\n")
    code = main(["--apps", "6", "--requests", "2000", "--duration-s", "60", "--window-s", "5", "--devices", "48",
                 "--systems", "janus", "--processes", "1", "--out", str(tmp_path), "--config", str(config),
                 "--oracle", "clairvoyant"])
    assert code == 0
    policy = json.loads((tmp_path / "summary.json").read_text())["meta"]["policy"]
    assert policy["planner"]["elastic"]["max_num_replicas"] == 7 and policy["dispatcher"]["window_s"] == 3.0
    from sim.runner import _systems

    janus = _systems(policy)["janus"]()
    assert janus.policies() == policy, "the system ran with what the summary says"


def test_a_negative_refit_time_is_refused_naming_the_option(capsys):
    with pytest.raises(SystemExit):
        main(["--window-s", "10", "--refit-wall-s", "-1"])
    assert "--refit-wall-s" in capsys.readouterr().err

"""`janus config`: the effective cluster configuration, every policy knob expanded, one line per config mistake."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, fields
from pathlib import Path

import pytest

from dispatcher.core.policy import DispatchPolicy
from ops.cli import main
from ops.effective import ConfigError, effective_config, effective_policies, load_cluster
from oracle.core.policy import OraclePolicy
from planner.core.policy import PlannerPolicy
from runtime.settings import ClusterConfig

REPO = Path(__file__).resolve().parents[3]
JANUS = Path(sys.executable).parent / "janus"


@pytest.fixture(autouse=True)
def _no_config_from_the_environment(monkeypatch):
    monkeypatch.delenv("JANUS_CONFIG", raising=False)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "JANUS_CONFIG"}
    env.update(extra)
    return env


def _janus(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(JANUS), *args], cwd=REPO, capture_output=True, text=True, timeout=120, env=_env(**env))


def _write(tmp_path: Path, text: str, name: str = "cluster.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["config", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _assert_one_line_error(rc: int, out: str, err: str, *needles: str) -> None:
    assert rc == 2
    assert out == ""
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], lines[0]


# --- the shared function ---------------------------------------------------------------------------------------


def test_effective_policies_are_the_policies_the_services_build():
    cluster = ClusterConfig(planner={"elastic": {"period_s": 0.25}}, dispatcher={"algorithm": "round_robin"})
    got = effective_policies(cluster)
    assert set(got) == {"dispatcher", "planner", "oracle"}
    assert got["dispatcher"] == DispatchPolicy(**cluster.dispatcher).model_dump(mode="json")
    assert got["planner"] == PlannerPolicy(**cluster.planner).model_dump(mode="json")
    assert got["dispatcher"]["algorithm"] == "round_robin"  # enums as their JSON values
    assert got["planner"]["elastic"]["period_s"] == 0.25
    json.dumps(got)  # JSON-ready as is


def test_the_oracle_section_is_the_policy_the_oracle_service_builds():
    cluster = ClusterConfig(oracle={"learns_online": False, "refit_min_interval_s": 5.0, "drift_windows": 20})
    got = effective_policies(cluster)["oracle"]
    assert got == asdict(OraclePolicy.from_knobs(cluster.oracle))
    assert got["learns_online"] is False and got["refit_min_interval_s"] == 5.0
    assert "drift_windows" not in got  # the service's own setting, not a policy knob
    assert {k: v for k, v in got.items() if k not in ("learns_online", "refit_min_interval_s")} == \
        {k: v for k, v in asdict(OraclePolicy()).items() if k not in ("learns_online", "refit_min_interval_s")}


def test_effective_policies_of_the_defaults_expand_every_knob():
    got = effective_policies(ClusterConfig())
    assert set(got["oracle"]) == {f.name for f in fields(OraclePolicy)}
    assert set(got["dispatcher"]) == set(DispatchPolicy.model_fields)
    assert set(got["planner"]) == set(PlannerPolicy.model_fields)
    for section in ("steady", "pool", "elastic", "reconciler"):
        nested = type(getattr(PlannerPolicy(), section))
        assert set(got["planner"][section]) == set(nested.model_fields)


def test_importing_the_module_loads_no_service_package():
    services = ("planner", "dispatcher", "worker", "oracle", "sim")
    code = ("import sys, ops.effective, ops.cli; "
            f"bad = [m for m in sys.modules if m.split('.')[0] in {services!r}]; assert not bad, bad")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


# --- janus config ----------------------------------------------------------------------------------------------


def test_janus_config_subprocess_prints_json_whose_policy_equals_the_defaults():
    result = _janus("config")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert set(out) == {"cluster", "policy"}
    assert out["policy"] == effective_policies(ClusterConfig())
    assert out["cluster"] == ClusterConfig().model_dump(mode="json")
    assert result.stdout.startswith('{\n  "cluster": {\n    "')  # pretty, two-space indent


def test_policies_only_prints_just_the_policies(capsys):
    rc, out, _ = _run(capsys, "--policies-only")
    assert rc == 0
    assert json.loads(out) == effective_policies(ClusterConfig())


def test_yaml_overrides_show_up_and_other_defaults_stay(tmp_path, capsys):
    default = effective_policies(ClusterConfig())
    assert default["planner"]["elastic"]["max_num_replicas"] != 7 and default["dispatcher"]["window_s"] != 3.25
    path = _write(tmp_path, "planner: {elastic: {max_num_replicas: 7}}\ndispatcher: {window_s: 3.25}\n"
                            "workers: {count: 3}\n")
    rc, out, err = _run(capsys, "--config", str(path))
    assert rc == 0, err
    got = json.loads(out)
    policy = got["policy"]
    assert policy["planner"]["elastic"]["max_num_replicas"] == 7
    assert policy["dispatcher"]["window_s"] == 3.25
    # everything else keeps its default
    assert {k: v for k, v in policy["planner"]["elastic"].items() if k != "max_num_replicas"} == \
        {k: v for k, v in default["planner"]["elastic"].items() if k != "max_num_replicas"}
    for section in ("steady", "pool", "reconciler"):
        assert policy["planner"][section] == default["planner"][section]
    assert {k: v for k, v in policy["dispatcher"].items() if k != "window_s"} == \
        {k: v for k, v in default["dispatcher"].items() if k != "window_s"}
    assert got["cluster"]["workers"]["count"] == 3
    assert got["cluster"]["planner"] == {"elastic": {"max_num_replicas": 7}}  # the YAML as given, beside the expansion


def test_janus_config_comes_from_the_environment_like_janus_up(tmp_path):
    path = _write(tmp_path, "dispatcher: {window_s: 3.25}\n")
    result = _janus("config", "--policies-only", JANUS_CONFIG=str(path))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["dispatcher"]["window_s"] == 3.25


def test_an_empty_yaml_is_the_defaults(tmp_path, capsys):
    rc, out, _ = _run(capsys, "--config", str(_write(tmp_path, "# nothing here\n")))
    assert rc == 0
    assert json.loads(out)["policy"] == effective_policies(ClusterConfig())


def test_api_keys_are_masked_unless_asked_for(tmp_path, capsys):
    path = _write(tmp_path, "gateway: {api_keys: {sk-secret-1: team-a, sk-secret-2: team-b}}\n")
    rc, out, _ = _run(capsys, "--config", str(path))
    assert rc == 0
    assert "sk-secret" not in out
    assert sorted(json.loads(out)["cluster"]["gateway"]["api_keys"].values()) == ["team-a", "team-b"]
    rc, out, _ = _run(capsys, "--config", str(path), "--show-secrets")
    assert json.loads(out)["cluster"]["gateway"]["api_keys"] == {"sk-secret-1": "team-a", "sk-secret-2": "team-b"}


# --- mistakes: exit 2, one line naming the YAML path -----------------------------------------------------------


def test_an_invalid_policy_value_names_its_path(tmp_path, capsys):
    path = _write(tmp_path, "planner: {elastic: {max_num_replicas: 0}}\n")
    rc, out, err = _run(capsys, "--config", str(path))
    _assert_one_line_error(rc, out, err, str(path),
                           "planner.elastic.max_num_replicas: Input should be greater than or equal to 1")


def test_an_unknown_policy_key_names_its_path(tmp_path, capsys):
    path = _write(tmp_path, "dispatcher: {window_z: 3}\n")
    rc, out, err = _run(capsys, "--config", str(path))
    _assert_one_line_error(rc, out, err, str(path), "dispatcher.window_z: Extra inputs are not permitted")
    path = _write(tmp_path, "planner: {steady: {perod_s: 3}}\n", "nested.yaml")
    rc, out, err = _run(capsys, "--config", str(path))
    _assert_one_line_error(rc, out, err, "planner.steady.perod_s: Extra inputs are not permitted")


def test_an_unknown_or_bad_oracle_knob_names_its_section(tmp_path, capsys):
    path = _write(tmp_path, "oracle: {refit_min_new_sample: 3}\n")
    rc, out, err = _run(capsys, "--config", str(path))
    _assert_one_line_error(rc, out, err, str(path), "oracle: 'refit_min_new_sample' is not an oracle knob "
                                                    "(did you mean 'refit_min_new_samples'?)")
    rc, out, err = _run(capsys, "--config", str(_write(tmp_path, "oracle: {logit_clip: 0.7}\n", "clip.yaml")))
    _assert_one_line_error(rc, out, err, "oracle: OraclePolicy: 0 < logit_clip < 0.5")


@pytest.mark.parametrize(("knob", "expected"), [
    ('learns_online: "no"', "oracle: learns_online: expected bool, got 'no'"),  # a dataclass would take it as true
    ("num_train_iters: 2.5", "oracle: num_train_iters: expected int, got 2.5"),
    ("refit_min_interval_s: true", "oracle: refit_min_interval_s: expected float, got True"),
    ("attainment_target: probit", "oracle: attainment_target: one of 'identity', 'logit', got 'probit'"),
    ("profile_lifetime_answer: median", "oracle: profile_lifetime_answer: one of 'mean', 'in-flight', got 'median'"),
    ("profile_max_replicas: 0", "oracle: OraclePolicy: profile_max_replicas >= 1, got 0"),
])
def test_an_oracle_knob_of_the_wrong_type_is_refused(tmp_path, capsys, knob, expected):
    rc, out, err = _run(capsys, "--config", str(_write(tmp_path, f"oracle: {{{knob}}}\n")))
    _assert_one_line_error(rc, out, err, expected)


def test_an_int_is_a_float_oracle_knob():
    assert OraclePolicy.from_knobs({"refit_min_interval_s": 5}).refit_min_interval_s == 5


def test_a_policy_cross_check_names_its_section(tmp_path, capsys):
    path = _write(tmp_path, "planner: {pool: {large_need_enter: 0.2, large_need_exit: 0.4}}\n")
    rc, out, err = _run(capsys, "--config", str(path))
    _assert_one_line_error(rc, out, err, "planner.pool: ", "hysteresis")


def test_cluster_mistakes_name_their_paths_on_one_line(tmp_path, capsys):
    path = _write(tmp_path, "models: [{name: 'a b'}]\nworkers: {count: 0}\nplaners: {}\n")
    rc, out, err = _run(capsys, "--config", str(path))
    _assert_one_line_error(rc, out, err, "models[0].name: ", "workers.count: Input should be greater than or equal",
                           "planers: Extra inputs are not permitted")


def test_a_section_of_the_wrong_type_names_its_path(tmp_path, capsys):
    rc, out, err = _run(capsys, "--config", str(_write(tmp_path, "planner: 5\n")))
    _assert_one_line_error(rc, out, err, "planner: Input should be a valid dictionary")


def test_bad_yaml_and_a_missing_file_are_one_line(tmp_path, capsys):
    rc, out, err = _run(capsys, "--config", str(_write(tmp_path, "models: [\n")))
    _assert_one_line_error(rc, out, err, "invalid YAML at line")
    rc, out, err = _run(capsys, "--config", str(tmp_path / "absent.yaml"))
    _assert_one_line_error(rc, out, err, "absent.yaml: not found")


def test_subprocess_mistake_exits_2_without_a_traceback(tmp_path):
    path = _write(tmp_path, "planner: {elastic: {max_num_replicas: 0}}\n")
    result = _janus("config", "--config", str(path))
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.strip() == (f"janus config: {path}: planner.elastic.max_num_replicas: "
                                     "Input should be greater than or equal to 1 (got 0)")


def test_janus_up_refuses_a_bad_config_the_same_way_before_starting_anything(tmp_path):
    path = _write(tmp_path, "dispatcher: {window_z: 3}\n")
    result = _janus("up", "--config", str(path), "--state-dir", str(tmp_path / "state"))
    assert result.returncode == 2
    assert result.stderr.strip() == (f"janus up: {path}: dispatcher.window_z: Extra inputs are not permitted "
                                     "(did you mean 'window_s'?)")
    assert not (tmp_path / "state").exists()


def test_load_cluster_raises_config_error_and_returns_the_cluster(tmp_path):
    assert load_cluster(None) == ClusterConfig()
    cluster = load_cluster(_write(tmp_path, "dispatcher: {window_s: 3.25}\n"))
    assert cluster.dispatcher == {"window_s": 3.25}
    with pytest.raises(ConfigError, match=r"dispatcher\.window_s: Input should be greater than 0"):
        load_cluster(_write(tmp_path, "dispatcher: {window_s: 0}\n", "bad.yaml"))
    assert effective_config(cluster)["policy"] == effective_policies(cluster)

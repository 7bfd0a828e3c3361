"""`janus profile` and the profiling `janus up` does on first start: the plans (full, quick), the grid of the quick
plan, the command's errors and output, the cache that makes a second `janus up` start at once."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ops.cli import main
from oracle.core import OraclePolicy, TrainingSet
from oracle.training_files import load_training_set, save_training_set
from oracle.core.dataset import ElasticitySample
from oracle.profile.grid import LengthMix
from oracle.profile.harness import HarnessSettings, stratified_grid
from oracle.profile.run import FULL, QUICK, ProfilePlan, format_duration, parse_mixes, partial_path
from runtime.settings import ClusterConfig, JanusSettings, ModelSpec

MIXES = (LengthMix("a", 64, 0.5, 32), LengthMix("b", 512, 1.0, 16))


# --- the plans ----------------------------------------------------------------------------------------------------

def test_the_quick_grid_puts_every_m_below_at_and_past_its_knee():
    capacities = {"a": 100.0, "b": 10.0}
    grid = stratified_grid(capacities, MIXES, [1, 2, 3], QUICK.load_bands, HarnessSettings(seed=4))
    assert len(grid) == 2 * 3 * 3
    for mix in MIXES:
        for m in (1, 2, 3):
            factors = sorted(p.rate_rps / (capacities[mix.name] * m) for p in grid
                             if p.mix == mix and p.num_replicas == m)
            assert len(factors) == 3
            assert factors[0] < 1.0 < factors[2]  # below and past the knee
            for f, (lo, hi) in zip(factors, QUICK.load_bands):
                assert lo <= f <= hi
    assert QUICK.load_bands[1][0] <= 1.0 <= QUICK.load_bands[1][1]  # and one around it
    assert grid == stratified_grid(capacities, MIXES, [1, 2, 3], QUICK.load_bands, HarnessSettings(seed=4))
    assert grid != stratified_grid(capacities, MIXES, [1, 2, 3], QUICK.load_bands, HarnessSettings(seed=5))
    with pytest.raises(ValueError):
        stratified_grid(capacities, MIXES, [1], [], HarnessSettings())
    with pytest.raises(ValueError):
        stratified_grid(capacities, MIXES, [1], [(0.0, 1.0)], HarnessSettings())


def test_a_quick_profile_is_enough_for_the_oracle_to_fit_its_gps_at_start():
    """The oracle refits a model once it has refit_min_new_samples unseen samples: a profile with fewer points would
    leave the planners on the roofline until telemetry made up the difference."""
    assert QUICK.num_points == 27 and FULL.num_points == 45
    assert QUICK.num_points >= OraclePolicy().refit_min_new_samples
    assert QUICK.replicas == FULL.replicas and QUICK.mixes == FULL.mixes  # the same space, fewer points in it
    settings = QUICK.harness_settings(ttft_slo_ms=50.0)
    assert (settings.duration_s, settings.step_cost_rounds, settings.ttft_slo_ms) == (1.5, 2, 50.0)
    assert FULL.harness_settings() == HarnessSettings()
    with pytest.raises(ValueError):
        ProfilePlan("bad", replicas=())


def test_the_knee_search_starts_where_a_pilot_has_requests():
    """A roofline estimate of ~0 (demo-small's long mix at a 100 ms TTFT) must not start the search at rates whose
    pilots hold no request (an empty pilot scores 1.0: the search only ever saw those)."""
    from oracle.profile.harness import MIN_PILOT_REQUESTS, Profiler

    asked = []

    def run_point(point, index, duration_s=None):
        asked.append(point.rate_rps)
        sample = ElasticitySample(point.features, 1, 1.0 if point.rate_rps < 100 else 0.2)
        return [], sample, {"rate_rps": point.rate_rps}

    profiler = Profiler.__new__(Profiler)  # no engines: run_point is the stand-in above
    profiler.run_point = run_point
    # TTFT 100 ms + 32 tokens x 10 ms fit in a 1 s pilot: all are samples; pilots of the length asked (a pilot's
    # least length in request lifetimes: tests/unit/sim/test_profile_lifetimes.py)
    profiler.settings = HarnessSettings(min_request_lifetimes=0.0)
    seen = []
    knee, runs, samples = profiler.measured_capacity_rps(MIXES[0], 1e-3, duration_s=0.5, max_runs=6,
                                                         on_run=seen.append)
    assert asked[0] == MIN_PILOT_REQUESTS / 0.5 == 16
    assert asked[:4] == [16, 32, 64, 128] and 64 < knee < 128
    assert [r["rate_rps"] for r in seen] == asked and len(runs) == 6
    # each pilot is a training sample of its own (m = 1), labelled as a pilot
    measured = [1.0 if rate < 100 else 0.2 for rate in asked]
    assert [s.attainment for s in samples] == [r["attainment"] for r in runs] == measured
    assert {s.source for s in samples} == {"pilot"}


def test_the_harness_alone_drives_no_engine_and_says_which_target_does(tmp_path):
    """The oracle's Profiler has no engine of its own (the oracle does not import the worker): built bare, or by
    profile_checkpoint without make_profiler, it names the target that has one before it measures anything."""
    from oracle.profile.harness import HarnessSettings, Profiler
    from oracle.profile.run import profile_checkpoint

    with pytest.raises(NotImplementedError, match=r"ops\.profile\.EngineProfiler"):
        Profiler(tmp_path, HarnessSettings(), max_replicas=1)
    with pytest.raises(NotImplementedError, match="make_profiler"):
        profile_checkpoint(tmp_path, tmp_path / "out.json", plan=TINY_PLAN, show_progress=False, say=lambda _: None)
    assert not (tmp_path / "out.json").exists()


def test_python_m_ops_profile_is_the_hand_entry_point():
    """What the docs run by hand (`python -m ops.profile`, which replaced `python -m oracle.profile`)."""
    import subprocess

    out = subprocess.run([sys.executable, "-m", "ops.profile", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "python -m ops.profile --model demo-tiny" in out.stdout and "--clock" in out.stdout


def test_a_pilot_too_short_for_its_answers_is_no_training_sample():
    """A pilot scores the requests it lets finish: one whose mean answer takes longer than the pilot (TTFT plus the
    output at the TPOT SLO) measured the start of a queue, not what the load does to it."""
    from contracts import LoadFeatures
    from oracle.profile.harness import is_pilot_long_enough

    settings = HarnessSettings(ttft_slo_ms=100.0, tpot_slo_ms=10.0)

    def load(output_len_mean):
        return LoadFeatures(token_rate_tps=1e4, input_len_mean=200.0, input_len_var=1e4,
                            output_len_mean=output_len_mean)

    assert is_pilot_long_enough(load(32.0), 1.0, settings)  # 0.1 + 0.32 s
    assert not is_pilot_long_enough(load(577.0), 1.0, settings)  # 0.1 + 5.77 s
    assert is_pilot_long_enough(load(577.0), 8.0, settings)


def test_small_helpers():
    assert format_duration(42.4) == "42 s" and format_duration(200) == "3 min 20 s"
    assert partial_path("/x/demo.json") == Path("/x/demo.json.partial")
    assert parse_mixes(["s:64:0.5:32"]) == (LengthMix("s", 64.0, 0.5, 32.0),)
    with pytest.raises(ValueError):
        parse_mixes(["s:64:32"])
    with pytest.raises(ValueError):
        HarnessSettings(hbm_bytes=0)


# --- janus profile ------------------------------------------------------------------------------------------------

def _yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return path


def test_an_unknown_model_is_one_line_naming_the_configured_ones(tmp_path, capsys):
    config = _yaml(tmp_path, "models:\n  - {name: mine, demo: demo-tiny}\n  - {name: other, demo: demo-small}\n")
    assert main(["profile", "--model", "ghost", "--config", str(config), "--state-dir", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("janus profile: unknown model 'ghost'; configured: mine, other (or a demo model: ")
    assert not (tmp_path / "oracle").exists()


def test_gpu_workers_and_missing_checkpoints_are_refused_in_one_line(tmp_path, capsys):
    config = _yaml(tmp_path, "models: [{name: big, path: /nowhere}]\nworkers: {device: cuda}\n")
    assert main(["profile", "--model", "big", "--config", str(config), "--state-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the profiler measures the engine on this CPU only" in err
    config = _yaml(tmp_path, "models: [{name: big, path: /nowhere}]\n")
    assert main(["profile", "--model", "big", "--config", str(config), "--state-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no complete Hugging Face checkpoint at /nowhere" in err


TINY_PLAN = ProfilePlan("quick", replicas=(1, 2), mixes=(LengthMix("short", 64, 0.5, 16),),
                        load_bands=((0.3, 0.5), (0.9, 1.1), (1.6, 2.0)), duration_s=0.3, drain_s=0.2,
                        pilot_duration_s=0.3, pilot_max_runs=2, step_cost_rounds=1)


@pytest.mark.slow
def test_janus_profile_writes_the_training_set_under_the_state_dir(tmp_path, capsys, monkeypatch, demo_models_dir):
    """The real harness end to end, on a grid shrunk to seconds: the file the oracle service loads, named by the
    configured model, SLOs and engine of the cluster config, and a summary line."""
    import oracle.profile.run as run

    monkeypatch.setattr(run, "QUICK", TINY_PLAN)
    config = _yaml(tmp_path, f"models: [{{name: my-tiny, path: {demo_models_dir / 'demo-tiny'}}}]\n"
                             "workers: {max_num_seqs: 16, pool_bytes: 67108864}\n"
                             "oracle: {profile_lifetime_answer: in-flight}\n")
    state = tmp_path / "state"
    assert main(["profile", "--model", "my-tiny", "--quick", "--config", str(config), "--state-dir",
                 str(state)]) == 0
    out = capsys.readouterr().out
    path = state / "oracle" / "my-tiny.json"
    assert path.is_file() and not partial_path(path).exists()
    lines = out.strip().splitlines()
    assert lines[0].startswith("janus profile: my-tiny (") and "quick plan: 6 points" in lines[0]
    assert lines[-1].startswith("janus profile: my-tiny: 6 points and 2 knee-search runs (8 elasticity, 9 capacity "
                                "samples) in ")
    assert lines[-1].endswith(f" -> {path}")
    ts = load_training_set(path)
    assert ts.model == "my-tiny" and (ts.ttft_slo_ms, ts.tpot_slo_ms) == (100.0, 10.0)
    assert sorted({s.num_replicas for s in ts.elasticity}) == [1, 2]
    harness = ts.meta["harness"]
    assert harness["max_num_seqs"] == 16 and harness["hbm_bytes"] == 64 << 20
    assert harness["lifetime_answer"] == "in-flight"  # the cluster YAML's oracle.profile_lifetime_answer
    assert ts.meta["device"]["hbm_bytes"] == 64 << 20  # HBM needs are fractions of the worker's page pool
    assert ts.meta["plan"]["name"] == "quick" and ts.meta["configured_slo_ms"] == {"ttft": 2000.0, "tpot": 200.0}
    assert json.loads(path.read_text())["format"] == "janus.oracle.training-set/v1"


# --- janus up: profile once, before serving -----------------------------------------------------------------------

class Recorder:
    def __init__(self, rc: int = 0):
        self.calls: list[list[str]] = []
        self.rc = rc

    def __call__(self, cmd, env=None, **kwargs):
        from subprocess import CompletedProcess

        self.calls.append(list(cmd))
        if self.rc == 0:  # what the child writes
            state = Path(cmd[cmd.index("--state-dir") + 1])
            name = cmd[cmd.index("--model") + 1]
            (state / "oracle").mkdir(parents=True, exist_ok=True)
            save_training_set(TrainingSet(model=name), state / "oracle" / f"{name}.json")
        return CompletedProcess(cmd, self.rc)


def test_first_start_profiles_the_demo_models_once_then_starts_at_once(tmp_path, capsys, monkeypatch):
    from ops import launcher

    recorder = Recorder()
    monkeypatch.setattr(launcher.subprocess, "run", recorder)
    settings = JanusSettings(state_dir=tmp_path)
    cluster = ClusterConfig()  # the demo cluster `make up` serves
    assert launcher.profile_on_first_start(settings, cluster) == ["demo-tiny", "demo-small"]
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first.startswith("janus: first start: profiling demo-tiny, demo-small on this CPU so that the planners "
                            "use learned GPs") and "--no-profile" in first and "JANUS_NO_PROFILE=1" in first
    assert out.splitlines()[-1].startswith("janus: profiled demo-tiny, demo-small in ")
    assert [c[c.index("--model") + 1] for c in recorder.calls] == ["demo-tiny", "demo-small"]
    assert all(c[:4] == [sys.executable, "-m", "ops.cli", "profile"] and "--quick" in c for c in recorder.calls)
    # cached: the second start profiles nothing and says nothing
    assert launcher.profile_on_first_start(settings, cluster) == []
    assert capsys.readouterr().out == "" and len(recorder.calls) == 2


def test_first_start_profiles_only_what_is_missing_and_survives_a_failure(tmp_path, capsys, monkeypatch):
    from ops import launcher

    (tmp_path / "oracle").mkdir()
    save_training_set(TrainingSet(model="demo-tiny"), tmp_path / "oracle" / "demo-tiny.json")
    failing = Recorder(rc=1)
    monkeypatch.setattr(launcher.subprocess, "run", failing)
    cluster = ClusterConfig(models=[ModelSpec(name="demo-tiny", demo="demo-tiny"),
                                    ModelSpec(name="demo-small", demo="demo-small"),
                                    ModelSpec(name="mine", path=tmp_path / "ckpt")])
    settings = JanusSettings(state_dir=tmp_path, config=tmp_path / "c.yaml")
    assert launcher.profile_on_first_start(settings, cluster) == []
    out = capsys.readouterr().out
    assert [c[c.index("--model") + 1] for c in failing.calls] == ["demo-small"]
    assert failing.calls[0][-2:] == ["--config", str(tmp_path / "c.yaml")]
    assert "janus: no oracle training set for mine: the oracle answers from its roofline until `janus profile" in out
    assert "janus: profiling demo-small failed (exit 1); its oracle answers from the roofline" in out
    # GPU workers: the CPU profile would not describe them
    gpu = cluster.model_copy(update={"workers": cluster.workers.model_copy(update={"device": "cuda"})})
    assert launcher.profile_on_first_start(settings, gpu) == [] and len(failing.calls) == 1


def test_no_profile_and_its_environment_variable_skip_it(monkeypatch):
    from ops import launcher
    from runtime import service

    seen = []
    monkeypatch.setattr(service, "configure_logging", lambda level: None)
    monkeypatch.setattr(launcher, "profile_on_first_start", lambda s, c: seen.append(c))
    monkeypatch.setattr(launcher, "run_up", lambda *a, **k: _done())
    monkeypatch.delenv("JANUS_NO_PROFILE", raising=False)
    assert main(["up", "--no-profile", "--state-dir", "/tmp/never-used"]) == 0 and seen == []
    monkeypatch.setenv("JANUS_NO_PROFILE", "1")
    assert launcher.is_profiling_skipped()
    assert main(["up", "--state-dir", "/tmp/never-used"]) == 0 and seen == []
    monkeypatch.setenv("JANUS_NO_PROFILE", "0")
    assert not launcher.is_profiling_skipped()
    assert main(["up", "--state-dir", "/tmp/never-used"]) == 0 and len(seen) == 1


async def _done() -> int:
    return 0


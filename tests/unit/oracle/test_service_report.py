"""The oracle service's default training sets (`<state_dir>/oracle/<model>.json`) and its report (health detail,
/metrics series), without a bus: what `start` loads and what a refit and a window set."""
import json
import logging

import pytest
from prometheus_client import generate_latest

from contracts import ModelLoadWindow
from oracle.profile.grid import GridPoint, LengthMix, load_grid
from oracle.profile.synthetic import roofline_training_set
from oracle.service import OracleService, _RecordedRefits
from oracle.training_files import save_training_set
from runtime.metrics import REGISTRY
from runtime.settings import ClusterConfig, JanusSettings, ModelSpec
from tests.scrape import samples

CHAT = LengthMix("chat", 400, 0.8, 150)


def training_set(model, roofline):
    grid = load_grid([2, 5, 10, 20, 40, 80], [CHAT, LengthMix("short", 100, 0.3, 300)], [1, 2])
    return roofline_training_set(model, roofline, grid, 300.0, 20.0, attainment_noise=0.02, seed=1)


def make_service(tmp_path, models, **oracle):
    # no checkpoint folders: no roofline profiles and no CPU calibration; the training sets alone
    settings = JanusSettings(nats_url="nats://127.0.0.1:1", instance="report-test", state_dir=tmp_path,
                             metrics_port=None)
    cluster = ClusterConfig(models=[ModelSpec(name=m, ttft_slo_ms=300.0, tpot_slo_ms=20.0) for m in models],
                            workers={"device": "cuda"}, oracle={"num_train_iters": 10, **oracle})
    return OracleService(settings, cluster)


def test_default_training_sets_load_and_bad_files_are_one_log_line(tmp_path, roofline, caplog):
    folder = tmp_path / "oracle"
    folder.mkdir()
    save_training_set(training_set("rep-good", roofline), folder / "rep-good.json")
    (folder / "rep-garbled.json").write_text("{not json")
    (folder / "rep-list.json").write_text("[1, 2]")
    (folder / "rep-wrongformat.json").write_text(json.dumps({"format": "something-else"}))
    bad_sample = training_set("rep-badsample", roofline).to_dict()
    bad_sample["elasticity"][0]["features"]["token_rate_tps"] = "fast"
    (folder / "rep-badsample.json").write_text(json.dumps(bad_sample))
    save_training_set(training_set("somebody-else", roofline), folder / "rep-other.json")  # under another model's name
    named = tmp_path / "named.json"
    save_training_set(training_set("rep-named", roofline), named)
    models = ["rep-good", "rep-garbled", "rep-list", "rep-wrongformat", "rep-badsample", "rep-other", "rep-none"]
    svc = make_service(tmp_path, models, training_sets=[str(named), str(folder / "rep-good.json")])
    with caplog.at_level(logging.INFO, logger="janus.oracle"):
        svc._load_profiles()
    # the named file first, then the defaults; the one named twice is loaded once
    assert svc.training_sets_loaded == [str(named), str(folder / "rep-good.json")]
    assert svc.oracle.num_samples("rep-good")["elasticity"] == len(training_set("x", roofline).elasticity)
    assert svc.oracle.num_samples("rep-named")["capacity"] > 0
    skipped = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert sorted(r.args[0].name for r in skipped) == sorted(
        f"{m}.json" for m in ("rep-garbled", "rep-list", "rep-wrongformat", "rep-badsample", "rep-other"))
    assert all("\n" not in r.getMessage() for r in skipped)  # one line each
    loaded = [r.getMessage() for r in caplog.records if "samples from" in r.getMessage()]
    assert len(loaded) == 2 and any("rep-good.json" in line for line in loaded)
    assert svc.oracle.num_samples("somebody-else") == {"capacity": 0, "elasticity": 0}


async def test_refits_and_windows_show_in_health_and_metrics(tmp_path, roofline):
    folder = tmp_path / "oracle"
    folder.mkdir()
    save_training_set(training_set("rep-gp", roofline), folder / "rep-gp.json")
    svc = make_service(tmp_path, ["rep-gp", "rep-cold"])
    svc._load_profiles()
    svc._observe_status()
    text = generate_latest(REGISTRY).decode()
    assert samples(text, "janus_oracle_source", model="rep-gp", kind="elasticity", source="gp") == [0.0]
    assert samples(text, "janus_oracle_training_points", model="rep-gp", kind="elasticity") == [0.0]
    assert samples(text, "janus_oracle_samples", model="rep-gp", kind="elasticity") == [24.0]
    assert samples(text, "janus_oracle_refits_total", model="rep-gp", kind="elasticity") == [0.0]
    assert samples(text, "janus_oracle_source", model="rep-cold", kind="capacity", source="gp") == [0.0]

    refits = _RecordedRefits(svc.shared, svc)  # what the background refitter calls
    assert sorted(refits.due_for_refit(0.0)) == [("rep-gp", "capacity"), ("rep-gp", "elasticity")]
    for kind in ("capacity", "elasticity"):
        refits.refit("rep-gp", kind, 0.0)
    with pytest.raises(ValueError):
        refits.refit("rep-cold", "elasticity", 0.0)  # no samples: a failed fit, counted
    # one window, served by two replicas (heartbeats), scored before it is learnt
    svc.replica_counts.update("rep-gp", 2, -20_000.0)  # as the heartbeats left it: two, since a window before
    w = ModelLoadWindow(model="rep-gp", window_s=10.0, end_unix_ms=0.0, num_requests=30, request_rate_rps=3.0,
                        features=GridPoint(10.0, CHAT, 2).features, ttft_attainment=0.75)
    await svc._on_window(w, None)
    summary = svc.drift.summary("rep-gp")
    assert summary.num_windows == 1 and summary.last.num_replicas == 2 and summary.last.source == "gp"
    assert svc.num_windows_learnt == 1

    text = generate_latest(REGISTRY).decode()
    for kind in ("capacity", "elasticity"):
        assert samples(text, "janus_oracle_source", model="rep-gp", kind=kind, source="gp") == [1.0]
        assert samples(text, "janus_oracle_source", model="rep-gp", kind=kind, source="roofline") == [0.0]
        assert samples(text, "janus_oracle_training_points", model="rep-gp", kind=kind)[0] > 0
        assert samples(text, "janus_oracle_refits_total", model="rep-gp", kind=kind) == [1.0]
        (age,) = samples(text, "janus_oracle_fit_age_seconds", model="rep-gp", kind=kind)
        assert 0.0 <= age < 600.0
        assert samples(text, "janus_oracle_last_fit_unix_seconds", model="rep-gp", kind=kind)[0] > 1.7e9
    assert samples(text, "janus_oracle_refit_failures_total", model="rep-cold", kind="elasticity") == [1.0]
    # no checkpoint (no roofline) and no training set: neither source answers
    assert samples(text, "janus_oracle_source", model="rep-cold", kind="elasticity", source="roofline") == [0.0]
    assert samples(text, "janus_oracle_windows_scored_total", model="rep-gp", source="gp") == [1.0]
    (error,) = samples(text, "janus_oracle_attainment_abs_error", model="rep-gp")
    assert error == pytest.approx(abs(summary.last.predicted_mean - 0.75))
    assert samples(text, "janus_oracle_attainment_measured", model="rep-gp") == [0.75]
    assert samples(text, "janus_oracle_samples", model="rep-gp", kind="elasticity") == [25.0]  # and learnt
    assert "TTFT" in text and "token-level" in text  # the help says what is compared with what

    detail = svc.health_detail()
    assert detail["gp.elasticity"] == "rep-gp" and detail["gp.capacity"] == "rep-gp"
    assert detail["rep-gp.elasticity"].startswith("gp-elasticity") and detail["rep-cold.elasticity"] == "none"
    assert detail["training_sets"] == str(folder / "rep-gp.json")
    assert float(detail["rep-gp.attainment_abs_error"]) == pytest.approx(error, abs=1e-4)
    assert svc.fits.get("rep-cold", "elasticity").num_failures == 1

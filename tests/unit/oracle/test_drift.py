"""The oracle reports itself (oracle/core/drift.py, oracle/core/fitlog.py): each window is predicted before it is
learnt and scored against what was measured (rolling error, bias, coverage per model); each GP's source, training
points and fits are logged. And a refit on windows from a device the profile got wrong brings the error down."""
import ast
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from contracts import ModelLoadWindow
from oracle.core import Oracle, OraclePolicy
from oracle.core.drift import DriftTracker, WindowScore
from oracle.core.fitlog import FitLog, fitted_points, source_of
from oracle.gp import gp_oracle
from oracle.profile.grid import GridPoint, LengthMix, load_grid
from oracle.profile.synthetic import roofline_training_set
from oracle.refit import BackgroundRefitter

REPO = Path(__file__).resolve().parents[3]
TTFT_SLO_MS, TPOT_SLO_MS = 300.0, 20.0  # the `profile` fixture's (conftest.py)
CHAT = LengthMix("chat", 400, 0.8, 150)


def window(features, attainment=0.9, num_requests=20, model="qwen"):
    return ModelLoadWindow(model=model, window_s=10.0, end_unix_ms=0.0, num_requests=num_requests,
                           request_rate_rps=num_requests / 10.0, features=features, ttft_attainment=attainment)


def score(error, std=0.1, version="v1", measured=0.5, model="qwen"):
    return WindowScore(model=model, num_replicas=2, measured=measured, predicted_mean=measured + error,
                       predicted_std=std, k_sigma=2.0, source="gp", model_version=version, at_s=0.0)


def test_rolling_error_bias_and_coverage_over_the_last_windows():
    tracker = DriftTracker(max_windows=3, k_sigma=2.0)
    assert tracker.summary("qwen") is None
    for s in (score(0.9), score(0.3), score(-0.1), score(0.25, version="v2")):
        tracker.record(s)
    summary = tracker.summary("qwen")
    assert summary.num_windows == 3 and summary.num_scored == 4  # the first fell out of the rolling window
    assert summary.mean_abs_error == pytest.approx((0.3 + 0.1 + 0.25) / 3)
    assert summary.bias == pytest.approx((0.3 - 0.1 + 0.25) / 3)
    assert summary.coverage == pytest.approx(1 / 3)  # only |-0.1| <= 2 * 0.1
    assert summary.last.model_version == "v2"
    assert summary.num_windows_current == 1 and summary.mean_abs_error_current == pytest.approx(0.25)
    assert tracker.models == ["qwen"]
    with pytest.raises(ValueError):
        DriftTracker(max_windows=0)


def test_windows_without_requests_replicas_or_attainment_are_not_scored(profile):
    oracle = Oracle({"qwen": profile})
    tracker = DriftTracker()
    f = GridPoint(5.0, CHAT, 2).features
    assert tracker.score(oracle, window(f, num_requests=0), 2, 0.0) is None
    assert tracker.score(oracle, window(f), 0, 0.0) is None
    assert tracker.score(oracle, window(f, attainment=None), 2, 0.0) is None
    assert tracker.score(oracle, window(f, model="ghost"), 2, 0.0) is None  # neither a GP nor a roofline
    assert tracker.models == []
    # a caller with a token-level figure passes it instead of the window's TTFT attainment
    s = tracker.score(oracle, window(f, attainment=None), 2, 0.0, attainment=0.5)
    assert s is not None and s.measured == 0.5


def test_a_window_is_scored_against_the_oracle_answer_at_its_replica_count(profile):
    assert (profile.ttft_slo_ms, profile.tpot_slo_ms) == (TTFT_SLO_MS, TPOT_SLO_MS)
    oracle = Oracle({"qwen": profile})
    tracker = DriftTracker(k_sigma=2.0)
    f = GridPoint(5.0, CHAT, 2).features
    truth = profile.roofline.attainment(f, 2, TTFT_SLO_MS, TPOT_SLO_MS)
    s = tracker.score(oracle, window(f, attainment=truth - 0.15), 2, now_s=12.0)
    assert s.source == "roofline" and s.model_version == profile.version and s.at_s == 12.0
    assert s.predicted_mean == pytest.approx(truth) and s.predicted_std == profile.roofline_attainment_std
    assert s.error == pytest.approx(0.15) and s.is_covered  # 0.15 <= 2 * 0.1
    s = tracker.score(oracle, window(f, attainment=truth - 0.25), 2, now_s=13.0)
    assert not s.is_covered
    summary = tracker.summary("qwen")
    assert summary.coverage == 0.5 and summary.mean_abs_error == pytest.approx(0.2)


def test_fit_log_says_where_answers_come_from_and_how_many_points_they_learnt(profile, training_set):
    assert fitted_points("gp-elasticity-identity-logistic-n54-0123abcdef") == 54
    assert fitted_points("roofline-nvidia-h200-qwen2-7b-tp1") == 0
    assert [source_of(v) for v in ("gp-capacity-n3-ab", "roofline-x", "none")] == ["gp", "roofline", "none"]

    oracle = gp_oracle({"qwen": profile}, policy=OraclePolicy(num_train_iters=10))
    oracle.add_training_set(training_set)
    log = FitLog()
    rows = {(r.model, r.kind): r for r in log.status(oracle, ["qwen", "other"], now_s=100.0)}
    qwen = rows[("qwen", "elasticity")]
    assert (qwen.source, qwen.num_points, qwen.num_refits, qwen.last_fit_s, qwen.fit_age_s) == \
        ("roofline", 0, 0, None, None)
    assert qwen.num_samples == len(training_set.elasticity)
    assert rows[("other", "capacity")].source == "none"  # configured, but neither a roofline nor a GP

    oracle.refit("qwen", "elasticity", now_s=0.0)
    log.refitted("qwen", "elasticity", now_s=100.0)
    log.failed("qwen", "capacity", now_s=101.0, error="diverged")
    rows = {(r.model, r.kind): r for r in log.status(oracle, ["qwen"], now_s=130.0)}
    ela, cap = rows[("qwen", "elasticity")], rows[("qwen", "capacity")]
    assert ela.source == "gp" and ela.num_points == len(training_set.elasticity)
    assert (ela.num_refits, ela.num_failures, ela.last_fit_s, ela.fit_age_s) == (1, 0, 100.0, 30.0)
    assert cap.source == "roofline" and (cap.num_refits, cap.num_failures) == (0, 1)
    assert log.get("qwen", "capacity").last_error == "diverged"


def test_report_modules_are_pure():
    """No clock, threads, I/O libraries, torch or bus in the report core (times are passed in)."""
    banned = {"time", "threading", "asyncio", "os", "socket", "torch", "gpytorch", "nats", "runtime", "logging"}
    for name in ("drift.py", "fitlog.py"):
        tree = ast.parse((REPO / "oracle" / "core" / name).read_text())
        imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}
        imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
        assert not imported & banned, (name, imported & banned)
    code = ("import sys, oracle.core.drift, oracle.core.fitlog\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'gpytorch', 'nats', 'runtime')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# --- a refit on what the dispatchers measured reduces the error ------------------------------------------------
SHIFT = 1.6  # the profile believed the device this much faster than it is
NUM_WINDOWS = 50  # the rolling window, and the windows fed before and after the refit


def knee_rps(roofline, mix: LengthMix, m: int) -> float:
    """The request rate where the true attainment of m replicas falls through 0.5 (bisection in log rate)."""
    lo, hi = 0.1, 1000.0
    for _ in range(30):
        mid = (lo * hi) ** 0.5
        if roofline.attainment(GridPoint(mid, mix, m).features, m, TTFT_SLO_MS, TPOT_SLO_MS) >= 0.5:
            lo = mid
        else:
            hi = mid
    return lo


def test_a_refit_on_measured_windows_reduces_the_rolling_error(profile, roofline):
    """The profile's attainment labels are those of a device SHIFT x faster (each label was measured at 1/SHIFT of
    the load it is filed under), so the fitted GP is optimistic past the true knee. Windows drawn from the true
    behaviour around its knee are scored (before they are learnt) and learnt; the refit the background refitter
    runs on them brings the rolling error down."""
    mixes = [CHAT, LengthMix("rag", 2000, 0.5, 100), LengthMix("short", 100, 0.3, 300)]
    truth = roofline_training_set("qwen", roofline, load_grid([2, 5, 10, 20, 40, 80, 160], mixes, [1, 2, 4]),
                                  TTFT_SLO_MS, TPOT_SLO_MS, attainment_noise=0.02, seed=1)
    wrong = replace(truth, capacity=[], elasticity=[
        replace(s, features=s.features.model_copy(update={"token_rate_tps": s.features.token_rate_tps * SHIFT}))
        for s in truth.elasticity])
    policy = OraclePolicy(num_train_iters=20, refit_min_new_samples=NUM_WINDOWS, refit_min_interval_s=0.0,
                          max_grid_replicas=16)
    oracle = gp_oracle({"qwen": profile}, policy=policy)
    oracle.add_training_set(wrong)
    oracle.refit("qwen", "elasticity", now_s=0.0)  # the GP of the wrong profile
    first = oracle.versions("qwen")["elasticity"]
    assert first.startswith("gp-")

    knees = {m: knee_rps(roofline, CHAT, m) for m in (1, 2, 4)}
    rng = np.random.default_rng(3)
    tracker = DriftTracker(max_windows=NUM_WINDOWS)
    clock = {"now": 0.0}

    def feed(n: int) -> None:
        for _ in range(n):  # a model serving chat traffic on 1, 2 or 4 replicas, around the true knee
            m = int(rng.choice([1, 2, 4]))
            rate = knees[m] * float(np.exp(rng.uniform(np.log(0.5), np.log(SHIFT))))
            f = GridPoint(rate, CHAT, m).features
            measured = float(np.clip(roofline.attainment(f, m, TTFT_SLO_MS, TPOT_SLO_MS)
                                     + 0.02 * rng.standard_normal(), 0.0, 1.0))
            w = ModelLoadWindow(model="qwen", window_s=0.5, end_unix_ms=clock["now"] * 1e3, num_requests=50,
                                request_rate_rps=rate, features=f, ttft_attainment=measured)
            clock["now"] += 0.5
            assert tracker.score(oracle, w, m, clock["now"]) is not None  # predicted before it is learnt
            assert oracle.observe(w, m)

    feed(NUM_WINDOWS)
    before = tracker.summary("qwen")
    assert before.num_windows == NUM_WINDOWS and before.last.model_version == first
    assert before.bias > 0.1  # optimistic, as the shifted profile says

    refitter = BackgroundRefitter(oracle, clock=lambda: clock["now"])
    assert oracle.due_for_refit(clock["now"]) == [("qwen", "elasticity")]
    (version,) = refitter.run_once()
    assert version != first and oracle.versions("qwen")["elasticity"] == version

    feed(NUM_WINDOWS)
    after = tracker.summary("qwen")
    assert after.num_windows_current == NUM_WINDOWS and after.last.model_version == version  # all by the new fit
    assert after.mean_abs_error < 0.5 * before.mean_abs_error, (before, after)
    assert abs(after.bias) < 0.5 * before.bias
    assert after.coverage > before.coverage

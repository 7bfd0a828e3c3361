"""Metric definitions on hand-checkable cases."""
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sim.metrics import Outcomes, integrate_steps, on_time_in_uniform_run, on_time_tokens, summarise, time_series
from sim.trace import Trace


def test_token_deadlines_follow_ttft_plus_tpot():
    # arrival 0, TTFT SLO 1 s, TPOT SLO 0.1 s: token i due at 1 + (i-1) * 0.1
    times = [0.9, 1.1, 1.2, 1.5]  # token 1 on time (0.9 <= 1.0), token 2 on time (1.1 <= 1.1),
    # token 3 on time (1.2 <= 1.2), token 4 late (1.5 > 1.3)
    assert on_time_tokens(0.0, times, 1.0, 0.1) == 3
    assert on_time_tokens(0.0, [1.01], 1.0, 0.1) == 0


@given(first=st.floats(0, 5), step=st.floats(0.001, 0.3), n=st.integers(1, 300), due=st.floats(0, 5),
       tpot=st.floats(0.001, 0.3))
@settings(max_examples=300, deadline=None)
@example(first=2.386369994573038e-11, step=0.25, n=1, due=0.0, tpot=0.25)  # within the on-time margin (CI, stop 18)
def test_uniform_run_closed_form_matches_token_by_token(first, step, n, due, tpot):
    times = [first + x * step for x in range(n)]
    # deadlines of this run's tokens: due + x * tpot; build it as arrival + TTFT + (i-1) TPOT with i = x + 1
    expected = on_time_tokens(due, times, 0.0, tpot)
    assert int(on_time_in_uniform_run(first, step, n, due, tpot)) == expected


def _trace(arrivals, apps, outputs, num_apps=2):
    return Trace.build(arrivals, apps, [10] * len(arrivals), outputs, [f"a{i}" for i in range(num_apps)])


def test_summary_counts_failed_tokens_as_late_and_finds_worst_app():
    trace = _trace([0.0, 1.0, 2.0], [0, 0, 1], [4, 2, 5])
    out = Outcomes(first_token_s=np.array([0.5, 1.2, np.nan]), finish_s=np.array([0.8, 1.3, np.nan]),
                   num_on_time_tokens=np.array([4, 1, 0]))
    s = summarise(trace, out, ttft_slo_s=1.0, tpot_slo_s=0.1)
    assert s.token_attainment == pytest.approx(5 / 11)
    assert s.num_failed == 1
    # TTFT: 0.5 ok, 0.2 ok, failed -> 2/3; TPOT: (0.8-0.5)/3 = 0.1 ok, 0.1 ok, failed -> 2/3
    assert s.ttft_attainment == pytest.approx(2 / 3)
    assert s.tpot_attainment == pytest.approx(2 / 3)
    assert s.worst_app == "a1" and s.worst_app_token_attainment == 0.0


def test_device_hours_integrate_the_step_function():
    # 10 devices for the first hour, 20 for the second
    assert integrate_steps([0.0, 3600.0], [10, 20], 0.0, 7200.0) / 3600 == pytest.approx(30.0)
    assert integrate_steps([0.0, 3600.0], [10, 20], 1800.0, 5400.0) / 3600 == pytest.approx(15.0)


def test_time_series_bins_load_and_goodput():
    trace = _trace([0.0, 0.5, 1.5], [0, 0, 1], [10, 10, 10])
    out = Outcomes(np.array([0.1, 0.6, 1.6]), np.array([0.9, 0.9, 1.9]), np.array([10, 5, 10]))
    ts = time_series(trace, out, 1.0, device_time_s=[0.0, 1.0], device_counts=[2, 4])
    assert list(ts.load_rps) == [2.0, 1.0]
    assert ts.token_attainment[0] == pytest.approx(0.75) and ts.token_attainment[1] == pytest.approx(1.0)
    assert ts.goodput_tps.sum() == pytest.approx(25.0)  # every on-time token lands in some bin
    assert list(ts.active_devices) == [2.0, 4.0]


def test_app_reports_count_rejections_by_code_and_rank_the_worst_first():
    from sim.metrics import app_reports, worst_apps

    rejections = [(1.0, 1, "no_instance"), (2.5, 1, "overloaded"), (3.0, 1, "no_instance"), (4.0, 2, "overloaded")]
    reports = app_reports(["a", "b", "c", "idle"], ["m0", "m1", "m2", "m3"], [10, 5, 4, 0],
                          np.array([0.9, 0.2, 0.5, np.nan]), rejections)
    b = reports[1]
    assert b.rejected == {"no_instance": 2, "overloaded": 1}
    assert (b.first_rejection_s, b.last_rejection_s) == (1.0, 3.0)
    assert reports[0].rejected == {} and np.isnan(reports[0].first_rejection_s)
    # the app without requests is left out; the rest by attainment, lowest first
    assert [r.name for r in worst_apps(reports, count=3)] == ["b", "c", "a"]
    assert [r.name for r in worst_apps(reports, count=1)] == ["b"]

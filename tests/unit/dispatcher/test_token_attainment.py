"""Token-level attainment in the dispatcher's load window: finished requests' on-time tokens (the workers count
them), a refused request's expected tokens all late, the window sliding past both."""
from __future__ import annotations

import pytest

from dispatcher.core import DispatchPolicy, DispatcherCore, OverloadPolicy, PublishLoad, ThroughputPrefillModel
from dispatcher.core.load_window import LoadWindow

from .helpers import TOKENS_PER_S, record, rejects, request


def test_no_tokens_due_no_token_attainment():
    w = LoadWindow("m", window_s=2.0, started_ms=0.0).snapshot(100.0, queue_depth=0)
    assert w.token_attainment is None and w.num_tokens_due == 0


def test_outcomes_weigh_by_tokens_not_by_requests():
    window = LoadWindow("m", window_s=2.0, started_ms=0.0)
    window.record_outcome(100.0, 10, 10)
    window.record_outcome(200.0, 30, 0)
    window.record_outcome(250.0, 0, 0)  # no tokens: nothing due
    w = window.snapshot(300.0, queue_depth=0)
    assert w.num_tokens_due == 40 and w.token_attainment == pytest.approx(10 / 40)  # per request it would be 1/2


def test_a_rejection_makes_its_expected_tokens_late():
    window = LoadWindow("m", window_s=2.0, started_ms=0.0)
    window.record_outcome(100.0, 20, 20)
    window.record_rejection(150.0, num_expected_tokens=60)
    window.record_rejection(160.0)  # nothing expected: a late first token only
    w = window.snapshot(200.0, queue_depth=0)
    assert w.num_tokens_due == 80 and w.token_attainment == pytest.approx(0.25)
    assert w.num_rejected == 2 and w.ttft_attainment == 0.0


def test_on_time_tokens_are_clamped_to_the_tokens_due():
    window = LoadWindow("m", window_s=2.0, started_ms=0.0)
    window.record_outcome(100.0, 5, 9)
    window.record_outcome(100.0, 5, -3)
    w = window.snapshot(200.0, queue_depth=0)
    assert w.num_tokens_due == 10 and w.token_attainment == pytest.approx(0.5)


def test_outcomes_leave_the_window_after_window_s():
    window = LoadWindow("m", window_s=2.0, started_ms=0.0)
    window.record_outcome(100.0, 10, 0)
    window.record_outcome(1500.0, 10, 10)
    assert window.snapshot(2000.0, queue_depth=0).token_attainment == pytest.approx(0.5)
    w = window.snapshot(2100.0, queue_depth=0)  # the first one is exactly window_s old: gone
    assert w.num_tokens_due == 10 and w.token_attainment == pytest.approx(1.0)
    w = window.snapshot(3600.0, queue_depth=0)
    assert w.num_tokens_due == 0 and w.token_attainment is None


def _core() -> DispatcherCore:
    policy = DispatchPolicy(publish_period_ms=500.0, window_s=10.0, overload=OverloadPolicy.REJECT)
    return DispatcherCore(policy, ThroughputPrefillModel(TOKENS_PER_S))


def _published(core: DispatcherCore, at_ms: float):
    (window,) = [e.window for e in core.on_tick(at_ms) if isinstance(e, PublishLoad)]
    return window


def test_an_outcome_reaches_the_published_window():
    core = _core()
    core.on_instances(0.0, [record("a")])
    core.on_request(0.0, request("r0", 0.0, tokens=100, output_tokens=8))
    core.on_prefill_done(50.0, "a", "r0")
    assert core.on_request_outcome(300.0, "r0", "m", num_output_tokens=8, num_on_time_tokens=6) == []
    w = _published(core, 500.0)
    assert (w.model, w.num_tokens_due) == ("m", 8) and w.token_attainment == pytest.approx(0.75)
    assert w.ttft_attainment == 1.0  # the first token's count is its own


def test_a_refused_request_counts_its_expected_tokens_late_in_the_published_window():
    core = _core()
    core.on_instances(0.0, [record("a")])
    core.on_request(0.0, request("r0", 0.0, tokens=8000))  # 800 ms of prefill on the one instance
    # r1 cannot make its 1000 ms deadline behind it: refused (the paper's overload rule)
    (reject,) = rejects(core.on_request(1.0, request("r1", 1.0, tokens=8000, output_tokens=12)))
    core.on_prefill_done(800.0, "a", "r0")
    core.on_request_outcome(900.0, "r0", "m", num_output_tokens=4, num_on_time_tokens=4)
    w = _published(core, 1000.0)
    assert reject.request_id == "r1"
    assert w.num_tokens_due == 16 and w.token_attainment == pytest.approx(4 / 16)

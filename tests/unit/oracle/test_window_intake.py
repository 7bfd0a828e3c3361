"""Windows of several dispatchers (oracle/core/intake.py): each dispatcher sees its share of a model's requests
while every replica serves all of them, so the oracle learns and scores the model's merged window, once the
dispatchers' windows cover the same stretch, never one dispatcher's share against the whole replica count."""
from __future__ import annotations

import pytest

from contracts import LoadFeatures, ModelLoadWindow
from oracle.core.drift import DriftTracker
from oracle.core.intake import WindowIntake
from oracle.core.replicas import ReplicaCounts
from oracle.gp import gp_oracle

from .test_oracle import FAST


def share(dispatcher: str, end_ms: float, rate_tps: float, num_requests: int, token_attainment: float,
          num_tokens_due: int) -> ModelLoadWindow:
    return ModelLoadWindow(model="qwen", window_s=10.0, end_unix_ms=end_ms, num_requests=num_requests,
                           request_rate_rps=num_requests / 10.0, dispatcher_id=dispatcher,
                           features=LoadFeatures(token_rate_tps=rate_tps, input_len_mean=400.0,
                                                 input_len_var=320.0 ** 2, output_len_mean=150.0),
                           ttft_attainment=token_attainment, token_attainment=token_attainment,
                           num_tokens_due=num_tokens_due)


def intake() -> WindowIntake:
    counts = ReplicaCounts()
    counts.update("qwen", 3, 0.0)  # three replicas, held since long before the windows
    return WindowIntake(DriftTracker(), counts)


def test_two_dispatchers_shares_are_learnt_as_the_models_whole_load(profile):
    oracle = gp_oracle({"qwen": profile}, policy=FAST)
    book = intake()
    first = book.take(share("d2", 100_000.0, 600.0, 25, 1.0, 300), oracle, oracle, 100.0)
    assert first.is_learnt  # alone so far: d2's window is the model's whole known load
    # d2 has not yet reported this stretch (its last window ended a whole window earlier): nothing taken
    early = book.take(share("d1", 110_000.0, 900.0, 30, 0.9, 600), oracle, oracle, 110.0)
    assert early.window is None and not early.is_learnt and early.score is None
    taken = book.take(share("d2", 110_200.0, 300.0, 10, 0.6, 300), oracle, oracle, 110.2)
    assert taken.is_learnt and taken.score is not None
    merged = taken.window
    assert merged.features.token_rate_tps == pytest.approx(1200.0) and merged.num_requests == 40
    assert merged.token_attainment == pytest.approx((0.9 * 600 + 0.6 * 300) / 900)  # weighted by tokens due
    sample = oracle._elasticity_samples["qwen"][-1]
    assert sample.features.token_rate_tps == pytest.approx(1200.0) and sample.num_replicas == 3
    assert sample.attainment == pytest.approx(0.8)
    assert taken.score.num_replicas == 3 and taken.score.measured == pytest.approx(0.8)


def test_a_dispatcher_gone_silent_stops_holding_the_others_back(profile):
    oracle = gp_oracle({"qwen": profile}, policy=FAST)
    book = intake()
    book.take(share("d1", 100_000.0, 900.0, 30, 0.9, 600), oracle, oracle, 100.0)
    book.take(share("d2", 100_100.0, 300.0, 10, 0.9, 300), oracle, oracle, 100.1)
    assert book.take(share("d1", 110_000.0, 900.0, 30, 0.9, 600), oracle, oracle, 110.0).window is None
    # d2 silent for more than three window lengths: d1's windows are the model's load again
    alone = book.take(share("d1", 131_000.0, 900.0, 30, 0.9, 600), oracle, oracle, 131.0)
    assert alone.window is not None and alone.window.dispatcher_id == "d1"
    assert alone.window.features.token_rate_tps == pytest.approx(900.0)

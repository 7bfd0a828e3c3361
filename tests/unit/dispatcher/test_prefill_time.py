"""Prefill-time predictions: measured throughput first, then the model's figure, then the default."""
from __future__ import annotations

import numpy as np
import pytest

from dispatcher.core import FunctionPrefillModel, PrefillTimeModel, ThroughputPrefillModel

from .helpers import record


def test_throughput_model_prefers_the_measured_figure():
    model = ThroughputPrefillModel(10_000.0, overhead_ms=5.0, tokens_per_s_by_model={"big": 2_000.0})
    assert isinstance(model, PrefillTimeModel)
    assert model.predict_ms(record("a"), 1000) == pytest.approx(105.0)
    assert model.predict_ms(record("a", model="big"), 1000) == pytest.approx(505.0)
    assert model.predict_ms(record("a", model="big", prefill_tokens_per_s=4_000.0), 1000) == pytest.approx(255.0)
    tokens = np.array([1, 10, 1000])
    many = model.predict_many_ms(record("a"), tokens)
    assert many.tolist() == pytest.approx([model.predict_ms(record("a"), int(n)) for n in tokens])


def test_function_model_wraps_a_roofline_style_callable():
    calls = []

    def roofline_ms(instance, num_prompt_tokens):
        calls.append(instance.instance_id)
        return 2.0 + 0.001 * num_prompt_tokens**1.5

    model = FunctionPrefillModel(roofline_ms)
    assert isinstance(model, PrefillTimeModel)
    many = model.predict_many_ms(record("a"), np.array([100, 400]))
    assert many.tolist() == pytest.approx([3.0, 10.0])
    assert model.predict_ms(record("b"), 100) == pytest.approx(3.0)
    assert calls == ["a", "a", "b"]


@pytest.mark.parametrize("kwargs", [{"default_tokens_per_s": 0.0}, {"default_tokens_per_s": float("inf")},
                                    {"default_tokens_per_s": 1.0, "overhead_ms": -1.0},
                                    {"default_tokens_per_s": 1.0, "tokens_per_s_by_model": {"m": -5.0}}])
def test_bad_throughput_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        ThroughputPrefillModel(**kwargs)

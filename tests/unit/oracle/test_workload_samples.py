"""A length mix of telemetry's samples: the synthetic requests draw their (prompt, output) pairs from them."""
import pytest

from oracle.profile.grid import GridPoint, LengthMix
from oracle.profile.workload import synth_requests


def test_a_mix_of_samples_draws_only_those_pairs_and_describes_them():
    pairs = ((10, 5), (200, 40), (3000, 7))
    mix = LengthMix.of_samples("seen", pairs)
    assert mix.input_len_mean == pytest.approx(3210 / 3) and mix.output_len_mean == pytest.approx(52 / 3)
    requests = synth_requests(GridPoint(50.0, mix, 1), 10.0, seed=1, max_prompt_len=4096, max_output_len=4096)
    assert len(requests) > 300
    drawn = {(r.prompt_len, r.output_len) for r in requests}
    assert drawn == set(pairs)  # every pair, nothing else
    # the load a grid point stands for carries the answers' spread (the P/D split prices decode by it)
    outputs = [o for _, o in pairs]
    expected_var = sum((o - 52 / 3) ** 2 for o in outputs) / 3
    assert GridPoint(50.0, mix, 1).features.output_len_var == pytest.approx(expected_var)


def test_a_drawn_mix_describes_the_spread_of_the_answers_it_draws():
    mix = LengthMix("chat", input_len_mean=256, input_len_cv=1.0, output_len_mean=200)
    requests = synth_requests(GridPoint(400.0, mix, 1), 50.0, seed=3, max_prompt_len=4096, max_output_len=4096)
    outputs = [r.output_len for r in requests]
    mean = sum(outputs) / len(outputs)
    var = sum((o - mean) ** 2 for o in outputs) / len(outputs)
    assert GridPoint(400.0, mix, 1).features.output_len_var == pytest.approx(var, rel=0.15)


def test_samples_are_clipped_to_what_the_target_serves_and_an_empty_mix_is_refused():
    mix = LengthMix.of_samples("long", ((9000, 900),))
    requests = synth_requests(GridPoint(5.0, mix, 1), 4.0, seed=0, max_prompt_len=4096, max_output_len=512)
    assert {(r.prompt_len, r.output_len) for r in requests} == {(4096, 512)}
    with pytest.raises(ValueError):
        LengthMix.of_samples("none", ())

"""The prefill/decode split's band (`ElasticPolicy.pd_split_band_frac`): a disaggregated model keeps its decode
instances while a window's noise would move fewer than the band from decode to prefill, and follows a real shift of
its load; a move towards decode goes through at once."""
from __future__ import annotations

import pytest
from planner_test_oracles import TableOracle, bare_elastic, window

from contracts import LoadFeatures
from planner.core.elastic import ElasticScaler, keep_split
from planner.core.policy import ElasticPolicy


def test_the_band_is_off_by_default():
    assert ElasticPolicy().pd_split_band_frac == 0.0
    assert keep_split((11, 10), (10, 11), 0.0) == (10, 11)


@pytest.mark.parametrize("before,after,band,kept", [
    ((10, 11), (11, 10), 0.1, (10, 11)),  # one of 21 from decode to prefill: under 2.1, kept
    ((10, 11), (12, 9), 0.1, (10, 11)),  # two of 21: under 2.1, kept
    ((10, 11), (13, 8), 0.1, (13, 8)),  # three of 21: the split follows
    ((11, 10), (10, 11), 0.5, (10, 11)),  # towards decode: at once, whatever the band
    ((11, 10), (12, 11), 0.1, (11, 12)),  # a count that grows keeps the prefill count: the new one decodes
    ((5, 1), (1, 6), 0.9, (1, 6)),  # a grown count towards decode: its own
    ((11, 10), (9, 10), 0.1, (9, 10)),  # a count that shrinks takes its own split
    ((4, 0), (3, 3), 0.5, (3, 3)),  # colocated before: nothing to keep
    ((3, 3), (6, 0), 0.5, (6, 0)),  # colocated after
    ((0, 0), (5, 5), 0.5, (5, 5)),  # a model's first plan
])
def test_keep_split(before, after, band, kept):
    assert keep_split(before, after, band) == kept


def _splits(band_frac: float, output_lens: list[float]) -> list[tuple[int, int]]:
    """The split of one model at a steady token rate, a window per plan with these answer lengths."""
    policy = bare_elastic(target_attainment=0.95, is_debounced=False, decode_token_cost_ratio=1.0,
                          min_num_disaggregated=3, pd_split_band_frac=band_frac)
    scaler = ElasticScaler(TableOracle(per_replica_tps=200.0), policy)
    out = []
    for i, output_len in enumerate(output_lens):
        now_ms = 1000.0 + 500.0 * i
        load = LoadFeatures(token_rate_tps=4000.0, input_len_mean=500.0, input_len_var=0.0,
                            output_len_mean=output_len)
        scaler.observe(window("hot", 20.0, now_ms).model_copy(update={"features": load}))
        target = scaler.tick(now_ms, ["hot"], budget_devices=100).plan.targets[0]
        out.append((target.num_prefill, target.num_decode))
    return out


def test_a_window_wandering_around_a_boundary_flips_the_split_without_the_band_and_not_with_it():
    wandering = [500.0, 600.0] * 4
    without = _splits(0.0, wandering)
    assert len(set(without)) == 2 and without[0] != without[1], without  # it flips every plan
    more_decode = max(without, key=lambda pd: pd[1])
    held = _splits(0.2, wandering)
    # the first move towards decode goes through, and the split stays there: no decode instance drains again
    assert held[1:] == [more_decode] * (len(held) - 1), held
    assert {sum(pd) for pd in held} == {sum(pd) for pd in without}  # the band moves roles, never the count


def test_a_real_shift_of_the_load_moves_the_split_through_the_band():
    towards_decode = _splits(0.2, [500.0, 500.0, 1500.0, 1500.0])
    assert towards_decode[3][1] / sum(towards_decode[3]) > towards_decode[1][1] / sum(towards_decode[1]) + 0.2
    towards_prefill = _splits(0.2, [1500.0, 1500.0, 300.0, 300.0])  # short answers: most instances prefill
    assert towards_prefill[3][0] / sum(towards_prefill[3]) > towards_prefill[1][0] / sum(towards_prefill[1]) + 0.2

"""bench/oracle.py's folds: every capacity sample lands in its grid point's fold, and the samples without capacity
(a disaggregated point, a knee search's pilot run appended after the grid) take none, so a profile of the
simulated device (which has both) is cross-validated instead of refused."""
from __future__ import annotations

import numpy as np
import pytest

from bench.oracle import folds_of
from contracts import LoadFeatures, NeedVector
from oracle.core import TrainingSet
from oracle.core.dataset import CapacitySample, ElasticitySample


def features(rate_tps: float) -> LoadFeatures:
    return LoadFeatures(token_rate_tps=rate_tps, input_len_mean=500.0, input_len_var=1e4, output_len_mean=50.0)


def profile(layouts: list[tuple[int, int]], num_pilots: int, num_capacity: int | None = None) -> TrainingSet:
    """`layouts`: (replicas, decode instances) per grid point; each colocated point holds one capacity sample per
    replica, tagged with its point's rate so the test can tell which point it came from."""
    ts = TrainingSet(model="m")
    ts.meta["points"] = [{"num_replicas": m, "num_decode": d} for m, d in layouts]
    for index, (m, d) in enumerate(layouts):
        ts.elasticity.append(ElasticitySample(features(100.0 * (index + 1)), m, 0.99))
        if not d:
            ts.capacity += [CapacitySample(features(100.0 * (index + 1)), NeedVector(hbm=0.1, compute=0.1,
                                                                                     bandwidth=0.1))] * m
    ts.elasticity += [ElasticitySample(features(7.0), 1, 0.5, source="pilot") for _ in range(num_pilots)]
    if num_capacity is not None:
        ts.capacity = ts.capacity[:num_capacity]
    return ts


def test_each_capacity_sample_is_in_its_points_fold_and_pilots_take_none():
    ts = profile([(1, 0), (2, 0), (4, 1), (8, 1), (2, 0)], num_pilots=3)
    point_fold, capacity_fold = folds_of(ts, num_folds=3, seed=0)
    assert len(point_fold) == len(ts.elasticity) and len(capacity_fold) == len(ts.capacity) == 5
    by_rate = {s.features.token_rate_tps: f for s, f in zip(ts.elasticity, point_fold)}
    assert [by_rate[s.features.token_rate_tps] for s in ts.capacity] == list(capacity_fold)
    assert set(np.unique(point_fold)) <= {0, 1, 2}


def test_a_profile_whose_capacity_does_not_match_its_points_is_refused():
    with pytest.raises(SystemExit, match="do not line up"):
        folds_of(profile([(1, 0), (2, 0)], num_pilots=2, num_capacity=2), num_folds=2, seed=0)

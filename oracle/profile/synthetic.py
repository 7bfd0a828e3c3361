"""Training sets computed from a roofline model instead of measured: the simulator's ground truth, and a
deterministic data source for tests. Optional multiplicative noise on needs and additive noise on attainment
(seeded) stands in for measurement noise; say which when you quote a figure made from it."""
from __future__ import annotations

import numpy as np

from contracts import NeedVector

from ..core.dataset import CapacitySample, ElasticitySample, TrainingSet
from ..core.oracle import roofline_meta
from ..roofline import RooflineModel
from .grid import GridPoint


def roofline_training_set(model: str, roofline: RooflineModel, grid: list[GridPoint], ttft_slo_ms: float,
                          tpot_slo_ms: float, need_noise_rel: float = 0.0, attainment_noise: float = 0.0,
                          seed: int = 0) -> TrainingSet:
    rng = np.random.default_rng(seed)
    out = TrainingSet(model=model, device=roofline.device.name, shape=roofline.shape.name, ttft_slo_ms=ttft_slo_ms,
                      tpot_slo_ms=tpot_slo_ms, meta={"source": "roofline", "need_noise_rel": need_noise_rel,
                                                     "attainment_noise": attainment_noise, "seed": seed,
                                                     **roofline_meta(roofline)})
    for point in grid:
        features = point.features
        per_replica = features.model_copy(update={"token_rate_tps": features.token_rate_tps / point.num_replicas})
        needs = np.array(roofline.needs(per_replica, tpot_slo_ms).as_tuple())
        needs = needs * np.exp(need_noise_rel * rng.standard_normal(3))
        out.capacity.append(CapacitySample(per_replica, NeedVector(hbm=needs[0], compute=needs[1], bandwidth=needs[2]),
                                           source="roofline"))
        value = roofline.attainment(features, point.num_replicas, ttft_slo_ms, tpot_slo_ms)
        value = float(np.clip(value + attainment_noise * rng.standard_normal(), 0.0, 1.0))
        out.elasticity.append(ElasticitySample(features, point.num_replicas, value, source="roofline"))
    return out

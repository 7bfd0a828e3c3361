"""Deterministic oracles for the planner tests: real closed-form functions (not mocks) answering the same two
batched calls as oracle.Oracle, so each test knows the exact answer to expect."""
from __future__ import annotations

import math
from collections.abc import Callable

from contracts import (
    CapacityPrediction,
    CapacityQuery,
    CapacityReply,
    ElasticityPrediction,
    ElasticityQuery,
    ElasticityReply,
    LoadFeatures,
    ModelLoadWindow,
    NeedVector,
)


# The paper's bare scaler: no burst headroom, no scale-in band, no backlog term, no keep-alive, no decode floor, the
# old cap. Tests that check one of those rules switch it on by name over this.
BARE_ELASTIC = dict(load_headroom=1.0, scale_in_headroom=1.0, backlog_drain_s=0.0, keepalive_s=0.0,
                    max_num_replicas=64, decode_kv_fill_target=None)


def bare_elastic(**knobs):
    from planner.core.policy import ElasticPolicy

    return ElasticPolicy(**{**BARE_ELASTIC, **knobs})


def features(token_rate_tps: float, input_len_mean: float = 512.0, output_len_mean: float = 128.0) -> LoadFeatures:
    return LoadFeatures(
        token_rate_tps=token_rate_tps, input_len_mean=input_len_mean, input_len_var=0.0,
        output_len_mean=output_len_mean,
    )


def window(model: str, rate_rps: float, end_ms: float, window_s: float = 10.0, **kw: float) -> ModelLoadWindow:
    tokens = rate_rps * (kw.get("input_len_mean", 512.0) + kw.get("output_len_mean", 128.0))
    return ModelLoadWindow(
        model=model, window_s=window_s, end_unix_ms=end_ms, num_requests=int(rate_rps * window_s),
        request_rate_rps=rate_rps, features=features(tokens, **kw),
    )


class TableOracle:
    """Capacity: a fixed need vector per model (mean), std 0.01 each; unknown models need `default`.
    Elasticity: attainment(m) = 1 - exp(-m / (token_rate / per_replica_tps)), std 0.005; the bound is
    non-decreasing in m as the contract requires. Counts calls so tests can check batching."""

    def __init__(
        self,
        needs: dict[str, tuple[float, float, float]] | None = None,
        default: tuple[float, float, float] = (0.1, 0.1, 0.1),
        per_replica_tps: float = 1000.0,
        attainment: Callable[[str, LoadFeatures, int], float] | None = None,
        version: str = "test-v1",
        decode_token_cost_ratio: float | None = None,
    ) -> None:
        self.needs = needs or {}
        self.default = default
        self.per_replica_tps = per_replica_tps
        self._attainment = attainment
        self.version = version
        self.decode_token_cost_ratio = decode_token_cost_ratio  # what a calibrated oracle measured (None: none)
        self.num_capacity_calls = 0
        self.num_elasticity_calls = 0
        self.asked: list[tuple[str, int]] = []

    def attainment(self, model: str, feats: LoadFeatures, m: int) -> float:
        if self._attainment is not None:
            return self._attainment(model, feats, m)
        load = feats.token_rate_tps / self.per_replica_tps
        return 1.0 if load <= 0 else 1.0 - math.exp(-3.0 * m / load)

    def capacity(self, query: CapacityQuery) -> CapacityReply:
        self.num_capacity_calls += 1
        preds = []
        for item in query.items:
            mean = self.needs.get(item.model, self.default)
            std = (0.01, 0.01, 0.01)
            bound = tuple(mu + query.k_sigma * s for mu, s in zip(mean, std))
            preds.append(CapacityPrediction(
                model=item.model,
                mean=NeedVector(hbm=mean[0], compute=mean[1], bandwidth=mean[2]),
                std=NeedVector(hbm=std[0], compute=std[1], bandwidth=std[2]),
                bound=NeedVector(hbm=bound[0], compute=bound[1], bandwidth=bound[2]),
                model_version=self.version, source="test",
            ))
        return CapacityReply(predictions=tuple(preds))

    def elasticity(self, query: ElasticityQuery) -> ElasticityReply:
        self.num_elasticity_calls += 1
        preds = []
        for item in query.items:
            means = [self.attainment(item.model, item.features, m) for m in item.replicas]
            stds = [0.005] * len(means)
            bounds = [max(0.0, mu - query.k_sigma * s) for mu, s in zip(means, stds)]
            self.asked.extend((item.model, m) for m in item.replicas)
            preds.append(ElasticityPrediction(
                model=item.model, replicas=item.replicas, attainment_mean=tuple(means),
                attainment_std=tuple(stds), attainment_bound=tuple(bounds), model_version=self.version,
                source="test", decode_token_cost_ratio=self.decode_token_cost_ratio,
            ))
        return ElasticityReply(predictions=tuple(preds))

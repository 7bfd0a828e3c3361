"""A memo in front of the oracle for the simulator's planners.

The elastic scaler asks the oracle ~8 times per model every 0.5 s; on the roofline path each answer runs the
equilibrium iteration (~0.3 ms). Loads a few per cent apart get the same answer here: features are bucketed on a
log scale (`resolution`, default 5 %) before the oracle sees them, and answers are remembered per (model, bucket,
m). At 5 % the change is below the noise of the 5 s load windows the planners read (a window of 100 requests
has ~10 % Poisson noise in its rate)."""
from __future__ import annotations

import math

from contracts import (CapacityItem, CapacityQuery, CapacityReply, ElasticityItem, ElasticityPrediction,
                       ElasticityQuery, ElasticityReply, LoadFeatures)

MAX_ENTRIES = 200_000


def bucket(value: float, resolution: float) -> float:
    """The representative of `value`'s log bucket (0 stays 0)."""
    if value <= 0:
        return 0.0
    step = math.log1p(resolution)
    return math.exp(round(math.log(value) / step) * step)


class CachedOracle:
    """OracleLike: answers from `oracle` for bucketed features, memoised per (model, features, m)."""

    def __init__(self, oracle, resolution: float = 0.05):
        if not resolution > 0:
            raise ValueError("resolution must be > 0")
        self.oracle = oracle
        self.resolution = resolution
        self._elasticity: dict[tuple, tuple[float, float, float, str, str]] = {}
        self._bucketed: dict[tuple[float, float, float, float, float], LoadFeatures] = {}
        self.num_hits = 0
        self.num_misses = 0

    def clear(self) -> None:
        """Forget every answer (the oracle refitted: its answers changed)."""
        self._elasticity.clear()

    def _features(self, f: LoadFeatures) -> LoadFeatures:
        # a search asks the same load once per round: remember the bucketed copy of each load seen lately
        raw = (f.token_rate_tps, f.input_len_mean, f.input_len_var, f.output_len_mean, f.output_len_var)
        bucketed = self._bucketed.get(raw)
        if bucketed is None:
            if len(self._bucketed) >= MAX_ENTRIES:
                self._bucketed.clear()
            r = self.resolution
            bucketed = self._bucketed[raw] = LoadFeatures.model_construct(
                token_rate_tps=bucket(f.token_rate_tps, r), input_len_mean=bucket(f.input_len_mean, r),
                input_len_var=bucket(f.input_len_var, 5 * r), output_len_mean=bucket(f.output_len_mean, r),
                output_len_var=bucket(f.output_len_var, 5 * r))
        return bucketed

    def capacity(self, query: CapacityQuery) -> CapacityReply:
        items = tuple(CapacityItem.model_construct(model=i.model, features=self._features(i.features))
                      for i in query.items)
        return self.oracle.capacity(CapacityQuery.model_construct(items=items, k_sigma=query.k_sigma))

    def elasticity(self, query: ElasticityQuery) -> ElasticityReply:
        keyed = []
        answers: dict[tuple, tuple[float, float, float, str, str]] = {}
        missing: dict[int, list[int]] = {}
        for index, item in enumerate(query.items):
            f = self._features(item.features)
            fkey = (item.model, f.token_rate_tps, f.input_len_mean, f.input_len_var, f.output_len_mean,
                    f.output_len_var, query.k_sigma)
            keyed.append((item, f, fkey))
            for m in item.replicas:
                hit = self._elasticity.get((fkey, m))
                if hit is not None:
                    self.num_hits += 1
                    answers[(fkey, m)] = hit
                elif (fkey, m) not in answers:
                    self.num_misses += 1
                    missing.setdefault(index, []).append(m)
        if missing:
            asks = tuple(ElasticityItem.model_construct(model=keyed[i][0].model, features=keyed[i][1],
                                                        replicas=tuple(ms)) for i, ms in missing.items())
            reply = self.oracle.elasticity(ElasticityQuery.model_construct(items=asks, k_sigma=query.k_sigma))
            for i, pred in zip(missing, reply.predictions):
                fkey = keyed[i][2]
                for k, m in enumerate(pred.replicas):
                    answers[(fkey, m)] = (pred.attainment_mean[k], pred.attainment_std[k],
                                          pred.attainment_bound[k], pred.model_version, pred.source,
                                          pred.decode_token_cost_ratio)
            if len(self._elasticity) + len(answers) > MAX_ENTRIES:
                self._elasticity.clear()
            self._elasticity.update(answers)
        predictions = []
        for item, _, fkey in keyed:
            got = [answers[(fkey, m)] for m in item.replicas]
            means, stds, bounds, versions, sources, ratios = zip(*got) if got else ((),) * 6  # one transpose
            # the decode-over-prefill token cost goes with the answer: the scaler splits P/D by it
            # (planner.core.split_prefill_decode), as it does live
            predictions.append(ElasticityPrediction.model_construct(
                model=item.model, replicas=tuple(item.replicas), attainment_mean=means, attainment_std=stds,
                attainment_bound=bounds, model_version=versions[0] if got else "", source=sources[0] if got else "",
                decode_token_cost_ratio=ratios[0] if got else None))
        return ElasticityReply.model_construct(predictions=tuple(predictions))

"""m* = min{m : attainment_bound(z, m) >= target} for every elastic model, by binary search over the oracle's
Elasticity predictions.

Two ways to ask the oracle, same answer (the bound is non-decreasing in m, the oracle's contract):
  - "bisect": one batched call per search round for all models together, each unresolved model asking one m, so a
    tick costs 1 + ceil(log2(max_num_replicas - 1)) calls and about that many evaluations per model;
  - "grid": one batched call asking every m in 1..max_num_replicas, then the same binary search on the reply. Cheaper
    when the oracle evaluates its whole m grid per item anyway (the GP path with a monotone correction does).

When even `max_num_replicas` misses the target (a conservative bound may never reach it: a roofline answer with a
wide sigma, a load past what any count serves), more replicas than the bound's saturation point buy nothing the
oracle can see, so m* is the least m whose bound is within `saturation_eps` of the bound at the cap, flagged
unreachable."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from contracts import ElasticityItem, ElasticityPrediction, ElasticityQuery, LoadFeatures

from .oracle_port import OracleAnswerError, OracleLike

SearchMode = Literal["bisect", "grid"]


@dataclass(frozen=True)
class ReplicaSearch:
    """The result for one model: m*, whether the target is reachable within the cap, and every prediction asked."""

    model: str
    num_replicas: int
    is_reachable: bool
    prediction: ElasticityPrediction  # all m asked, sorted
    num_rounds: int


class _Asker:
    """Batched questions to the oracle, remembering every answer."""

    def __init__(self, oracle: OracleLike, features: Mapping[str, LoadFeatures], k_sigma: float) -> None:
        self.oracle, self.features, self.k_sigma = oracle, features, k_sigma
        self.seen: dict[str, dict[int, tuple[float, float, float]]] = {m: {} for m in features}
        self.versions: dict[str, tuple[str, str]] = {}
        self.num_rounds = 0

    def ask(self, asks: Mapping[str, tuple[int, ...]]) -> None:
        asks = {m: tuple(r for r in reps if r not in self.seen[m]) for m, reps in asks.items()}
        asks = {m: reps for m, reps in asks.items() if reps}
        if not asks:
            return
        self.num_rounds += 1
        # Built without validation: validated features, and replica counts the search made (1 <= m <= cap).
        query = ElasticityQuery.model_construct(
            items=tuple(ElasticityItem.model_construct(model=m, features=self.features[m], replicas=r)
                        for m, r in asks.items()),
            k_sigma=self.k_sigma,
        )
        answered = {p.model: p for p in self.oracle.elasticity(query).predictions}
        for m, reps in asks.items():
            p = answered.get(m)
            if p is None or not set(reps) <= set(p.replicas):
                raise OracleAnswerError(f"the oracle's elasticity reply lacks {m} at m={reps}")
            for r, mean, std, bound in zip(p.replicas, p.attainment_mean, p.attainment_std, p.attainment_bound):
                self.seen[m][r] = (mean, std, bound)
            self.versions[m] = (p.model_version, p.source)

    def bound(self, model: str, m: int) -> float:
        return self.seen[model][m][2]

    def prediction(self, model: str) -> ElasticityPrediction:
        reps = sorted(self.seen[model])
        version, source = self.versions[model]
        s = self.seen[model]
        return ElasticityPrediction(
            model=model, replicas=tuple(reps), attainment_mean=tuple(s[r][0] for r in reps),
            attainment_std=tuple(s[r][1] for r in reps), attainment_bound=tuple(s[r][2] for r in reps),
            model_version=version, source=source,
        )


def search_min_replicas(
    oracle: OracleLike,
    features: Mapping[str, LoadFeatures],
    target_attainment: float,
    k_sigma: float,
    max_num_replicas: int,
    mode: SearchMode = "bisect",
    saturation_eps: float = 0.005,
    hints: Mapping[str, int] | None = None,
) -> dict[str, ReplicaSearch]:
    """Binary search per model (see the module docstring for the two modes and the unreachable case).

    `hints`: a likely m* per model (the last tick's). Bisect then also asks hint - 1 and hint in its first call;
    when the answer is still the hint (the common case 0.5 s later) the search ends there, else it goes on between
    the closest counts known to miss and to meet. The bound is non-decreasing in m, so the answer is the same as
    without hints; only fewer questions are asked."""
    if max_num_replicas < 1:
        raise ValueError("max_num_replicas must be >= 1")
    if k_sigma < 0:
        raise ValueError(f"k_sigma must be >= 0, got {k_sigma}")
    if mode not in ("bisect", "grid"):
        raise ValueError(f"unknown search mode {mode!r}")
    asker = _Asker(oracle, features, k_sigma)
    cap = max_num_replicas
    if mode == "grid":
        asker.ask({m: tuple(range(1, cap + 1)) for m in features})
    else:
        asker.ask({m: _first_asks(cap, (hints or {}).get(m)) for m in features})
    threshold: dict[str, float] = {}
    reachable: dict[str, bool] = {}
    for m in features:
        reachable[m] = asker.bound(m, cap) >= target_attainment
        threshold[m] = target_attainment if reachable[m] else asker.bound(m, cap) - saturation_eps
    lo: dict[str, int] = {}  # largest m known to miss the threshold
    hi: dict[str, int] = {}  # smallest m known to meet it (cap always does)
    result: dict[str, int] = {}
    for m in features:
        if asker.bound(m, 1) >= threshold[m]:
            result[m] = 1
            continue
        seen = asker.seen[m]
        lo[m] = max(r for r in seen if seen[r][2] < threshold[m])
        hi[m] = min(r for r in seen if r > lo[m] and seen[r][2] >= threshold[m])
        if hi[m] - lo[m] <= 1:
            result[m] = hi[m]
            del lo[m], hi[m]
    while lo:
        asker.ask({m: ((lo[m] + hi[m]) // 2,) for m in lo})
        for m in list(lo):
            mid = (lo[m] + hi[m]) // 2
            if asker.bound(m, mid) >= threshold[m]:
                hi[m] = mid
            else:
                lo[m] = mid
            if hi[m] - lo[m] <= 1:
                result[m] = hi[m]
                del lo[m], hi[m]
    return {
        m: ReplicaSearch(m, result[m], reachable[m], asker.prediction(m), asker.num_rounds) for m in features
    }


def _first_asks(cap: int, hint: int | None) -> tuple[int, ...]:
    """1 and the cap (reachability), and around a hint: hint - 1 and hint, inside [1, cap]."""
    asks = {1, cap}
    if hint is not None:
        asks |= {r for r in (hint - 1, hint) if 1 <= r <= cap}
    return tuple(sorted(asks))

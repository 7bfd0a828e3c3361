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
unreachable. Except when the bound at the cap is itself within `saturation_eps` of 0: then no count the oracle can
see serves the load (a burst past what the cap serves), every count looks alike, and the least of them would take a
busy model down to one replica in the middle of its burst (60 -> 1 on the headline before this rule). m* is then
the cap: more replicas serve more of an overload, and the budget scales it down with everyone else."""
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
    target_attainment: float = 0.0  # the target searched for
    # unreachable because no count the oracle can see serves the load (the bound at the cap within saturation_eps of
    # 0: m* is the cap), not because the bound creeps below the target
    is_overloaded: bool = False


class _Asker:
    """Batched questions to the oracle, remembering every answer."""

    def __init__(self, oracle: OracleLike, features: Mapping[str, LoadFeatures], k_sigma: float) -> None:
        self.oracle, self.features, self.k_sigma = oracle, features, k_sigma
        self.seen: dict[str, dict[int, tuple[float, float, float]]] = {m: {} for m in features}
        self.versions: dict[str, tuple[str, str]] = {}
        self.ratios: dict[str, float | None] = {}
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
            self.ratios[m] = p.decode_token_cost_ratio

    def bound(self, model: str, m: int) -> float:
        return self.seen[model][m][2]

    def prediction(self, model: str) -> ElasticityPrediction:
        reps = sorted(self.seen[model])
        version, source = self.versions[model]
        s = self.seen[model]
        return ElasticityPrediction(
            model=model, replicas=tuple(reps), attainment_mean=tuple(s[r][0] for r in reps),
            attainment_std=tuple(s[r][1] for r in reps), attainment_bound=tuple(s[r][2] for r in reps),
            model_version=version, source=source, decode_token_cost_ratio=self.ratios.get(model),
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

    `hints`: a likely m* per model (the last tick's). Bisect then asks only hint - 1 and hint in its first call;
    when the answer is still the hint (the common case 0.5 s later) the search ends there, with two evaluations
    rather than four (1 and the cap are not needed: the hint meeting the target shows the cap does). Else it asks
    the end the answer lies towards (1, or the cap) with the next count past the hint, and bisects between the
    closest counts known to miss and to meet. The bound is non-decreasing in m, so the answer is the same as
    without hints; only fewer questions are asked."""
    if max_num_replicas < 1:
        raise ValueError("max_num_replicas must be >= 1")
    if k_sigma < 0:
        raise ValueError(f"k_sigma must be >= 0, got {k_sigma}")
    if mode not in ("bisect", "grid"):
        raise ValueError(f"unknown search mode {mode!r}")
    asker = _Asker(oracle, features, k_sigma)
    cap = max_num_replicas
    hints = {m: h for m, h in (hints or {}).items() if m in features and 1 <= h <= cap}
    if mode == "grid":
        asker.ask({m: tuple(range(1, cap + 1)) for m in features})
    else:
        asker.ask({m: _first_asks(cap, hints.get(m)) for m in features})
    result: dict[str, _Answer] = {}
    pending = list(features)
    while pending:
        asks: dict[str, tuple[int, ...]] = {}
        for m in pending:
            step = _next_step(asker.seen[m], cap, target_attainment, saturation_eps, hints.get(m))
            if isinstance(step, _Answer):
                result[m] = step
            else:
                asks[m] = step
        pending = list(asks)
        if asks:
            asker.ask(asks)
    return {m: ReplicaSearch(m, result[m].num_replicas, result[m].is_reachable, asker.prediction(m), asker.num_rounds,
                             target_attainment, result[m].is_overloaded) for m in features}


@dataclass(frozen=True)
class _Answer:
    num_replicas: int
    is_reachable: bool
    is_overloaded: bool = False


def _next_step(seen: Mapping[int, tuple[float, float, float]], cap: int, target: float, saturation_eps: float,
               hint: int | None) -> _Answer | tuple[int, ...]:
    """One model's answer from the bounds seen so far, or the counts to ask next. The bound is non-decreasing in m,
    so a count that meets the target shows the cap reaches it too, and m* lies between the largest count seen to
    miss and the smallest seen to meet."""
    bounds = {r: values[2] for r, values in seen.items()}
    if any(b >= target for b in bounds.values()):
        threshold, is_reachable = target, True
    elif cap in bounds:
        if bounds[cap] <= saturation_eps:
            return _Answer(cap, False, True)  # overloaded at every count: the cap (see the module docstring)
        threshold, is_reachable = bounds[cap] - saturation_eps, False
    else:  # everything seen misses: is the target reachable at all? (and, next to a hint, one count up)
        return tuple(sorted({cap} | ({hint + 1} if hint is not None and hint + 1 < cap else set())))
    lo = max((r for r, b in bounds.items() if b < threshold), default=0)  # the largest count known to miss
    if lo == 0 and 1 not in bounds:  # nothing seen misses: is one enough? (and, next to a hint, one count down)
        return tuple(sorted({1} | ({hint - 2} if hint is not None and hint - 2 > 1 else set())))
    hi = min((r for r, b in bounds.items() if r > lo and b >= threshold), default=None)
    if hi is None:  # only an oracle breaking monotonicity gets here: the cap settles it
        if cap not in bounds:
            return (cap,)
        hi = cap
    if hi - lo <= 1:
        return _Answer(hi, is_reachable)
    return ((lo + hi) // 2,)


def _first_asks(cap: int, hint: int | None) -> tuple[int, ...]:
    """Around a hint (inside [1, cap]): hint - 1 and hint, which settle the search when the hint is still right.
    Without one: 1 and the cap (reachability), for the bisection."""
    if hint is None:
        return tuple(sorted({1, cap}))
    return tuple(r for r in (hint - 1, hint) if r >= 1)

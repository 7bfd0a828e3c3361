"""The seam between the planner cores and the oracle.

The real `oracle.Oracle` (and its roofline fallback) answer exactly these two batched calls; the simulator passes the
same object, and the planner service passes a thin client that does request/reply on the bus."""
from __future__ import annotations

from typing import Protocol, runtime_checkable

from contracts import CapacityQuery, CapacityReply, ElasticityQuery, ElasticityReply


@runtime_checkable
class OracleLike(Protocol):
    """Batched predictions with uncertainty and the version of the model that made them."""

    def capacity(self, query: CapacityQuery) -> CapacityReply:
        """Need vectors (mean, std, bound = mean + k*sigma) per model, as device fractions."""
        ...

    def elasticity(self, query: ElasticityQuery) -> ElasticityReply:
        """SLO attainment per model for each replica count asked; the bound is non-decreasing in m."""
        ...


class OracleAnswerError(ValueError):
    """The oracle's reply does not answer the query (a model or a replica count missing)."""

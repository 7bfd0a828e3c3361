"""Planner <-> oracle: batched predictions with uncertainty and the version of the model that made them."""
from __future__ import annotations

from pydantic import Field, model_validator

from .base import Message
from .telemetry import LoadFeatures


class NeedVector(Message):
    """A model's needs as fractions of one device in each dimension (a bin has capacity 1 in each)."""

    hbm: float = Field(ge=0)
    compute: float = Field(ge=0)
    bandwidth: float = Field(ge=0)

    def as_tuple(self) -> tuple[float, float, float]:
        return (self.hbm, self.compute, self.bandwidth)


class CapacityItem(Message):
    model: str
    features: LoadFeatures


class CapacityQuery(Message):
    items: tuple[CapacityItem, ...]
    k_sigma: float = Field(default=1.0, ge=0, description="conservative bound = mean + k*sigma")


class CapacityPrediction(Message):
    model: str
    mean: NeedVector
    std: NeedVector
    bound: NeedVector
    model_version: str = Field(description="which fitted model produced this (recorded in plans)")
    source: str = Field(default="gp", description="gp | roofline (no profile yet)")


class CapacityReply(Message):
    predictions: tuple[CapacityPrediction, ...]


class ElasticityItem(Message):
    model: str
    features: LoadFeatures
    replicas: tuple[int, ...] = Field(min_length=1, description="replica counts m to evaluate")


class ElasticityQuery(Message):
    items: tuple[ElasticityItem, ...]
    k_sigma: float = Field(default=1.0, ge=0, description="conservative bound = attainment - k*sigma")


class ElasticityPrediction(Message):
    """Attainment for each m asked; `bound` is non-decreasing in m (enforced, the GP does not give it)."""

    model: str
    replicas: tuple[int, ...]
    attainment_mean: tuple[float, ...]
    attainment_std: tuple[float, ...]
    attainment_bound: tuple[float, ...]
    model_version: str
    source: str = "gp"
    # Device time of one decode token over one prefill token for this model's load, from a roofline fitted to steps
    # measured on the device (a profile); None where the oracle has measured none: the scaler then splits prefill
    # from decode with its policy's `decode_token_cost_ratio`.
    decode_token_cost_ratio: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _same_lengths(self) -> "ElasticityPrediction":
        n = len(self.replicas)
        if not (len(self.attainment_mean) == len(self.attainment_std) == len(self.attainment_bound) == n):
            raise ValueError("one attainment per replica count")
        return self


class ElasticityReply(Message):
    predictions: tuple[ElasticityPrediction, ...]

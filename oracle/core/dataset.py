"""Training samples and the one JSON format profiles and telemetry are stored in (docs/oracle.md, "Training sets").

    {"format": "janus.oracle.training-set/v1", "model": ..., "device": ..., "shape": ..., "ttft_slo_ms": ...,
     "tpot_slo_ms": ..., "created_unix_s": ..., "meta": {...},
     "capacity": [{"features": {...LoadFeatures}, "needs": {"hbm", "compute", "bandwidth"}, "source": ...}, ...],
     "elasticity": [{"features": {...}, "num_replicas": m, "attainment": a, "ttft_attainment": ...,
                     "tpot_attainment": ..., "num_requests": n, "source": ...}, ...]}

A capacity sample is one replica's load and what that replica used; an elasticity sample is a model's whole load,
the replica count serving it, and the token-level attainment reached.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from contracts import LoadFeatures, NeedVector

FORMAT = "janus.oracle.training-set/v1"


@dataclass(frozen=True)
class CapacitySample:
    features: LoadFeatures
    needs: NeedVector
    source: str = "profile"


@dataclass(frozen=True)
class ElasticitySample:
    features: LoadFeatures
    num_replicas: int
    attainment: float
    ttft_attainment: float | None = None
    tpot_attainment: float | None = None
    num_requests: int = 0
    source: str = "profile"

    def __post_init__(self) -> None:
        if self.num_replicas < 1:
            raise ValueError("num_replicas must be >= 1")
        if not 0.0 <= self.attainment <= 1.0:
            raise ValueError(f"attainment must be in [0, 1], got {self.attainment}")


@dataclass
class TrainingSet:
    model: str
    device: str = ""
    shape: str = ""
    ttft_slo_ms: float = 0.0
    tpot_slo_ms: float = 0.0
    created_unix_s: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)
    capacity: list[CapacitySample] = field(default_factory=list)
    elasticity: list[ElasticitySample] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "model": self.model, "device": self.device, "shape": self.shape,
            "ttft_slo_ms": self.ttft_slo_ms, "tpot_slo_ms": self.tpot_slo_ms, "created_unix_s": self.created_unix_s,
            "meta": self.meta,
            "capacity": [{"features": s.features.model_dump(exclude={"schema_version"}),
                          "needs": s.needs.model_dump(exclude={"schema_version"}), "source": s.source}
                         for s in self.capacity],
            "elasticity": [{**{k: v for k, v in asdict(s).items() if k != "features"},
                            "features": s.features.model_dump(exclude={"schema_version"})}
                           for s in self.elasticity],
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "TrainingSet":
        if raw.get("format") != FORMAT:
            raise ValueError(f"not a training set of format {FORMAT!r}: format={raw.get('format')!r}")
        try:
            capacity = [CapacitySample(LoadFeatures(**c["features"]), NeedVector(**c["needs"]),
                                       c.get("source", "profile")) for c in raw.get("capacity", [])]
            elasticity = [ElasticitySample(**{**e, "features": LoadFeatures(**e["features"])})
                          for e in raw.get("elasticity", [])]
            return cls(model=raw["model"], device=raw.get("device", ""), shape=raw.get("shape", ""),
                       ttft_slo_ms=float(raw.get("ttft_slo_ms", 0.0)), tpot_slo_ms=float(raw.get("tpot_slo_ms", 0.0)),
                       created_unix_s=float(raw.get("created_unix_s", 0.0)), meta=dict(raw.get("meta", {})),
                       capacity=capacity, elasticity=elasticity)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed training set: {exc}") from exc

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_json(cls, text: str) -> "TrainingSet":
        """The set in `text`; ValueError if it is not one (malformed JSON included). Files: oracle/training_files.py."""
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"malformed training set: {exc}") from exc
        return cls.from_dict(raw)

    def extend(self, other: "TrainingSet") -> None:
        if other.model != self.model:
            raise ValueError(f"cannot merge training sets of {self.model!r} and {other.model!r}")
        self.capacity.extend(other.capacity)
        self.elasticity.extend(other.elasticity)

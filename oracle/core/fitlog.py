"""What each of the oracle's GPs is, per model and kind: where its answers come from (a fitted GP or the roofline),
how many points the GP was fitted on, when, and how many fits and failed fits there were (docs/oracle.md, "The
oracle reports itself").

Pure: no I/O, no clock (times are passed in), no threads; the caller serialises calls.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Literal

from .oracle import Oracle

KINDS: tuple[Literal["capacity", "elasticity"], ...] = ("capacity", "elasticity")
_POINTS = re.compile(r"^gp-.*-n(\d+)-[0-9a-f]+$")


def fitted_points(version: str) -> int:
    """Training points of a GP from its version (`gp-<kind>-n<points>-<sha>`, oracle/core/predictors.data_version);
    0 for anything else (a roofline answers)."""
    match = _POINTS.match(version)
    return int(match.group(1)) if match else 0


def source_of(version: str) -> str:
    """gp, roofline, or none (the oracle cannot answer for the model) from a version string."""
    if version.startswith("gp-"):
        return "gp"
    return "roofline" if version.startswith("roofline-") else "none"


@dataclass(frozen=True)
class FitRecord:
    num_refits: int = 0  # successful fits (the first, from the training sets, included)
    num_failures: int = 0  # failed fits (the previous model kept serving)
    last_fit_s: float | None = None  # when the last successful fit ended (the caller's clock)
    last_failure_s: float | None = None
    last_error: str = ""


@dataclass(frozen=True)
class GPStatus:
    model: str
    kind: str
    source: str  # gp | roofline | none
    version: str
    num_points: int  # the answering GP's training points (0: roofline)
    num_samples: int  # samples held for the next fit (profiles and telemetry)
    num_refits: int
    num_failures: int
    last_fit_s: float | None
    fit_age_s: float | None


class FitLog:
    def __init__(self) -> None:
        self._records: dict[tuple[str, str], FitRecord] = {}

    def get(self, model: str, kind: str) -> FitRecord:
        return self._records.get((model, kind), FitRecord())

    def refitted(self, model: str, kind: str, now_s: float) -> FitRecord:
        record = self.get(model, kind)
        record = self._records[(model, kind)] = replace(record, num_refits=record.num_refits + 1, last_fit_s=now_s)
        return record

    def failed(self, model: str, kind: str, now_s: float, error: str = "") -> FitRecord:
        record = self.get(model, kind)
        record = self._records[(model, kind)] = replace(record, num_failures=record.num_failures + 1,
                                                        last_failure_s=now_s, last_error=error)
        return record

    def status(self, oracle: Oracle, models: list[str], now_s: float) -> list[GPStatus]:
        """One row per model (those given and those the oracle knows) and kind, as of `now_s`."""
        rows = []
        for model in sorted(set(models) | set(oracle.models)):
            versions = oracle.versions(model)
            samples = oracle.num_samples(model)
            for kind in KINDS:
                record = self.get(model, kind)
                version = versions[kind]
                rows.append(GPStatus(
                    model=model, kind=kind, source=source_of(version), version=version,
                    num_points=fitted_points(version), num_samples=samples[kind], num_refits=record.num_refits,
                    num_failures=record.num_failures, last_fit_s=record.last_fit_s,
                    fit_age_s=None if record.last_fit_s is None else max(now_s - record.last_fit_s, 0.0)))
        return rows

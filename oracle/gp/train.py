"""Fit the per-model Capacity and Elasticity GPs from training samples."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from oracle.core.dataset import CapacitySample, ElasticitySample
from oracle.core.features import ELASTICITY_MEAN_SIGNS, capacity_inputs, elasticity_inputs
from oracle.core.policy import OraclePolicy
from oracle.core.predictors import CapacityPredictor, ElasticityPredictor, data_version, logit

from .exact import fit_exact_gp


def subsample(num_samples: int, max_points: int) -> np.ndarray:
    """Indices to train on: all when few; else the newest half of the budget plus an even spread of the rest."""
    if num_samples <= max_points:
        return np.arange(num_samples)
    num_newest = max_points // 2
    older = np.linspace(0, num_samples - num_newest - 1, max_points - num_newest).round().astype(int)
    return np.unique(np.concatenate([older, np.arange(num_samples - num_newest, num_samples)]))


def training_indices(sources: Sequence[str], max_points: int) -> np.ndarray:
    """Indices to train on when profiles and telemetry are mixed: telemetry is many windows at the loads and replica
    counts served now, a profile a grid over loads, lengths and counts that telemetry never visits; so neither
    crowds the other out. With no telemetry (or few samples), `subsample` of all. Else the profile's samples get up to
    half the budget (evenly spread when more), the telemetry the rest (`subsample`: its newest first)."""
    num = len(sources)
    telemetry = np.array([i for i, s in enumerate(sources) if s == "telemetry"], dtype=int)
    if num <= max_points or len(telemetry) == 0:
        return subsample(num, max_points)
    profiled = np.array([i for i, s in enumerate(sources) if s != "telemetry"], dtype=int)
    budget = max_points // 2
    if len(profiled) > budget:
        profiled = profiled[np.unique(np.linspace(0, len(profiled) - 1, budget).round().astype(int))]
    picks = telemetry[subsample(len(telemetry), max_points - len(profiled))]
    return np.sort(np.concatenate([profiled, picks]))


def fit_capacity(samples: Sequence[CapacitySample], policy: OraclePolicy = OraclePolicy()) -> CapacityPredictor:
    keep = training_indices([s.source for s in samples], policy.max_train_points)
    chosen = [samples[i] for i in keep]
    x = capacity_inputs([s.features for s in chosen])
    y = np.log(np.array([s.needs.as_tuple() for s in chosen], dtype=float) + policy.need_floor)
    posterior = fit_exact_gp(x, y, num_iters=policy.num_train_iters)
    return CapacityPredictor(posterior, policy.need_floor, data_version("capacity", x, y))


def fit_elasticity(samples: Sequence[ElasticitySample], policy: OraclePolicy = OraclePolicy()) \
        -> ElasticityPredictor:
    keep = training_indices([s.source for s in samples], policy.max_train_points)
    chosen = [samples[i] for i in keep]
    x = elasticity_inputs([s.features for s in chosen], [s.num_replicas for s in chosen])
    y = np.array([s.attainment for s in chosen], dtype=float)
    if policy.attainment_target == "logit":
        y = logit(y, policy.logit_clip)
    signs = ELASTICITY_MEAN_SIGNS if policy.elasticity_mean == "logistic" else None
    posterior = fit_exact_gp(x, y, num_iters=policy.num_train_iters, mean_signs=signs)
    kind = f"elasticity-{policy.attainment_target}-{policy.elasticity_mean}"
    return ElasticityPredictor(posterior, policy.attainment_target, data_version(kind, x, y))

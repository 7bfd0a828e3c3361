"""The Oracle: batched Capacity and Elasticity answers per model, from fitted GPs or, where a model has none yet,
from its roofline model; learns online from samples and refits on request. Pure: no I/O, no clock (times are passed
in), no threads and no lock (a service that refits in a background thread shares the Oracle through
oracle/refit.py: SharedOracle, which holds the lock), no torch (training is injected, default oracle.gp, imported
only when a refit runs).

Predictions read the current predictor of a model through one dict lookup; a refit builds a new predictor off to
the side and swaps it in with one assignment, so predictions never wait for a refit.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Callable, Literal, Sequence

import numpy as np

from contracts import (
    CapacityPrediction,
    CapacityQuery,
    CapacityReply,
    ElasticityItem,
    ElasticityPrediction,
    ElasticityQuery,
    ElasticityReply,
    LoadFeatures,
    ModelLoadWindow,
    NeedVector,
)

from ..roofline import Efficiency, RooflineModel
from ..specs import DeviceSpec, ModelShape
from .dataset import CapacitySample, ElasticitySample, TrainingSet
from .features import LENGTH_COLUMNS, REPLICAS_COLUMN, capacity_inputs, elasticity_grid, elasticity_row
from .monotone import monotone_attainment
from .policy import OraclePolicy
from .predictors import CapacityPredictor, ElasticityPredictor
from .stacked import StackedElasticity

Kind = Literal["capacity", "elasticity"]
GRID_CACHE_SIZE = 4096  # corrected attainment grids kept (one per model and load in a tick)
RATIO_LENGTH_BUCKET = 0.02  # phase-cost ratios are kept per model and mean lengths bucketed at 2 % (log scale)
CapacityTrainer = Callable[[Sequence[CapacitySample], OraclePolicy], CapacityPredictor]
ElasticityTrainer = Callable[[Sequence[ElasticitySample], OraclePolicy], ElasticityPredictor]


class UnknownModelError(KeyError):
    """The oracle has neither a fitted GP nor a roofline profile for this model."""


@dataclass(frozen=True)
class ModelProfile:
    """What the oracle knows about a model before any measurement: its roofline model, its SLOs, and how unsure
    the roofline is (its answers carry these as std: relative for needs, absolute for attainment)."""

    roofline: RooflineModel
    ttft_slo_ms: float
    tpot_slo_ms: float
    roofline_need_rel_std: float = 0.25
    roofline_attainment_std: float = 0.1
    # The roofline's efficiencies were fitted to steps measured on the device (a profile): its per-token costs of
    # prefill and decode are the device's, and the oracle tells the scaler their ratio for the P/D split. A
    # datasheet's default efficiencies are not (the scaler keeps its policy's ratio).
    is_calibrated: bool = False

    @property
    def version(self) -> str:
        r = self.roofline
        e = r.efficiency
        return (f"roofline-{r.device.name}-{r.shape.name}-tp{r.tp}-mfu{e.mfu:g}-mbu{e.mbu:g}"
                f"-oh{e.step_overhead_ms:g}ms-slo{self.ttft_slo_ms:g}/{self.tpot_slo_ms:g}")


def roofline_meta(roofline: RooflineModel) -> dict:
    """What a training set's meta records of the roofline its profile fitted (read back by `calibrated_profile`)."""
    return {"device": asdict(roofline.device), "shape": asdict(roofline.shape), "tp": roofline.tp,
            "efficiency": asdict(roofline.efficiency)}


def calibrated_profile(training_set: TrainingSet, ttft_slo_ms: float, tpot_slo_ms: float) -> ModelProfile | None:
    """The roofline a profile fitted (its device, shape, tensor-parallel degree and efficiencies fitted to the steps
    it measured, all in the training set's meta) as the model's calibrated profile; None for a training set that
    carries no such roofline (one written by hand, or before profiles recorded it)."""
    meta = training_set.meta
    if tpot_slo_ms <= 0 or not all(isinstance(meta.get(key), dict) for key in ("device", "shape", "efficiency")):
        return None  # no TPOT SLO (a set written without one): no decode batch to size the ratio at
    try:
        roofline = RooflineModel(DeviceSpec(**meta["device"]), ModelShape(**meta["shape"]), tp=int(meta.get("tp", 1)),
                                 efficiency=Efficiency(**meta["efficiency"]))
    except (TypeError, ValueError):
        return None
    return ModelProfile(roofline, ttft_slo_ms, tpot_slo_ms, is_calibrated=True)


class Oracle:
    def __init__(self, profiles: dict[str, ModelProfile] | None = None, policy: OraclePolicy | None = None,
                 capacity_trainer: CapacityTrainer | None = None,
                 elasticity_trainer: ElasticityTrainer | None = None):
        self.policy = policy or OraclePolicy()
        self._profiles: dict[str, ModelProfile] = dict(profiles or {})
        self._capacity: dict[str, CapacityPredictor] = {}
        self._elasticity: dict[str, ElasticityPredictor] = {}
        self._capacity_samples: dict[str, list[CapacitySample]] = defaultdict(list)
        self._elasticity_samples: dict[str, list[ElasticitySample]] = defaultdict(list)
        self._num_fitted: dict[tuple[str, Kind], int] = {}
        self._last_refit_s: dict[tuple[str, Kind], float] = {}
        self._grid_cache: dict[tuple, tuple[tuple[float, ...], ...]] = {}
        self._stack_cache: tuple[tuple, StackedElasticity] | None = None
        self._ratio_cache: dict[tuple, float | None] = {}
        self._capacity_trainer = capacity_trainer
        self._elasticity_trainer = elasticity_trainer
        # models that learn together (share): model -> the name of its samples and GPs (itself when not shared)
        self._pool_of: dict[str, str] = {}
        self._last_telemetry_end_ms: dict[str, float] = {}  # per model: the end of the last window learnt

    # --- configuration ---------------------------------------------------------------------------------------
    def register(self, model: str, profile: ModelProfile) -> None:
        self._profiles[model] = profile
        self._ratio_cache = {k: v for k, v in self._ratio_cache.items() if k[0] != model}

    def install(self, model: str, capacity: CapacityPredictor | None = None,
                elasticity: ElasticityPredictor | None = None) -> None:
        """Swap in fitted predictors for a model (one assignment each: a prediction in flight sees old or new)."""
        if capacity is not None:
            self._capacity[model] = capacity
        if elasticity is not None:
            self._elasticity[model] = elasticity

    def share(self, model: str, pool: str) -> None:
        """`model` learns with `pool`: its telemetry joins the pool's samples (a training set of model `pool` is the
        pool's), and every refit of the pool installs the new GPs for each model in it. For models that cost the
        same to serve: one architecture and size on one kind of device, with the same SLOs (fine-tunes of one base;
        the simulator's apps of one instance kind), so that each GP learns from all their traffic."""
        self._pool_of[model] = pool

    def _pool(self, model: str) -> str:
        return self._pool_of.get(model, model)

    def _members(self, pool: str) -> list[str]:
        """The models a refit of `pool` installs for: the pool's own name and every model shared into it."""
        return [pool, *sorted(m for m, p in self._pool_of.items() if p == pool and m != pool)]

    def versions(self, model: str) -> dict[str, str]:
        """The version each question about `model` is answered with now."""
        profile = self._profiles.get(model)
        fallback = profile.version if profile else "none"
        cap, ela = self._capacity.get(model), self._elasticity.get(model)
        return {"capacity": cap.version if cap else fallback, "elasticity": ela.version if ela else fallback}

    @property
    def models(self) -> list[str]:
        return sorted(set(self._profiles) | set(self._capacity) | set(self._elasticity))

    # --- predictions -----------------------------------------------------------------------------------------
    def capacity(self, query: CapacityQuery) -> CapacityReply:
        """Needs of each item, mean / std / bound = mean + k*std, in the order asked; one GP evaluation per model.
        A model without load is answered by its roofline where it has a profile, GP or not: idle, an instance
        needs its weights' memory and no compute or bandwidth, and a GP asked at zero rate and zero lengths answers
        far outside what it was fitted on (the simulated die's 8B kind: a compute bound of 2.0 devices, so every
        idle model fell out of the steady pool and met its next burst cold; docs/oracle.md)."""
        by_model: dict[str, list[int]] = defaultdict(list)
        for index, item in enumerate(query.items):
            by_model[item.model].append(index)
        answers: list[CapacityPrediction | None] = [None] * len(query.items)
        for model, indices in by_model.items():
            predictor = self._capacity.get(model)
            has_profile = model in self._profiles
            loaded = [i for i in indices if predictor is not None
                      and not (has_profile and query.items[i].features.token_rate_tps <= 0)]
            by_roofline = sorted(set(indices) - set(loaded))
            for part, answer in ((loaded, self._gp_needs), (by_roofline, self._roofline_needs)):
                if not part:
                    continue
                mean, std, version, source = answer(model, [query.items[i].features for i in part])
                bound = mean + query.k_sigma * std
                for row, index in enumerate(part):
                    answers[index] = CapacityPrediction(
                        model=model, mean=_need(mean[row]), std=_need(std[row]), bound=_need(bound[row]),
                        model_version=version, source=source)
        return CapacityReply(predictions=tuple(a for a in answers if a is not None))

    def _gp_needs(self, model: str, features: list[LoadFeatures]) -> tuple[np.ndarray, np.ndarray, str, str]:
        predictor = self._capacity[model]
        mean, std = predictor.predict(capacity_inputs(features))
        return mean, std, predictor.version, "gp"

    def _roofline_needs(self, model: str, features: list[LoadFeatures]) -> tuple[np.ndarray, np.ndarray, str, str]:
        profile = self._profile(model)
        mean = np.array([profile.roofline.needs(f, profile.tpot_slo_ms).as_tuple() for f in features])
        return mean, profile.roofline_need_rel_std * mean, profile.version, "roofline"

    def elasticity(self, query: ElasticityQuery) -> ElasticityReply:
        """Attainment at each m asked; mean and bound non-decreasing in m. GP answers are corrected over the fixed
        grid m = 1..max(policy.max_grid_replicas, largest m asked), so an m gets the same answer whichever other
        m are asked with it. Corrected grids are cached per (model version, load, k): the rounds of one binary
        search cost one GP evaluation per model, and the correction runs once for all models of a call."""
        for item in query.items:
            if min(item.replicas) < 1:
                raise ValueError(f"{item.model}: replica counts must be >= 1, got {item.replicas}")
        keys = [self._grid_key(item, query.k_sigma) for item in query.items]
        grids = self._gp_grids(query, keys)
        predictions = []
        for item, key in zip(query.items, keys):
            predictor = self._elasticity.get(item.model)
            if key is not None and predictor is not None:
                grid = grids[key]  # plain tuples over m = 1..M: picking is indexing, no numpy per item
                mean, std, bound = (tuple(values[m - 1] for m in item.replicas) for values in grid)
                version, source = predictor.version, "gp"
            else:
                mean, std, bound = self._roofline_attainment(item.model, item.features, item.replicas, query.k_sigma)
                version, source = self._profile(item.model).version, "roofline"
            # Built without validation: one per model per search round on the fast path, from values made here (the
            # query was validated where it came in, from the bus or a planner).
            predictions.append(ElasticityPrediction.model_construct(
                model=item.model, replicas=tuple(item.replicas), attainment_mean=mean, attainment_std=std,
                attainment_bound=bound, model_version=version, source=source,
                decode_token_cost_ratio=self.decode_token_cost_ratio(item.model, item.features)))
        return ElasticityReply.model_construct(predictions=tuple(predictions))

    def decode_token_cost_ratio(self, model: str, features: LoadFeatures) -> float | None:
        """Device time of a decode token over a prefill token for this load, from the model's calibrated roofline
        (None: no profile measured the device; the scaler uses its policy's ratio). Kept per model and bucketed
        lengths: a tick asks the same loads again 0.5 s later."""
        profile = self._profiles.get(model)
        if profile is None or not profile.is_calibrated:
            return None
        key = (model, _bucket(features.input_len_mean), _bucket(features.output_len_mean),
               _bucket(features.output_len_var))
        if key not in self._ratio_cache:
            if len(self._ratio_cache) >= GRID_CACHE_SIZE:
                self._ratio_cache.clear()
            self._ratio_cache[key] = profile.roofline.decode_token_cost_ratio(features, profile.tpot_slo_ms)
        return self._ratio_cache[key]

    def _grid_key(self, item: ElasticityItem, k_sigma: float) -> tuple | None:
        """What a corrected grid depends on (None: the model has no GP)."""
        predictor = self._elasticity.get(item.model)
        if predictor is None:
            return None
        f = item.features
        grid_max = max(self.policy.max_grid_replicas, max(item.replicas))
        return (item.model, id(predictor), predictor.version, f.token_rate_tps, f.input_len_mean, f.input_len_var,
                f.output_len_mean, grid_max, k_sigma)

    def _gp_grids(self, query: ElasticityQuery, keys: list[tuple | None]) \
            -> dict[tuple, tuple[tuple[float, ...], ...]]:
        """The corrected grid of every GP item of the query, from the cache or computed now (misses of equal grid
        length are corrected together in one vectorised pass)."""
        found: dict[tuple, tuple[tuple[float, ...], ...]] = {}
        missing: dict[tuple, ElasticityItem] = {}
        for item, key in zip(query.items, keys):
            if key is None or key in found or key in missing:
                continue
            cached = self._grid_cache.get(key)
            if cached is not None:
                found[key] = cached
            else:
                missing[key] = item
        if len(self._grid_cache) + len(missing) > GRID_CACHE_SIZE:
            self._grid_cache.clear()  # a tick re-fills what it needs; an LRU would cost more than it saves
        by_length: dict[int, list[tuple]] = defaultdict(list)
        for key in missing:
            by_length[key[7]].append(key)
        for grid_max, group in by_length.items():
            grid = np.arange(1, grid_max + 1)
            inputs = np.stack([elasticity_grid(missing[k].features, grid, self._pooled_past(missing[k].model))
                               for k in group])
            if len(group) == 1:
                predictor = self._elasticity[missing[group[0]].model]

                def predict(include_noise: bool, k_sigma: float | None = None):
                    mean, std = predictor.predict(inputs[0], include_noise=include_noise, k_sigma=k_sigma)
                    return mean[None], std[None]
            else:
                stack = self._stack([missing[k].model for k in group])

                def predict(include_noise: bool, k_sigma: float | None = None):
                    return stack.predict(inputs, include_noise=include_noise, k_sigma=k_sigma)
            # the answer's std is one window's (what a measurement is compared with); the bound the planners size
            # by uses the policy's (OraclePolicy.elasticity_bound_std)
            raw_means, raw_stds = predict(True)
            is_latent = self.policy.elasticity_bound_std == "latent"
            bound_stds = predict(not is_latent, query.k_sigma)[1]
            latent_stds = bound_stds if is_latent or self.policy.monotone_mean != "isotonic" \
                else predict(False, query.k_sigma)[1]
            means, bounds = monotone_attainment(raw_means, bound_stds, query.k_sigma, self.policy.monotone_mean,
                                                latent_stds)
            for row, key in enumerate(group):
                item = missing[key]
                if self._is_past_lengths(self._elasticity[item.model], item.features):
                    means[row], bounds[row] = self._capped_by_roofline(item.model, item.features, means[row],
                                                                       bounds[row])
            for key, mean, std, bound in zip(group, means.tolist(), raw_stds.tolist(), bounds.tolist()):
                found[key] = self._grid_cache[key] = (tuple(mean), tuple(std), tuple(bound))
        return found

    def _pooled_past(self, model: str) -> int | None:
        """The count past which the model's Elasticity GP is asked at the same load per replica (None: never)."""
        if self.policy.past_trained_replicas != "pooled":
            return None
        _, hi = self._elasticity[model].input_range
        return max(1, int(round(math.exp(hi[REPLICAS_COLUMN]))))

    def _is_past_lengths(self, predictor: ElasticityPredictor, features: LoadFeatures) -> bool:
        """Whether the load's lengths (mean prompt, prompt spread, mean output) lie more than the policy's factor
        beyond what the GP was trained on, on either side."""
        factor = self.policy.length_extrapolation_factor
        if factor <= 0:
            return False
        lo, hi = predictor.input_range
        row = elasticity_row(features, 1)
        margin = math.log(factor)  # the inputs are log1p of lengths: a factor is (nearly) a shift
        return any(row[c] > hi[c] + margin or row[c] < lo[c] - margin for c in LENGTH_COLUMNS)

    def _capped_by_roofline(self, model: str, features: LoadFeatures, mean: np.ndarray,
                            bound: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A GP's grid past its lengths, mean and bound no higher than the roofline's attainment (where the model has
        a profile): the GP extrapolates along the lengths to its prior, which knows the load per replica but not what
        much longer prompts do to the time to first token; the roofline (fitted to the device's measured steps where
        a profile recorded it) does. A ceiling, not a second bound: the roofline's own std (wide for a datasheet)
        would put every such load past the target and size it by the saturation rule. Both grids are non-decreasing
        in m, so their minimum is. The roofline (`_roofline_attainment`, held non-decreasing) is evaluated at ~1.25x
        steps of m and held between them, a lower bound of a non-decreasing curve: 17 equilibria for 64 counts."""
        if model not in self._profiles:
            return mean, bound
        grid_max = len(mean)
        counts = sorted({min(grid_max, max(1, round(1.25 ** i))) for i in range(int(math.log(grid_max, 1.25)) + 2)})
        values = self._roofline_attainment(model, features, counts, 0.0)[0]
        held = np.repeat(values, np.diff([*counts, grid_max + 1]))
        return np.minimum(mean, held), np.minimum(bound, held)

    def _stack(self, models: list[str]) -> StackedElasticity:
        """The stacked posteriors of these models' current predictors (kept while the same predictors serve the
        same models: a tick asks the same models again 0.5 s later)."""
        key = tuple((m, id(self._elasticity[m])) for m in models)
        if self._stack_cache is None or self._stack_cache[0] != key:
            self._stack_cache = (key, StackedElasticity([self._elasticity[m] for m in models]))
        return self._stack_cache[1]

    def _roofline_attainment(self, model: str, features: LoadFeatures, asked: Sequence[int], k_sigma: float) \
            -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
        """The roofline's attainment is non-decreasing in m by construction; evaluated in increasing m and held
        non-decreasing anyway (in the order asked), since a caller may rely on it. Plain floats: a binary search
        asks one or two counts a call, where numpy's per-call cost was most of the work."""
        profile = self._profile(model)
        order = sorted(range(len(asked)), key=asked.__getitem__)
        values = profile.roofline.attainment_many(features, [int(asked[i]) for i in order], profile.ttft_slo_ms,
                                                  profile.tpot_slo_ms)
        std = profile.roofline_attainment_std
        mean, bound = [0.0] * len(asked), [0.0] * len(asked)
        running = -math.inf
        for i, value in zip(order, values):
            running = value if value > running else running
            mean[i] = running
            bound[i] = min(max(running - k_sigma * std, 0.0), 1.0)
        return tuple(mean), (std,) * len(asked), tuple(bound)

    def _profile(self, model: str) -> ModelProfile:
        try:
            return self._profiles[model]
        except KeyError:
            raise UnknownModelError(f"no fitted GP and no roofline profile for model {model!r}") from None

    # --- learning --------------------------------------------------------------------------------------------
    def add_training_set(self, training_set: TrainingSet) -> None:
        pool = self._pool(training_set.model)
        self._capacity_samples[pool].extend(training_set.capacity)
        self._elasticity_samples[pool].extend(training_set.elasticity)

    def add_samples(self, model: str, capacity: Sequence[CapacitySample] = (),
                    elasticity: Sequence[ElasticitySample] = ()) -> None:
        pool = self._pool(model)
        self._capacity_samples[pool].extend(capacity)
        self._elasticity_samples[pool].extend(elasticity)
        for samples in (self._capacity_samples[pool], self._elasticity_samples[pool]):
            _trim(samples, self.policy.max_samples_per_model)

    def observe(self, window: ModelLoadWindow, num_replicas: int, attainment: float | None = None,
                needs_per_replica: NeedVector | None = None, replicas_since_ms: float | None = None) -> bool:
        """Learn from one telemetry window served by `num_replicas` replicas, a count held since `replicas_since_ms`
        (None: unknown, taken as held). `attainment` defaults to the window's token-level attainment (what profiles
        label; the workers count it), else its TTFT attainment. Needs, when given, are one replica's, learnt against
        the per-replica share of the load. False when the window is not learnt: no replica, fewer requests than
        `min_telemetry_requests`, a replica count that changed less than `telemetry_settle_windows` window lengths
        before the window began, less than `telemetry_spacing_windows` window lengths after the model's last learnt
        window, or nothing to learn (no attainment, no needs); always False when the policy does not `learns_online`."""
        if not self.policy.learns_online or window.num_requests < self.policy.min_telemetry_requests \
                or num_replicas < 1:
            return False
        window_ms = window.window_s * 1e3
        if replicas_since_ms is not None and \
                replicas_since_ms > window.end_unix_ms - window_ms * (1.0 + self.policy.telemetry_settle_windows):
            return False
        last_ms = self._last_telemetry_end_ms.get(window.model)
        if last_ms is not None and \
                window.end_unix_ms - last_ms < self.policy.telemetry_spacing_windows * window_ms:
            return False
        value = attainment if attainment is not None else measured_attainment(window)
        elasticity = [] if value is None else [ElasticitySample(
            window.features, num_replicas, float(value), ttft_attainment=window.ttft_attainment,
            num_requests=window.num_requests, source="telemetry")]
        capacity = []
        if needs_per_replica is not None:
            share = window.features.model_copy(
                update={"token_rate_tps": window.features.token_rate_tps / num_replicas})
            capacity = [CapacitySample(share, needs_per_replica, source="telemetry")]
        if not (elasticity or capacity):
            return False
        self.add_samples(window.model, capacity, elasticity)
        self._last_telemetry_end_ms[window.model] = window.end_unix_ms
        return True

    def num_samples(self, model: str) -> dict[str, int]:
        pool = self._pool(model)
        return {"capacity": len(self._capacity_samples.get(pool, ())),
                "elasticity": len(self._elasticity_samples.get(pool, ()))}

    def due_for_refit(self, now_s: float) -> list[tuple[str, Kind]]:
        """(model, kind) pairs with enough unseen samples whose last refit is old enough (for shared models, the
        pool's name: `share`)."""
        due: list[tuple[str, Kind]] = []
        for kind, table in (("capacity", self._capacity_samples), ("elasticity", self._elasticity_samples)):
            for model, samples in table.items():
                key = (model, kind)
                is_new_enough = len(samples) - self._num_fitted.get(key, 0) >= self.policy.refit_min_new_samples
                last = self._last_refit_s.get(key)
                if is_new_enough and len(samples) >= 3 and (
                        last is None or now_s - last >= self.policy.refit_min_interval_s):
                    due.append(key)  # type: ignore[arg-type]
        return due

    @staticmethod
    def _require(trainer: Callable | None, kind: str) -> Callable:
        """The core stays free of torch: GP training is injected (oracle.gp.gp_oracle wires gpytorch in)."""
        if trainer is None:
            raise RuntimeError(f"no {kind} trainer: build the oracle with oracle.gp.gp_oracle(...) or pass one")
        return trainer

    def refit(self, model: str, kind: Kind, now_s: float) -> str:
        """Train on the model's samples and swap the result in; returns the new version. The three steps in one
        call, for a single thread (tests, benches); a service refits in a background thread through
        oracle/refit.py (SharedOracle: the first and last step under its lock, the training outside it)."""
        samples = self.refit_samples(model, kind, now_s)
        version = self.fit(model, kind, samples)
        self.fitted(model, kind, len(samples))
        return version

    def refit_samples(self, model: str, kind: Kind, now_s: float) -> list:
        """A refit's first step: a snapshot of the model's samples of `kind`, and the refit stamped at `now_s`."""
        samples = list((self._capacity_samples if kind == "capacity" else self._elasticity_samples)[model])
        self._last_refit_s[(model, kind)] = now_s
        return samples

    def fit(self, model: str, kind: Kind, samples: Sequence) -> str:
        """A refit's second step: train on `samples` (seconds; reads no sample list) and swap the predictor in with
        one assignment, so predictions never wait for it. Returns the new version."""
        return self.install_fit(model, kind, self.train(model, kind, samples))

    def train(self, model: str, kind: Kind, samples: Sequence):
        """The training of `fit` alone: a new predictor of `kind` on `samples`, not installed (the simulator installs
        it once the fit's measured wall time has passed on its clock, as the live refit thread would)."""
        if len(samples) < 3:
            raise ValueError(f"{model}: {len(samples)} {kind} samples, a GP needs at least 3")
        if kind == "capacity":
            return self._require(self._capacity_trainer, "capacity")(samples, self.policy)
        return self._require(self._elasticity_trainer, "elasticity")(samples, self.policy)

    def install_fit(self, model: str, kind: Kind, predictor) -> str:
        """The swap of `fit`: `predictor` (from `train`) serves the model and the members of its pool. Returns its
        version."""
        for member in self._members(model):
            if kind == "capacity":
                self.install(member, capacity=predictor)
            else:
                self.install(member, elasticity=predictor)
        return predictor.version

    def fitted(self, model: str, kind: Kind, num_samples: int) -> None:
        """A refit's last step: the number of samples the new predictor learnt from (due_for_refit waits for
        `refit_min_new_samples` more)."""
        self._num_fitted[(model, kind)] = num_samples


def measured_attainment(window: ModelLoadWindow) -> float | None:
    """What a window measured, in the oracle's terms: its token-level attainment where the workers' outcomes reached
    it, else its TTFT attainment (the share of first tokens on time)."""
    return window.token_attainment if window.token_attainment is not None else window.ttft_attainment


def _bucket(length: float) -> int:
    return int(round(math.log1p(max(length, 0.0)) / RATIO_LENGTH_BUCKET))


def _need(values: np.ndarray) -> NeedVector:
    hbm, compute, bandwidth = (max(float(v), 0.0) for v in values)
    return NeedVector(hbm=hbm, compute=compute, bandwidth=bandwidth)


def _trim(samples: list, max_len: int) -> None:
    """Drop the oldest telemetry samples beyond max_len (profiles are kept: they cover the grid)."""
    excess = len(samples) - max_len
    if excess <= 0:
        return
    drop = [i for i, s in enumerate(samples) if s.source == "telemetry"][:excess]
    for i in reversed(drop):
        del samples[i]



"""The oracle service: a thin shell around oracle.core.Oracle.

In: CapacityQuery / ElasticityQuery (request/reply, queue group `oracles`), model load windows (online learning),
worker heartbeats (how many replicas each model has, to label the windows). Out: the replies. Refits run in a
background thread (oracle/refit.py: BackgroundRefitter, sharing the core through SharedOracle); the handlers only
read the current predictors, so a refit never delays a reply. Training sets (TrainingSet JSON) are loaded at start:
those named in the cluster config (`oracle.training_sets`) and `<state_dir>/oracle/<model>.json` for each configured
model (what `janus profile` writes).

The oracle reports itself on /metrics (oracle/metrics.py): per model and GP kind, where answers come from, training
points, fits and their age (oracle.core.fitlog); per model, the rolling error of its attainment predictions against
the windows it learns from, each predicted before it is learnt (oracle.core.drift).

Roofline profiles: each model's shape comes from its checkpoint's config.json; the device is the H200 for CUDA
workers and this CPU (calibrated at start, HBM = the worker's page pool) otherwise.
"""
from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from dataclasses import replace
from pathlib import Path

from contracts import (
    CapacityQuery,
    CapacityReply,
    ElasticityQuery,
    ElasticityReply,
    ErrorCode,
    ModelLoadWindow,
    ModelState,
    WorkerHeartbeat,
    subjects,
)
from runtime.bus import Bus, BusError, Envelope
from runtime.service import Service
from runtime.settings import ClusterConfig, JanusSettings

from . import metrics
from .core import ModelProfile, OraclePolicy, UnknownModelError, calibrated_profile
from .core.drift import DEFAULT_K_SIGMA, DEFAULT_MAX_WINDOWS, DriftTracker
from .core.fitlog import FitLog
from .core.intake import WindowIntake
from .core.replicas import ReplicaCounts
from .cpu_device import calibrate_cpu
from .gp import gp_oracle
from .refit import BackgroundRefitter, SharedOracle
from .roofline import Efficiency, RooflineModel
from .specs import DeviceSpec, ModelShape, h200
from .training_files import load_training_set

log = logging.getLogger("janus.oracle")

# Until a profile exists, the CPU demo engine is far from a tuned GPU kernel: these are what the profiler's
# calibration measured for demo-tiny on a 2-core CPU (docs/oracle.md), a better start than GPU defaults.
CPU_EFFICIENCY = Efficiency(mfu=0.5, mbu=0.05, step_overhead_ms=1.0, max_num_seqs=32)


class _RecordedRefits:
    """What BackgroundRefitter calls on the oracle, with each fit's outcome recorded per model and kind (the
    refitter itself counts only totals)."""

    def __init__(self, oracle: SharedOracle, service: "OracleService") -> None:
        self.oracle = oracle
        self.service = service

    def due_for_refit(self, now_s: float):
        return self.oracle.due_for_refit(now_s)

    def refit(self, model: str, kind, now_s: float) -> str:
        try:
            version = self.oracle.refit(model, kind, now_s)
        except Exception as exc:
            self.service._record_fit(model, kind, error=f"{type(exc).__name__}: {exc}")
            raise  # the refitter logs it and keeps the previous model
        self.service._record_fit(model, kind)
        return version


class OracleService(Service):
    name = "oracle"

    def __init__(self, settings: JanusSettings, cluster: ClusterConfig) -> None:
        super().__init__(settings, cluster)
        self.oracle = gp_oracle(policy=OraclePolicy.from_knobs(cluster.oracle))  # predictions read it directly
        self.shared = SharedOracle(self.oracle)  # samples and refits: shared with the refit thread, under a lock
        self.refitter: BackgroundRefitter | None = None
        self._replicas: dict[str, dict[str, set[str]]] = {}  # worker -> model -> serving instance ids
        self.replica_counts = ReplicaCounts()  # per model: how many serve, since when
        self.num_queries = 0
        self.num_windows_learnt = 0
        self.drift = DriftTracker(max_windows=int(cluster.oracle.get("drift_windows", DEFAULT_MAX_WINDOWS)),
                                  k_sigma=float(cluster.oracle.get("drift_k_sigma", DEFAULT_K_SIGMA)))
        self.intake = WindowIntake(self.drift, self.replica_counts)
        self.fits = FitLog()
        self.training_sets_loaded: list[str] = []
        self._report_lock = threading.Lock()  # the fit log is written from the refit thread, read from the loop

    async def start(self, bus: Bus) -> None:
        await asyncio.to_thread(self._load_profiles)
        self._observe_status()
        self.refitter = BackgroundRefitter(_RecordedRefits(self.shared, self), clock=time.monotonic,
                                           on_refit=self._on_refit)
        self.refitter.start()
        await bus.serve(subjects.ORACLE_CAPACITY, CapacityQuery, self._on_capacity, queue=subjects.ORACLE_QUEUE)
        await bus.serve(subjects.ORACLE_ELASTICITY, ElasticityQuery, self._on_elasticity,
                        queue=subjects.ORACLE_QUEUE)
        await bus.subscribe(subjects.MODEL_TELEMETRY_WILDCARD, ModelLoadWindow, self._on_window)
        await bus.subscribe(subjects.WORKER_TELEMETRY_WILDCARD, WorkerHeartbeat, self._on_heartbeat, traced=False)

    async def stop(self) -> None:
        if self.refitter is not None:
            await asyncio.to_thread(self.refitter.stop)

    def health_detail(self) -> dict[str, str]:
        detail = {"queries": str(self.num_queries), "windows_learnt": str(self.num_windows_learnt)}
        if self.refitter is not None:
            detail["refits"] = str(self.refitter.num_refits)
            detail["refit_failures"] = str(self.refitter.num_failures)
        detail["training_sets"] = ",".join(self.training_sets_loaded)
        with self._report_lock:
            rows = self.fits.status(self.oracle, self.configured_models, time.time())
        for row in rows:
            detail[f"{row.model}.{row.kind}"] = row.version
        for kind in ("capacity", "elasticity"):  # which models answer from a GP
            detail[f"gp.{kind}"] = ",".join(row.model for row in rows if row.kind == kind and row.source == "gp")
        for model in self.drift.models:
            summary = self.drift.summary(model)
            if summary is not None:
                detail[f"{model}.attainment_abs_error"] = f"{summary.mean_abs_error:.4f}"
        return detail

    @property
    def configured_models(self) -> list[str]:
        return [spec.name for spec in self.cluster.models]

    def training_set_paths(self) -> list[tuple[Path, str | None]]:
        """(path, the model it must hold or None) of every training set to load: those the cluster config names,
        then `<state_dir>/oracle/<model>.json` of each configured model that has one (each file once)."""
        out: list[tuple[Path, str | None]] = [(Path(p), None) for p in self.cluster.oracle.get("training_sets", [])]
        for spec in self.cluster.models:
            path = self.settings.state_dir / "oracle" / f"{spec.name}.json"
            if path.is_file():
                out.append((path, spec.name))
        seen: set[Path] = set()
        unique = []
        for path, model in out:
            key = path.resolve()
            if key not in seen:
                seen.add(key)
                unique.append((path, model))
        return unique

    # --- setup (runs in a thread: file reads and a ~1 s CPU calibration) ----------------------------------------
    def _load_profiles(self) -> None:
        workers = self.cluster.workers
        device: DeviceSpec
        if workers.device.startswith("cuda"):
            device, efficiency = h200(), Efficiency()
        else:
            device, efficiency = replace(calibrate_cpu(), hbm_bytes=workers.pool_bytes), CPU_EFFICIENCY
        for spec in self.cluster.models:
            folder = spec.path or (self.settings.models_dir / spec.demo if spec.demo else None)
            config_path = Path(folder) / "config.json" if folder else None
            if config_path is None or not config_path.is_file():
                log.warning("oracle: no config.json for %s: it is answered only once a training set exists", spec.name)
                continue
            shape = ModelShape.from_hf_config(json.loads(config_path.read_text()), name=spec.name)
            roofline = RooflineModel(device, shape, efficiency=efficiency)
            self.oracle.register(spec.name, ModelProfile(roofline, spec.ttft_slo_ms, spec.tpot_slo_ms))
        for path, expected in self.training_set_paths():
            self._load_training_set(path, expected)
        if not self.training_sets_loaded:
            log.info("oracle: no training sets (none named in oracle.training_sets, none in %s): the roofline "
                     "answers until windows are learnt", self.settings.state_dir / "oracle")

    def _load_training_set(self, path: Path, expected: str | None) -> None:
        """Load one training set; a file that cannot be read or is not a training set is one log line."""
        try:
            training_set = load_training_set(path)
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            reason = " ".join(str(exc).split())[:300] or type(exc).__name__
            log.error("oracle: skipping training set %s: %s", path, reason)
            return
        if expected is not None and training_set.model != expected:
            log.error("oracle: skipping training set %s: it holds model %r, not %r", path, training_set.model,
                      expected)
            return
        spec = self.cluster.model(training_set.model)
        if spec is not None and training_set.ttft_slo_ms and (
                (training_set.ttft_slo_ms, training_set.tpot_slo_ms) != (spec.ttft_slo_ms, spec.tpot_slo_ms)):
            log.warning("oracle: %s was measured against SLOs %g/%g ms, the cluster serves %s at %g/%g ms: its "
                        "attainment labels are for the profile's SLOs", path, training_set.ttft_slo_ms,
                        training_set.tpot_slo_ms, spec.name, spec.ttft_slo_ms, spec.tpot_slo_ms)
        self.shared.add_training_set(training_set)
        slos = spec or training_set  # the cluster's SLOs for a configured model, else the profile's
        calibrated = calibrated_profile(training_set, slos.ttft_slo_ms, slos.tpot_slo_ms)
        if calibrated is not None:  # the profile's fitted roofline: measured per-token costs (the P/D split)
            self.oracle.register(training_set.model, calibrated)
        self.training_sets_loaded.append(str(path))
        log.info("oracle: %s: %d capacity and %d elasticity samples from %s", training_set.model,
                 len(training_set.capacity), len(training_set.elasticity), path)

    def _on_refit(self, model: str, kind: str, version: str) -> None:
        log.info("oracle: refit %s %s -> %s", model, kind, version)

    # --- reporting (oracle.core.fitlog, oracle.core.drift -> oracle.metrics) -----------------------------------
    def _record_fit(self, model: str, kind: str, error: str | None = None) -> None:
        """A fit ended (refit thread): count it and refresh the per-GP series."""
        with self._report_lock:
            if error is None:
                self.fits.refitted(model, kind, time.time())
            else:
                self.fits.failed(model, kind, time.time(), error)
        metrics.observe_refit(model, kind, is_ok=error is None)
        self._observe_status()

    def _observe_status(self) -> None:
        with self._report_lock:  # set under the lock too: a snapshot from before a refit must not land after it
            metrics.observe_status(self.fits.status(self.oracle, self.configured_models, time.time()))

    # --- handlers ------------------------------------------------------------------------------------------------
    async def _on_capacity(self, query: CapacityQuery, env: Envelope) -> CapacityReply:
        self.num_queries += 1
        return self._answer(self.oracle.capacity, query)

    async def _on_elasticity(self, query: ElasticityQuery, env: Envelope) -> ElasticityReply:
        self.num_queries += 1
        return self._answer(self.oracle.elasticity, query)

    @staticmethod
    def _answer(fn, query):
        try:
            return fn(query)
        except UnknownModelError as exc:
            raise BusError.of(ErrorCode.UNKNOWN_MODEL, str(exc.args[0])) from None
        except ValueError as exc:
            raise BusError.of(ErrorCode.INVALID_REQUEST, str(exc)) from None

    async def _on_heartbeat(self, beat: WorkerHeartbeat, env: Envelope) -> None:
        # Every serving instance, decode ones included: the Elasticity GP's m is the elastic scaler's count of
        # instances, which it lays out as prefill and decode ones (planner.core.split_prefill_decode), and the
        # profiles ran that layout at each m. By id: a tensor-parallel instance is in each of its devices' beats.
        serving: dict[str, set[str]] = {}
        for inst in beat.instances:
            if inst.state == ModelState.ACTIVE:
                serving.setdefault(inst.model, set()).add(inst.instance_id)
        self._replicas[beat.worker_id] = serving
        now_ms = time.time() * 1e3
        for model in {*self.replica_counts.models(), *serving}:
            self.replica_counts.update(model, self._count_replicas(model), now_ms)

    def _count_replicas(self, model: str) -> int:
        return len(set().union(*(serving.get(model, set()) for serving in self._replicas.values())))

    def num_replicas(self, model: str) -> int:
        return self.replica_counts.count(model)

    async def _on_window(self, window: ModelLoadWindow, env: Envelope) -> None:
        # merged with the other dispatchers' windows, scored before it is learnt (oracle/core/intake.py)
        taken = self.intake.take(window, self.oracle, self.shared, time.time())
        if taken.score is not None:
            summary = self.drift.summary(window.model)
            if summary is not None:
                metrics.observe_score(taken.score, summary)
        if taken.is_learnt:
            self.num_windows_learnt += 1
            self._observe_status()  # samples held
            if self.refitter is not None:
                self.refitter.wake()

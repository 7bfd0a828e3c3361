"""The oracle service: a thin shell around oracle.core.Oracle.

In: CapacityQuery / ElasticityQuery (request/reply, queue group `oracles`), model load windows (online learning),
worker heartbeats (how many replicas each model has, to label the windows). Out: the replies. Refits run in a
background thread (BackgroundRefitter); the handlers only read the current predictors, so a refit never delays a
reply. Training sets named in the cluster config (`oracle.training_sets`, TrainingSet JSON) are loaded at start.

Roofline profiles: each model's shape comes from its checkpoint's config.json; the device is the H200 for CUDA
workers and this CPU (calibrated at start, HBM = the worker's page pool) otherwise.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import fields, replace
from pathlib import Path

from contracts import (
    CapacityQuery,
    CapacityReply,
    ElasticityQuery,
    ElasticityReply,
    ErrorCode,
    InstanceRole,
    ModelLoadWindow,
    ModelState,
    WorkerHeartbeat,
    subjects,
)
from runtime.bus import Bus, BusError, Envelope
from runtime.service import Service
from runtime.settings import ClusterConfig, JanusSettings

from .core import ModelProfile, OraclePolicy, TrainingSet, UnknownModelError
from .core.refit import BackgroundRefitter
from .gp import gp_oracle
from .roofline import Efficiency, RooflineModel
from .specs import DeviceSpec, ModelShape, calibrate_cpu, h200

log = logging.getLogger("janus.oracle")

# Until a profile exists, the CPU demo engine is far from a tuned GPU kernel: these are what the profiler's
# calibration measured for demo-tiny on a 2-core CPU (docs/oracle.md), a better start than GPU defaults.
CPU_EFFICIENCY = Efficiency(mfu=0.5, mbu=0.05, step_overhead_ms=1.0, max_num_seqs=32)


def _policy_from(knobs: dict) -> OraclePolicy:
    names = {f.name for f in fields(OraclePolicy)}
    return OraclePolicy(**{k: v for k, v in knobs.items() if k in names})


class OracleService(Service):
    name = "oracle"

    def __init__(self, settings: JanusSettings, cluster: ClusterConfig) -> None:
        super().__init__(settings, cluster)
        self.oracle = gp_oracle(policy=_policy_from(cluster.oracle))
        self.refitter: BackgroundRefitter | None = None
        self._replicas: dict[str, dict[str, int]] = {}  # worker -> model -> serving instances
        self.num_queries = 0
        self.num_windows_learnt = 0

    async def start(self, bus: Bus) -> None:
        await asyncio.to_thread(self._load_profiles)
        self.refitter = BackgroundRefitter(self.oracle, clock=time.monotonic, on_refit=self._on_refit)
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
        for model in self.oracle.models:
            versions = self.oracle.versions(model)
            detail[f"{model}.capacity"] = versions["capacity"]
            detail[f"{model}.elasticity"] = versions["elasticity"]
        return detail

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
        for path in self.cluster.oracle.get("training_sets", []):
            try:
                training_set = TrainingSet.load(path)
            except (OSError, ValueError) as exc:
                log.error("oracle: cannot load training set %s: %s", path, exc)
                continue
            self.oracle.add_training_set(training_set)
            log.info("oracle: %s: %d capacity and %d elasticity samples from %s", training_set.model,
                     len(training_set.capacity), len(training_set.elasticity), path)

    def _on_refit(self, model: str, kind: str, version: str) -> None:
        log.info("oracle: refit %s %s -> %s", model, kind, version)

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
        counts: dict[str, int] = {}
        for inst in beat.instances:
            if inst.state == ModelState.ACTIVE and inst.role != InstanceRole.DECODE:
                counts[inst.model] = counts.get(inst.model, 0) + 1
        self._replicas[beat.worker_id] = counts

    def num_replicas(self, model: str) -> int:
        return sum(counts.get(model, 0) for counts in self._replicas.values())

    async def _on_window(self, window: ModelLoadWindow, env: Envelope) -> None:
        if self.oracle.observe(window, self.num_replicas(window.model)):
            self.num_windows_learnt += 1
            if self.refitter is not None:
                self.refitter.wake()

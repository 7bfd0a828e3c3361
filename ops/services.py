"""The services `janus serve` can run, by name, imported lazily (a service's heavy imports stay its own)."""
from __future__ import annotations

import importlib
import importlib.util

SERVICES: dict[str, str] = {
    "worker": "worker.shell.service:WorkerService",
    "dispatcher": "dispatcher.service:DispatcherService",
    "oracle": "oracle.service:OracleService",
    "steady-planner": "planner.steady_service:SteadyPlannerService",
    "elastic-scaler": "planner.elastic_service:ElasticScalerService",
    "reconciler": "planner.reconciler_service:ReconcilerService",
    "gateway": "gateway.service:GatewayService",
}


def _module_exists(target: str) -> bool:
    module = target.split(":")[0]
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def available_services() -> list[str]:
    return [name for name, target in SERVICES.items() if _module_exists(target)]


def load_service_class(name: str):
    if name not in SERVICES:
        raise SystemExit(f"unknown service {name!r}; services: {', '.join(SERVICES)}")
    module, cls = SERVICES[name].split(":")
    return getattr(importlib.import_module(module), cls)

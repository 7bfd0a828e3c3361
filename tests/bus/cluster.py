"""Start gateway, dispatcher and workers in this process on the test session's nats-server."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from runtime.service import Service, run_service
from runtime.settings import ClusterConfig, JanusSettings


@dataclass
class InProcessCluster:
    services: dict[str, Service] = field(default_factory=dict)
    tasks: list[asyncio.Task] = field(default_factory=list)

    @property
    def gateway(self):
        return self.services["gateway"]

    @property
    def dispatcher(self):
        return self.services["dispatcher"]

    @property
    def url(self) -> str:
        return self.gateway.url

    async def stop(self) -> None:
        for name in ("gateway", *[n for n in self.services if n != "gateway"]):
            self.services[name].stopped.set()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def start_cluster(nats_url: str, config: dict, models_dir: Path, *, num_workers: int = 1,
                        tag: str = "t") -> InProcessCluster:
    from dispatcher.service import DispatcherService
    from gateway.service import GatewayService
    from worker.service import WorkerService

    cluster = ClusterConfig.model_validate(config)
    state_dir = models_dir.parent

    def settings(instance: str) -> JanusSettings:
        return JanusSettings(nats_url=nats_url, instance=instance, state_dir=state_dir)

    out = InProcessCluster()
    for i in range(num_workers):
        wid = f"{tag}-worker-{i}"
        out.services[wid] = WorkerService(settings(wid), cluster, worker_id=wid)
    out.services["dispatcher"] = DispatcherService(settings(f"{tag}-dispatcher"), cluster)
    out.services["gateway"] = GatewayService(settings(f"{tag}-gateway"), cluster, port=0)
    for svc in out.services.values():
        out.tasks.append(asyncio.create_task(run_service(svc, install_signals=False)))
    await wait_until(lambda: out.gateway.listening
                     and all(getattr(s, "residents", None) is None or
                             all(r.is_ready for r in s.residents.values()) and s.residents
                             for s in out.services.values()), timeout_s=120, tasks=out.tasks)
    # The dispatcher must route every model to this cluster's own ready instances: the registry may still hold
    # records of an earlier cluster on the same nats-server, which a count of records would take for these, and a
    # request sent before its model is routable waits, and may miss its TTFT deadline on a loaded machine.
    worker_ids = {f"{tag}-worker-{i}" for i in range(num_workers)}
    view = out.dispatcher.core._view  # what the dispatcher routes by: ready, ACTIVE, not banned
    await wait_until(lambda: all(any(r.worker_id in worker_ids for r in view.prefill_instances(m.name))
                                 for m in cluster.models),
                     timeout_s=30, tasks=out.tasks)
    return out


async def wait_until(predicate, *, timeout_s: float, tasks=(), interval_s: float = 0.05) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        for task in tasks:
            if task.done():
                task.result()  # surface a service that crashed while starting
                raise RuntimeError("a service stopped while starting")
        if loop.time() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(interval_s)

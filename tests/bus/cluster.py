"""Start gateway, dispatcher and workers in this process on the test session's nats-server."""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

from runtime.service import Service, run_service
from runtime.settings import ClusterConfig, JanusSettings
from tests.polling import wait_for

log = logging.getLogger("tests.bus.cluster")


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
        gateway_first = {"gateway": self.gateway, **self.services}
        await stop_services(gateway_first, self.tasks)


async def start_cluster(nats_url: str, config: dict, models_dir: Path, *, num_workers: int = 1,
                        tag: str = "t", worker_cls: type | None = None) -> InProcessCluster:
    """worker_cls: a WorkerService subclass to run instead (e.g. one whose engine is slowed down on purpose)."""
    from dispatcher.service import DispatcherService
    from gateway.service import GatewayService
    from worker.shell.service import WorkerService

    worker_cls = worker_cls or WorkerService

    await forget_earlier_clusters(nats_url)
    cluster = ClusterConfig.model_validate(config)
    state_dir = models_dir.parent

    def settings(instance: str) -> JanusSettings:
        return JanusSettings(nats_url=nats_url, instance=instance, state_dir=state_dir)

    out = InProcessCluster()
    for i in range(num_workers):
        wid = f"{tag}-worker-{i}"
        out.services[wid] = worker_cls(settings(wid), cluster, worker_id=wid)
    out.services["dispatcher"] = DispatcherService(settings(f"{tag}-dispatcher"), cluster)
    out.services["gateway"] = GatewayService(settings(f"{tag}-gateway"), cluster, port=0)
    for svc in out.services.values():
        out.tasks.append(asyncio.create_task(run_service(svc, install_signals=False)))
    await wait_for(lambda: out.gateway.listening
                   and all(getattr(s, "residents", None) is None or
                           all(r.is_ready for r in s.residents.values()) and s.residents
                           for s in out.services.values()), timeout_s=120, tasks=out.tasks,
                   what="the gateway listening and every worker's instances ready")
    # The dispatcher must route every model to this cluster's own ready instances: the registry may still hold
    # records of an earlier cluster on the same nats-server, which a count of records would take for these, and a
    # request sent before its model is routable waits, and may miss its TTFT deadline on a loaded machine.
    worker_ids = {f"{tag}-worker-{i}" for i in range(num_workers)}
    view = out.dispatcher.core._view  # what the dispatcher routes by: ready, ACTIVE, not banned
    await wait_for(lambda: all(any(r.worker_id in worker_ids for r in view.prefill_instances(m.name))
                               for m in cluster.models),
                   timeout_s=30, tasks=out.tasks, what="every model routed to this cluster's own workers")
    return out


def sdk_fixtures(model: str, *, tag: str, ttft_slo_ms: float, timeout_s: float):
    """The `cluster` and `client` fixtures of an openai SDK test module: a one-worker cluster serving `model` (from
    `demo_models_dir`) with a lax TTFT SLO (these tests check what comes back, not how fast), started once per
    module, and the official openai SDK against its gateway without retries (a test sees each answer). Use as
    `cluster, client = sdk_fixtures(...)` at module level."""
    import openai
    import pytest

    @pytest.fixture(scope="module")
    async def cluster(nats_url, demo_models_dir):
        config = {"models": [{"name": model, "path": str(demo_models_dir / model), "ttft_slo_ms": ttft_slo_ms}]}
        c = await start_cluster(nats_url, config, demo_models_dir, tag=tag)
        yield c
        await c.stop()

    @pytest.fixture
    def client(cluster):
        return openai.AsyncOpenAI(base_url=f"{cluster.url}/v1", api_key="unused", timeout=timeout_s, max_retries=0)

    return cluster, client


async def forget_earlier_clusters(nats_url: str) -> None:
    """Empty the instance registry of the session's nats-server: records an earlier module's cluster left (its
    workers stopped, nobody marked them gone) would otherwise be routed to by this cluster's dispatcher, and a
    request sent there waits for a worker that no longer exists."""
    from contracts import subjects
    from runtime.bus import Bus

    bus = await Bus.connect(nats_url, "test-cleanup")
    try:
        try:
            await bus.js.delete_key_value(subjects.INSTANCES_BUCKET)
        except Exception:  # noqa: BLE001 - no bucket yet: nothing to forget
            pass
    finally:
        await bus.close()


async def wait_until(predicate, *, timeout_s: float, tasks=(), interval_s: float = 0.05,
                     what: str = "the condition") -> None:
    """tests.polling.wait_for, for the callers that name no `what`."""
    await wait_for(predicate, what=what, timeout_s=timeout_s, tasks=tasks, interval_s=interval_s)


STOP_TIMEOUT_S = 90.0  # a worker drains for 30 s at most, then releases; a service slower than this is stuck


async def stop_services(services: Mapping[str, Service], tasks: Iterable[asyncio.Task], *,
                        timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Ask the services to stop (in this order) and wait for `tasks` (their run_service tasks, and helpers the caller
    has cancelled) to end, `timeout_s` at most: the ones still running then are cancelled, and TimeoutError names
    each with where it waited. A service's own failure is logged, not raised (as gather(return_exceptions=True) did)."""
    from tests.task_guard import await_chain

    for service in services.values():
        service.stopped.set()
    tasks = list(tasks)
    if not tasks:
        return
    done, pending = await asyncio.wait(tasks, timeout=timeout_s)
    for task in done:  # a service that failed (a periodic loop that died, say) is logged, not raised
        if not task.cancelled() and task.exception() is not None:
            log.error("%s ended with an error", _label(task), exc_info=task.exception())
    if not pending:
        return
    stuck = []
    for task in pending:
        stuck.append(f"- {_label(task)}:\n{await_chain(task)}")
        task.cancel()
    await asyncio.wait(pending, timeout=5.0)
    raise TimeoutError(f"{len(pending)} of {len(tasks)} service task(s) did not stop within {timeout_s:g} s:\n"
                       + "\n".join(stuck))


def _label(task: asyncio.Task) -> str:
    """`name instance` of the service a run_service task runs, else the task's name."""
    frame = getattr(task.get_coro(), "cr_frame", None)
    service = frame.f_locals.get("service") if frame is not None else None
    return f"{service.name} {service.instance}" if isinstance(service, Service) else task.get_name()

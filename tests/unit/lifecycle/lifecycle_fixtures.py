"""Helpers for the lifecycle tests: a recording stand-in for the worker shell, a simulated worker over real parts
(CPU page pool, Mooncake transfer engine, controller), and a greedy run on a bare engine."""
from __future__ import annotations

import itertools
import time
from pathlib import Path

from contracts import LifecycleAction, LifecycleCommand, SamplingParams

PAGE_BYTES = 64 << 10  # small pages keep populate and hole punching cheap


class RecordingHost:
    """The controller's view of the worker shell, recording every call in order."""

    def __init__(self) -> None:
        self.events = []
        self.calls: list[tuple[str, str]] = []
        self.ready: dict[str, bool] = {}

    def now_unix_ms(self) -> float:
        return time.time() * 1e3

    async def on_transition(self, inst, event) -> None:
        self.events.append(event)
        self.ready[inst.instance_id] = inst.is_ready
        self.calls.append(("record", f"{event.to_state.value}:{inst.is_ready}"))

    async def refresh_record(self, inst) -> None:
        self.calls.append(("refresh", inst.instance_id))

    async def drain(self, inst, min_drain_s: float) -> dict[str, float]:
        self.calls.append(("drain", inst.instance_id))
        return {"drain_ms": 0.0}

    def start_serving(self, inst) -> None:
        self.calls.append(("serve", inst.instance_id))

    def stop_serving(self, inst) -> None:
        self.calls.append(("park", inst.instance_id))


class Worker:
    """One simulated worker: a real page pool, a real transfer engine, a controller over them."""

    def __init__(self, worker_id: str, model_dir: Path, *, pool_bytes: int = 48 << 20, with_transfer: bool = True,
                 host: RecordingHost | None = None, is_background_refill: bool = False, kv_cache_bytes: int = 2 << 20,
                 other_model_dirs: dict[str, Path] | None = None):
        from worker.engine.engine import EngineConfig, LLMEngine
        from worker.lifecycle.controller import LifecycleController
        from worker.lifecycle.instance import ModelInstance
        from worker.xtensor import XTensor, XTensorConfig

        self.worker_id = worker_id
        self.pages = XTensor.open("cpu", pool_bytes, XTensorConfig(page_size_bytes=PAGE_BYTES,
                                                                   is_background_refill=is_background_refill))
        self.transfer = None
        if with_transfer:
            from worker.dataplane.transfer import MooncakeTransfer

            self.transfer = MooncakeTransfer.start()
            region = self.pages.global_region
            self.transfer.register(region.base_address, region.num_bytes)
        self.host = host or RecordingHost()
        self.num_builds = 0

        def build(path, owner, load_weights=True):
            self.num_builds += 1
            return LLMEngine(path, config=EngineConfig(kv_cache_bytes=kv_cache_bytes, max_num_seqs=4),
                             kv_source=self.pages, weight_source=self.pages, owner=owner, load_weights=load_weights)

        folders = {"demo-tiny": model_dir, **(other_model_dirs or {})}

        def make(cmd):
            return ModelInstance(worker_id, cmd.model, cmd.instance_id, cmd.role, cmd.pool, folders[cmd.model],
                                 self.pages, build)

        self.controller = LifecycleController(worker_id, self.host, make, self.transfer)
        self._ids = itertools.count()

    def command(self, instance_id: str, action: LifecycleAction, model: str = "demo-tiny", **kw) -> LifecycleCommand:
        return LifecycleCommand(command_id=f"{self.worker_id}-{next(self._ids)}", worker_id=self.worker_id,
                                model=model, instance_id=instance_id, action=action,
                                issued_unix_ms=time.time() * 1e3, **kw)

    async def run(self, instance_id: str, action: LifecycleAction, **kw):
        return await self.controller.execute(self.command(instance_id, action, **kw))

    def close(self) -> None:
        if hasattr(self.host, "close"):
            self.host.close()
        if self.transfer is not None:
            self.transfer.close()
        self.pages.close()


def greedy_tokens(engine, prompt=(5, 6, 7, 8, 9, 10), max_tokens: int = 8) -> list[int]:
    """Run one greedy request to the end on a bare engine (no loop thread)."""
    rid = f"g{time.monotonic_ns()}"
    engine.add_request(rid, list(prompt), SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
    tokens: list[int] = []
    while engine.has_unfinished():
        for out in engine.step():
            tokens += out.token_ids
    return tokens

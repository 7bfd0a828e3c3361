"""Compaction wired into a worker's engine loop (worker/shell/compactor.py): under a churn of two models (requests of both
interleaving their KV pages; each model in turn going warm, the other serving meanwhile, then waking) the pool's
fragmentation stays near zero, where the same churn without compaction leaves holes; every request yields the same
tokens as on a plain engine; moved weights are advertised again at their new offsets.

The engine side of the worker shell is wired here as the service wires it (a real EngineLoop stepping SteppedEngines,
the Compactor between steps); the lifecycle is the real controller over a real CPU page pool.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict

from lifecycle_fixtures import PAGE_BYTES, RecordingHost

from contracts import LifecycleAction, SamplingParams
from worker.shell.compactor import Compactor
from worker.core.compaction import CompactionPolicy
from worker.engine.engine import EngineConfig, LLMEngine
from worker.shell.engine_loop import EngineLoop
from worker.lifecycle.checksums import checksum
from worker.lifecycle.parking import SteppedEngine

A = LifecycleAction
MODELS = {"tiny": "demo-tiny", "small": "demo-small"}
POOL_BYTES = 360 * PAGE_BYTES  # weights ~11 + ~237 pages, up to 32 KV pages each: the pool is really shared
COMPACTING = CompactionPolicy(max_moves_per_step=8, min_fragmentation=0.0, fork_quiet_s=0.0)
NOT_COMPACTING = CompactionPolicy(max_moves_per_step=0)


class LoopHost(RecordingHost):
    """The worker shell's engine side: an engine loop over parked-or-stepping engines, compaction between steps."""

    def __init__(self, policy: CompactionPolicy) -> None:
        super().__init__()
        self.policy = policy
        self.tokens: dict[str, list[int]] = defaultdict(list)
        self.finished: set[str] = set()
        self.failures: list = []
        self._lock = threading.Lock()
        self._stepped: dict[str, SteppedEngine] = {}
        self.loop = EngineLoop(self._on_outputs, self._on_failure, idle_wait_s=0.002, between_steps=self._between)

    def bind(self, worker) -> None:
        self.worker = worker
        self.compactor = Compactor(worker.pages, self.policy)
        self.loop.start()

    def start_serving(self, inst) -> None:
        super().start_serving(inst)
        self.compactor.reset(inst.owner)
        self._stepped[inst.instance_id] = stepped = SteppedEngine(inst.engine)
        self.loop.add(inst.instance_id, stepped)

    def stop_serving(self, inst) -> None:
        super().stop_serving(inst)
        stepped = self._stepped.pop(inst.instance_id, None)
        if stepped is not None:
            stepped.park()
        self.loop.remove(inst.instance_id)

    def _between(self, instance_id: str, stepped: SteppedEngine) -> None:
        inst = self.worker.controller.instances.get(instance_id)
        if inst is not None:
            stepped.between_steps(lambda engine: self.compactor.between_steps(inst, engine))

    def _on_outputs(self, instance_id: str, outputs) -> None:
        with self._lock:
            for out in outputs:
                self.tokens[out.request_id] += out.token_ids
                if out.is_finished:
                    self.finished.add(out.request_id)

    def _on_failure(self, instance_id: str, exc: BaseException) -> None:
        self.failures.append((instance_id, exc))

    def close(self) -> None:
        self.loop.stop()


def _requests(round_index: int, name: str) -> list[tuple[list[int], int]]:
    """(prompt, max_tokens) of different lengths: finishing at different times, they free pages below live ones."""
    seed = round_index * 7 + len(name)
    return [([(seed * 131 + i * 17 + j * 7) % 900 + 3 for j in range(60 + 90 * ((i + seed) % 3))], 6 + 5 * i)
            for i in range(3)]


async def _serve(host: LoopHost, worker, name: str, requests, tag: str) -> dict:
    """One request at a time on this model (a batch of one: comparable token for token with a plain engine)."""
    got = {}
    for k, (prompt, max_tokens) in enumerate(requests):
        rid = f"{tag}-{name}-{k}"
        worker.controller.instances[name].engine.add_request(
            rid, prompt, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
        host.loop.wake()
        deadline = time.monotonic() + 30
        while rid not in host.finished:
            assert not host.failures, host.failures
            assert time.monotonic() < deadline, f"{rid} did not finish"
            await asyncio.sleep(0.002)
        got[(name, tuple(prompt), max_tokens)] = host.tokens[rid]
    return got


async def _settle(host: LoopHost, worker) -> float:
    """Let compaction run out (nothing withdrawn, nothing moved for a while); the pool's fragmentation then."""
    deadline, quiet_since, moved = time.monotonic() + 10, time.monotonic(), -1
    while time.monotonic() < deadline:
        if host.compactor.num_pages_moved != moved or any(host.compactor.is_withdrawn(n) for n in MODELS):
            moved, quiet_since = host.compactor.num_pages_moved, time.monotonic()
        elif time.monotonic() - quiet_since > 0.15:
            break
        await asyncio.sleep(0.01)
    return worker.pages.counters().fragmentation


async def _churn(make_worker, tiny_dir, small_dir, policy: CompactionPolicy, num_rounds: int = 2):
    host = LoopHost(policy)
    worker = make_worker(f"w-{policy.max_moves_per_step}", pool_bytes=POOL_BYTES, host=host, with_transfer=False,
                         is_background_refill=True, other_model_dirs={"demo-small": small_dir})
    host.bind(worker)
    for name in ("tiny", "small"):
        assert (await worker.run(name, A.ACTIVATE, model=MODELS[name])).ok
    outputs, settled = {}, []
    for r in range(num_rounds):
        churned, other = ("small", "tiny") if r % 2 else ("tiny", "small")
        assert (await worker.run(churned, A.WARM, model=MODELS[churned])).ok
        outputs |= await _serve(host, worker, other, _requests(r, other), f"r{r}w")
        settled.append(await _settle(host, worker))  # one model warm: its weight pages left a hole
        assert (await worker.run(churned, A.ACTIVATE, model=MODELS[churned])).ok
        both = await asyncio.gather(*(_serve(host, worker, n, _requests(r, n), f"r{r}a") for n in MODELS))
        outputs |= both[0] | both[1]
        settled.append(await _settle(host, worker))
    return host, worker, outputs, settled


def _plain_outputs(outputs: dict, dirs: dict[str, object]) -> dict:
    engines = {name: LLMEngine(dirs[name], config=EngineConfig(kv_cache_bytes=2 << 20)) for name in MODELS}
    expected = {}
    for k, (name, prompt, max_tokens) in enumerate(outputs):
        engine = engines[name]
        engine.add_request(f"plain-{k}", list(prompt), SamplingParams(max_tokens=max_tokens, temperature=0,
                                                                      ignore_eos=True))
        tokens = []
        while engine.has_unfinished():
            tokens += [t for o in engine.step() for t in o.token_ids]
        expected[(name, prompt, max_tokens)] = tokens
    return expected


async def test_a_churn_of_two_models_stays_compact_and_serves_the_same_tokens(make_worker, tiny_dir, small_dir):
    host, worker, outputs, settled = await _churn(make_worker, tiny_dir, small_dir, COMPACTING)
    _, _, plain_outputs, settled_without = await _churn(make_worker, tiny_dir, small_dir, NOT_COMPACTING)

    print(f"\nsettled fragmentation with compaction {settled}\nwithout {settled_without}")
    assert max(settled) <= 0.02 and max(settled_without) >= 0.1
    assert sum(settled) < sum(settled_without) / 10
    stats = worker.pages.stats()
    assert host.compactor.num_withdrawals > 0 and host.compactor.num_readvertisements == host.compactor.num_withdrawals
    assert stats.num_pages_copied > 0  # weights and KV pages in use really moved under the engines

    expected = _plain_outputs(outputs, {"tiny": tiny_dir, "small": small_dir})
    assert outputs == expected and plain_outputs == expected

    # the weights are advertised again where they now are: what a fork would pull is what the engine computes with
    for name in MODELS:
        inst = worker.controller.instances[name]
        assert [(s.global_offset_bytes, s.num_bytes) for s in inst.segments] == worker.pages.weight_segments(name)
        pulled = [worker.pages.global_view(s.global_offset_bytes, s.num_bytes) for s in inst.segments]
        assert [s.checksum for s in inst.segments] == [checksum(p) for p in pulled]


def test_kv_pages_whose_offsets_a_peer_holds_never_move(tiny_dir):
    """A P/D reservation hands the blocks' global offsets to a prefill worker, which writes there later: while it
    stands, compaction leaves those pages alone; once the request runs here, they may move."""
    from contracts import InstanceRole, Pool
    from worker.lifecycle.instance import ModelInstance
    from worker.xtensor import XTensor, XTensorConfig

    config = XTensorConfig(page_size_bytes=PAGE_BYTES, is_background_refill=False, kv_high_watermark_pages=0,
                           kv_low_watermark_pages=0)
    with XTensor.open("cpu", 128 * PAGE_BYTES, config) as pool:
        engines = {name: LLMEngine(tiny_dir, config=EngineConfig(kv_cache_bytes=2 << 20), kv_source=pool,
                                   weight_source=pool, owner=name) for name in ("low", "high")}
        low_blocks = engines["low"].reserve_kv_blocks("filler", 500)  # takes the lowest KV pages
        reserved = engines["high"].reserve_kv_blocks("handed-over", 300)  # pages above them
        offsets = engines["high"].kv_block_global_offsets(reserved)
        engines["low"].release_kv_blocks("filler")
        pool.run_kv_maintenance()  # the freed pages go back to the pool: a hole below the reserved ones
        assert low_blocks and pool.counters().fragmentation > 0
        inst = ModelInstance("w", "demo-tiny", "high", InstanceRole.DECODE, Pool.ELASTIC, tiny_dir, pool, None)
        inst.engine = engines["high"]
        compactor = Compactor(pool, COMPACTING)
        assert compactor.between_steps(inst, inst.engine) == 0
        assert engines["high"].kv_block_global_offsets(reserved) == offsets  # still where the peer will write
        prompt = [(i * 7) % 900 + 3 for i in range(300)]
        engines["high"].add_decode_request("handed-over", prompt, 5, SamplingParams(max_tokens=50, temperature=0),
                                           reserved)
        engines["high"].step()  # admitted: the blocks are the engine's own now
        assert compactor.between_steps(inst, inst.engine) > 0 and pool.stats().num_pages_copied > 0

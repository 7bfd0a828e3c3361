"""What the reconciler knows of the cluster: worker liveness and instances (heartbeats), and the instance registry
(the `instances` KV bucket). Pure bookkeeping; time is passed in.

Indexed as inputs arrive, not per question: the reconciler asks on every tick, and a fleet of hundreds of workers
(the simulator's 768 devices, a production fleet) would otherwise rebuild every map each time. A heartbeat that is
the same object as the worker's last one only refreshes its liveness."""
from __future__ import annotations

import re
from typing import NamedTuple

from contracts import ForkSource, InstanceRecord, InstanceStatus, ModelState, Pool, WorkerHeartbeat

# States in which an instance holds (or is about to hold) device pages and so must be removed when not wanted.
RESIDENT_STATES = frozenset(
    {ModelState.LOADING, ModelState.WAKING, ModelState.FORKING, ModelState.VERIFYING, ModelState.ACTIVE}
)
# ...and with DRAINING: states in which an instance occupies its devices. A device with one takes no new model's
# instance until it is gone (the newcomer's weights need its pages, and a drain shares the device's time).
OCCUPYING_STATES = RESIDENT_STATES | {ModelState.DRAINING}


def worker_order(worker_id: str) -> tuple:
    """Natural order of worker ids: w2 before w10 (devices in their physical order)."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", worker_id))


class SeenInstance(NamedTuple):
    """An instance as a heartbeat reports it (a tuple: a fleet's heartbeats make hundreds a second)."""

    worker_id: str
    status: InstanceStatus

    @property
    def load(self) -> int:
        return self.status.num_waiting + self.status.num_running

    @property
    def worker_ids(self) -> tuple[str, ...]:
        """Every device it holds: the lead worker that reports it, then a tensor-parallel group's others."""
        return (self.worker_id, *self.status.peer_worker_ids)


class ClusterView:
    def __init__(self, heartbeat_timeout_ms: float) -> None:
        self.heartbeat_timeout_ms = heartbeat_timeout_ms
        self._last_seen_ms: dict[str, float] = {}
        # workers met only in a registry record, with when this view first saw it: a record read at startup, before
        # any heartbeat had time to arrive, is no sign that its worker died (it gets the heartbeat timeout to speak)
        self._unheard_since_ms: dict[str, float] = {}
        self._last_tick_ms: float | None = None
        self._heartbeats: dict[str, WorkerHeartbeat] = {}
        self._records: dict[str, InstanceRecord] = {}
        self._records_by_model: dict[str, dict[str, InstanceRecord]] = {}
        # indexes of the latest heartbeats (of every worker, alive or not; queries filter by liveness)
        self._seen: dict[str, SeenInstance] = {}
        self._by_worker: dict[str, tuple[str, ...]] = {}  # worker -> the instance ids its heartbeat lists
        self._warm: dict[str, set[str]] = {}  # worker -> models it holds WARM
        self._draining: dict[str, SeenInstance] = {}
        self._shape: dict[str, tuple] = {}  # worker -> what its heartbeat says of its instances, loads aside
        self._ready_ids: set[str] = set()  # records that say ready
        # Versions: `structure_version` moves when an instance appears, leaves or changes state (not when only its
        # load counts change), `records_version` when a record changes. Derived maps are cached per version.
        self.structure_version = 0
        self.records_version = 0
        self._cache: dict[tuple, object] = {}
        self._ordered_workers: list[str] = []

    # -- inputs ------------------------------------------------------------------------------------------------

    def on_heartbeat(self, now_ms: float, hb: WorkerHeartbeat) -> None:
        prev = self._heartbeats.get(hb.worker_id)
        if prev is not None and hb.seq < prev.seq and hb.sent_unix_ms <= prev.sent_unix_ms:
            return  # a reordered old heartbeat must not roll the worker's state back
        # Liveness by our own clock at receipt: other machines' clocks may be skewed.
        self._last_seen_ms[hb.worker_id] = now_ms
        self._unheard_since_ms.pop(hb.worker_id, None)
        if hb is prev:
            return
        self._heartbeats[hb.worker_id] = hb
        if prev is None:
            self._ordered_workers = []  # a new worker: sorted again when asked
        self._index(hb, prev)

    def on_record(self, record: InstanceRecord) -> None:
        old = self._records.get(record.instance_id)
        if old is not None and old.model != record.model:
            self._records_by_model.get(old.model, {}).pop(record.instance_id, None)
        self._records[record.instance_id] = record
        self._records_by_model.setdefault(record.model, {})[record.instance_id] = record
        if record.is_ready:
            self._ready_ids.add(record.instance_id)
        else:
            self._ready_ids.discard(record.instance_id)
        self.records_version += 1

    def on_record_deleted(self, instance_id: str) -> None:
        old = self._records.pop(instance_id, None)
        if old is not None:
            self._records_by_model.get(old.model, {}).pop(instance_id, None)
            self._ready_ids.discard(instance_id)
            self.records_version += 1

    def _index(self, hb: WorkerHeartbeat, prev: WorkerHeartbeat | None = None) -> None:
        wid = hb.worker_id
        if prev is not None and self._same_shape(prev, hb):  # only load counts moved: the cheap path
            seen = self._seen
            for old, st in zip(prev.instances, hb.instances):
                if old is not st:
                    seen[st.instance_id] = entry = SeenInstance(wid, st)
                    if st.instance_id in self._draining:
                        self._draining[st.instance_id] = entry
            return
        for iid in self._by_worker.get(wid, ()):
            s = self._seen.get(iid)
            if s is not None and s.worker_id == wid:
                del self._seen[iid]
                self._draining.pop(iid, None)
        for st in hb.instances:
            seen = self._seen[st.instance_id] = SeenInstance(wid, st)
            if st.state == ModelState.DRAINING:
                self._draining[st.instance_id] = seen
        self._by_worker[wid] = tuple(st.instance_id for st in hb.instances)
        shape = tuple((st.instance_id, st.model, st.role, st.pool, st.state, st.peer_worker_ids)
                      for st in hb.instances)
        if shape != self._shape.get(wid):
            self._shape[wid] = shape
            self._warm[wid] = {st.model for st in hb.instances if st.state == ModelState.WARM}
            self.structure_version += 1
            self._cache.clear()

    @staticmethod
    def _same_shape(prev: WorkerHeartbeat, hb: WorkerHeartbeat) -> bool:
        """The same instances in the same states, in the same order (their load counts aside)."""
        if len(prev.instances) != len(hb.instances):
            return False
        for old, st in zip(prev.instances, hb.instances):
            if old is not st and (old.instance_id != st.instance_id or old.state != st.state or old.model != st.model
                                  or old.role != st.role or old.pool != st.pool
                                  or old.peer_worker_ids != st.peer_worker_ids):
                return False
        return True

    # -- queries -----------------------------------------------------------------------------------------------

    def last_seen_ms(self, worker_id: str) -> float:
        return self._last_seen_ms.get(worker_id, float("-inf"))

    def on_alive(self, now_ms: float, worker_ids) -> None:
        """Workers heard from again with nothing new to say: their last heartbeat stands (a batch of liveness, as a
        shell that sees unchanged heartbeats may report them)."""
        seen = self._last_seen_ms
        for w in worker_ids:
            if w in seen:
                seen[w] = now_ms

    def on_tick(self, now_ms: float, *, expected_period_ms: float | None = None, is_listening: bool = True) -> None:
        """The reconciler's own silence is not its workers': a shell whose event loop stalled (a loaded host, a long
        garbage collection) or that had no bus connection (its NATS node died) could not read the heartbeats sent
        meanwhile. `is_listening=False` stops every worker's clock since the last tick; a tick later than twice
        `expected_period_ms` shifts every clock forward by the excess (the dispatcher's watchdog does the same,
        runtime/liveness.py). Without `expected_period_ms` (the simulator, which ticks when it likes and never
        stalls) only the listening rule applies. On a loaded 2-core host the live reconciler marked both workers of
        a three-node NATS test FAILED and drained their instances (docs/reliability.md)."""
        last, self._last_tick_ms = self._last_tick_ms, now_ms
        if last is None or now_ms <= last:
            return
        if not is_listening:
            silence_ms = now_ms - last
        elif expected_period_ms is not None:
            silence_ms = now_ms - last - 2 * expected_period_ms
        else:
            return
        if silence_ms > 0:
            seen = self._last_seen_ms
            for w, t in seen.items():
                seen[w] = min(now_ms, t + silence_ms)
            for w, t in self._unheard_since_ms.items():
                self._unheard_since_ms[w] = min(now_ms, t + silence_ms)

    def alive_workers(self, now_ms: float) -> set[str]:
        return {w for w, t in self._last_seen_ms.items() if now_ms - t <= self.heartbeat_timeout_ms}

    def ordered_workers(self, alive: set[str]) -> list[str]:
        """The live workers in natural order."""
        if len(self._ordered_workers) != len(self._heartbeats):
            self._ordered_workers = sorted(self._heartbeats, key=worker_order)
        return [w for w in self._ordered_workers if w in alive]

    def is_ready(self, instance_id: str, alive: set[str]) -> bool:
        rec = self._records.get(instance_id)
        return rec is not None and rec.is_ready and rec.worker_id in alive

    def record(self, instance_id: str) -> InstanceRecord | None:
        return self._records.get(instance_id)

    def records(self) -> list[InstanceRecord]:
        return list(self._records.values())

    def _all_alive(self, alive: set[str]) -> bool:
        return len(alive) == len(self._heartbeats)  # the live workers are some of those heard from

    def alive_key(self, alive: set[str]) -> frozenset | None:
        """What a cache of answers for `alive` is keyed by: None when every worker heard from is alive."""
        return None if self._all_alive(alive) else frozenset(alive)

    def ready_ids(self, alive: set[str]) -> set[str]:
        """Instances whose record says ready, on live workers (a shared set: do not mutate)."""
        if self._all_alive(alive):
            return self._ready_ids
        return self._cached("ready", alive, lambda: {i for i in self._ready_ids if self._records[i].worker_id in alive},
                            self.records_version)

    def draining(self, alive: set[str]) -> dict[str, SeenInstance]:
        return {i: s for i, s in self._draining.items() if s.worker_id in alive}

    def _cached(self, name: str, alive: set[str], build, version: int | None = None):
        """`build()` once per version of the indexes and set of live workers (shared: callers must not mutate).
        Instances' load counts in what is cached may be older than the latest heartbeat."""
        key = (name, self.structure_version if version is None else version, self.alive_key(alive))
        out = self._cache.get(key)
        if out is None:
            if len(self._cache) > 64:  # liveness changing with no heartbeat change: keep the cache small
                self._cache.clear()
            out = self._cache[key] = build()
        return out

    def seen(self, alive: set[str]) -> dict[str, SeenInstance]:
        """Every instance the heartbeats of live workers report, by instance id (a shared map: do not mutate)."""
        if self._all_alive(alive):
            return self._seen
        return self._cached("seen", alive, lambda: {i: s for i, s in self._seen.items() if s.worker_id in alive})

    def resident(self, alive: set[str]) -> dict[str, SeenInstance]:
        return self._cached("resident", alive, lambda: {
            i: s for i, s in self.seen(alive).items() if s.status.state in RESIDENT_STATES})

    def elastic_instances(self, alive: set[str]) -> dict[str, SeenInstance]:
        """The elastic pool's instances that occupy their devices (loading, serving, draining)."""
        return self._cached("elastic", alive, lambda: {
            i: s for i, s in self.seen(alive).items()
            if s.status.pool == Pool.ELASTIC and s.status.state in OCCUPYING_STATES})

    def occupied_workers(self, alive: set[str]) -> set[str]:
        """Workers some instance occupies (loading, serving or draining), tensor-parallel groups' every device."""
        def build() -> set[str]:
            return {w for s in self.seen(alive).values() if s.status.state in OCCUPYING_STATES for w in s.worker_ids}
        return self._cached("occupied", alive, build)

    def instance_on(self, worker_id: str, model: str, role, pool, alive: set[str]) -> str | None:
        """The id of an instance of `model` in `role` and `pool` on `worker_id`: one its heartbeat reports (not
        failed or cold), else one whose record says ready there."""
        if worker_id not in alive:
            return None
        found = None
        for iid in self._by_worker.get(worker_id, ()):
            s = self._seen.get(iid)
            st = s.status if s is not None else None
            if (st is not None and st.model == model and st.role == role and st.pool == pool
                    and st.state not in (ModelState.FAILED, ModelState.COLD)):
                found = iid
        if found is not None:
            return found
        for iid, rec in self._records_by_model.get(model, {}).items():
            if rec.is_ready and rec.worker_id == worker_id and rec.role == role and rec.pool == pool:
                return iid
        return None

    def warm_models(self, worker_id: str) -> set[str]:
        return self._warm.get(worker_id, set())

    def warm_index(self) -> dict[str, set[str]]:
        """Worker -> the models it holds WARM (a shared map: do not mutate)."""
        return self._warm

    def heartbeat(self, worker_id: str) -> WorkerHeartbeat | None:
        return self._heartbeats.get(worker_id)

    def fork_source(self, model: str, alive: set[str], exclude_ids: set[str],
                    target_worker: str = "") -> ForkSource | None:
        """The best live source to fork `model` from: a ready replica of the same model on a live worker that
        publishes a transfer session and the replica's weight segments, least loaded first. Without one, a WARM
        instance's host copy offered by another live worker (a remote warm pull, faster than the disk): never one on
        `target_worker`, which would wake its own."""
        best: tuple[int, str, ForkSource] | None = None
        for iid, rec in self._records_by_model.get(model, {}).items():
            if iid in exclude_ids or not rec.is_ready or rec.worker_id not in alive:
                continue
            s = self._seen.get(iid)
            hb = self._heartbeats.get(rec.worker_id)
            if s is None or s.worker_id != rec.worker_id or hb is None or not hb.transfer_session:
                continue
            if not s.status.weight_segments or s.status.state != ModelState.ACTIVE or hb.is_draining:
                continue
            key = (s.load, iid)
            if best is None or key < best[:2]:
                src = ForkSource(worker_id=rec.worker_id, instance_id=iid, transfer_session=hb.transfer_session,
                                 segments=s.status.weight_segments)
                best = (s.load, iid, src)
        return best[2] if best else self._host_copy_source(model, alive, exclude_ids, target_worker)

    def _host_copy_source(self, model: str, alive: set[str], exclude_ids: set[str],
                          target_worker: str) -> ForkSource | None:
        for wid in self.ordered_workers(alive):
            if wid == target_worker or wid not in alive or model not in self._warm.get(wid, ()):
                continue
            hb = self._heartbeats[wid]
            if not hb.transfer_session or hb.is_draining:
                continue
            for st in sorted(hb.instances, key=lambda st: st.instance_id):
                if (st.model == model and st.state == ModelState.WARM and st.host_copy is not None
                        and st.host_copy.segments and st.instance_id not in exclude_ids):
                    return ForkSource(worker_id=wid, instance_id=st.instance_id, transfer_session=hb.transfer_session,
                                      segments=st.host_copy.segments, kind="host_copy",
                                      base_offset_bytes=st.host_copy.base_offset_bytes)
        return None

    def stale_records(self, now_ms: float, alive: set[str] | None = None) -> list[tuple[InstanceRecord, ModelState, str]]:
        """Records that say ready but are not: the worker is dead, or a heartbeat sent after the record was
        written no longer shows the instance active. Returns (record, true state, why)."""
        alive = self.alive_workers(now_ms) if alive is None else alive
        key = ("stale", self.structure_version, self.records_version, self.alive_key(alive))
        if self._cache.get(key) == []:
            return []  # nothing changed since the last look found nothing
        out = []
        is_waiting = False  # on a worker not heard from yet: the answer changes with time alone, so it is not cached
        for iid in self._ready_ids:
            rec = self._records[iid]
            if rec.worker_id not in alive:
                if rec.worker_id not in self._last_seen_ms:
                    since = self._unheard_since_ms.setdefault(rec.worker_id, now_ms)
                    if now_ms - since <= self.heartbeat_timeout_ms:
                        is_waiting = True
                        continue
                    out.append((rec, ModelState.FAILED, f"worker {rec.worker_id} not heard from in "
                                f"{self.heartbeat_timeout_ms:.0f} ms"))
                    continue
                out.append((rec, ModelState.FAILED, f"worker {rec.worker_id} silent > {self.heartbeat_timeout_ms:.0f} ms"))
                continue
            hb = self._heartbeats[rec.worker_id]
            if hb.sent_unix_ms <= rec.updated_unix_ms:
                continue  # the heartbeat may predate the transition the record reports
            s = self._seen.get(rec.instance_id)
            st = s.status if s is not None and s.worker_id == rec.worker_id else None
            if st is None:
                out.append((rec, ModelState.COLD, "the worker no longer reports this instance"))
            elif st.state != ModelState.ACTIVE:
                out.append((rec, st.state, f"the worker reports it {st.state.value}"))
        if not out and not is_waiting:
            if len(self._cache) > 64:
                self._cache.clear()
            self._cache[key] = out
        return out

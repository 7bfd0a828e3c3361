"""What the reconciler knows of the cluster: worker liveness and instances (heartbeats), and the instance registry
(the `instances` KV bucket). Pure bookkeeping; time is passed in."""
from __future__ import annotations

from dataclasses import dataclass

from contracts import ForkSource, InstanceRecord, InstanceStatus, ModelState, WorkerHeartbeat

# States in which an instance holds (or is about to hold) device pages and so must be removed when not wanted.
RESIDENT_STATES = frozenset(
    {ModelState.LOADING, ModelState.WAKING, ModelState.FORKING, ModelState.VERIFYING, ModelState.ACTIVE}
)


@dataclass(frozen=True)
class SeenInstance:
    worker_id: str
    status: InstanceStatus

    @property
    def load(self) -> int:
        return self.status.num_waiting + self.status.num_running


class ClusterView:
    def __init__(self, heartbeat_timeout_ms: float) -> None:
        self.heartbeat_timeout_ms = heartbeat_timeout_ms
        self._last_seen_ms: dict[str, float] = {}
        self._heartbeats: dict[str, WorkerHeartbeat] = {}
        self._records: dict[str, InstanceRecord] = {}

    # -- inputs ------------------------------------------------------------------------------------------------

    def on_heartbeat(self, now_ms: float, hb: WorkerHeartbeat) -> None:
        prev = self._heartbeats.get(hb.worker_id)
        if prev is not None and hb.seq < prev.seq and hb.sent_unix_ms <= prev.sent_unix_ms:
            return  # a reordered old heartbeat must not roll the worker's state back
        self._heartbeats[hb.worker_id] = hb
        # Liveness by our own clock at receipt: other machines' clocks may be skewed.
        self._last_seen_ms[hb.worker_id] = now_ms

    def on_record(self, record: InstanceRecord) -> None:
        self._records[record.instance_id] = record

    def on_record_deleted(self, instance_id: str) -> None:
        self._records.pop(instance_id, None)

    # -- queries -----------------------------------------------------------------------------------------------

    def last_seen_ms(self, worker_id: str) -> float:
        return self._last_seen_ms.get(worker_id, float("-inf"))

    def alive_workers(self, now_ms: float) -> set[str]:
        return {w for w, t in self._last_seen_ms.items() if now_ms - t <= self.heartbeat_timeout_ms}

    def is_ready(self, instance_id: str, alive: set[str]) -> bool:
        rec = self._records.get(instance_id)
        return rec is not None and rec.is_ready and rec.worker_id in alive

    def record(self, instance_id: str) -> InstanceRecord | None:
        return self._records.get(instance_id)

    def records(self) -> list[InstanceRecord]:
        return list(self._records.values())

    def seen(self, alive: set[str]) -> dict[str, SeenInstance]:
        """Every instance the heartbeats of live workers report, by instance id."""
        out: dict[str, SeenInstance] = {}
        for wid in sorted(alive):
            hb = self._heartbeats.get(wid)
            for st in hb.instances if hb else ():
                out[st.instance_id] = SeenInstance(wid, st)
        return out

    def resident(self, alive: set[str]) -> dict[str, SeenInstance]:
        return {iid: s for iid, s in self.seen(alive).items() if s.status.state in RESIDENT_STATES}

    def warm_models(self, worker_id: str) -> set[str]:
        hb = self._heartbeats.get(worker_id)
        return {st.model for st in hb.instances if st.state == ModelState.WARM} if hb else set()

    def heartbeat(self, worker_id: str) -> WorkerHeartbeat | None:
        return self._heartbeats.get(worker_id)

    def fork_source(self, model: str, alive: set[str], exclude_ids: set[str],
                    target_worker: str = "") -> ForkSource | None:
        """The best live source to fork `model` from: a ready replica of the same model on a live worker that
        publishes a transfer session and the replica's weight segments, least loaded first. Without one, a WARM
        instance's host copy offered by another live worker (a remote warm pull, faster than the disk): never one on
        `target_worker`, which would wake its own."""
        seen = self.seen(alive)
        best: tuple[int, str, ForkSource] | None = None
        for iid, rec in self._records.items():
            if rec.model != model or iid in exclude_ids or not self.is_ready(iid, alive):
                continue
            s = seen.get(iid)
            hb = self._heartbeats.get(rec.worker_id)
            if s is None or hb is None or not hb.transfer_session or not s.status.weight_segments:
                continue
            if s.status.state != ModelState.ACTIVE or hb.is_draining:
                continue
            src = ForkSource(
                worker_id=rec.worker_id,
                instance_id=iid,
                transfer_session=hb.transfer_session,
                segments=s.status.weight_segments,
            )
            key = (s.load, iid)
            if best is None or key < best[:2]:
                best = (s.load, iid, src)
        return best[2] if best else self._host_copy_source(model, alive, exclude_ids, target_worker)

    def _host_copy_source(self, model: str, alive: set[str], exclude_ids: set[str],
                          target_worker: str) -> ForkSource | None:
        for wid in sorted(alive - {target_worker}):
            hb = self._heartbeats.get(wid)
            if hb is None or not hb.transfer_session or hb.is_draining:
                continue
            for st in sorted(hb.instances, key=lambda st: st.instance_id):
                if (st.model == model and st.state == ModelState.WARM and st.host_copy is not None
                        and st.host_copy.segments and st.instance_id not in exclude_ids):
                    return ForkSource(worker_id=wid, instance_id=st.instance_id, transfer_session=hb.transfer_session,
                                      segments=st.host_copy.segments, kind="host_copy",
                                      base_offset_bytes=st.host_copy.base_offset_bytes)
        return None

    def stale_records(self, now_ms: float) -> list[tuple[InstanceRecord, ModelState, str]]:
        """Records that say ready but are not: the worker is dead, or a heartbeat sent after the record was
        written no longer shows the instance active. Returns (record, true state, why)."""
        alive = self.alive_workers(now_ms)
        out = []
        for rec in self._records.values():
            if not rec.is_ready:
                continue
            if rec.worker_id not in alive:
                out.append((rec, ModelState.FAILED, f"worker {rec.worker_id} silent > {self.heartbeat_timeout_ms:.0f} ms"))
                continue
            hb = self._heartbeats[rec.worker_id]
            if hb.sent_unix_ms <= rec.updated_unix_ms:
                continue  # the heartbeat may predate the transition the record reports
            st = next((s for s in hb.instances if s.instance_id == rec.instance_id), None)
            if st is None:
                out.append((rec, ModelState.COLD, "the worker no longer reports this instance"))
            elif st.state != ModelState.ACTIVE:
                out.append((rec, st.state, f"the worker reports it {st.state.value}"))
        return out

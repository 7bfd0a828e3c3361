"""A scripted stand-in for worker processes in the reconciler's unit tests: it applies lifecycle commands to instance
states and produces the replies, heartbeats and registry records a worker would. The real worker service, over a
real nats-server, is what the bus tests drive; here the point is the reconciler's decisions on exact inputs."""
from __future__ import annotations

from contracts import (
    DeviceInfo,
    HostCopy,
    InstanceRecord,
    InstanceRole,
    InstanceStatus,
    LifecycleAction,
    LifecycleCommand,
    LifecycleReply,
    ModelState,
    PageCounters,
    Pool,
    WeightSegment,
    WorkerHeartbeat,
)

UP = {LifecycleAction.ACTIVATE, LifecycleAction.FORK_FROM}


class ScriptedWorkers:
    def __init__(self, worker_ids: list[str]) -> None:
        self.instances: dict[str, dict[str, InstanceStatus]] = {w: {} for w in worker_ids}
        self.seq = 0
        self.received: list[LifecycleCommand] = []

    def put(self, model: str, worker_id: str, role: InstanceRole, pool: Pool, state: ModelState,
            load: int = 0, instance_id: str | None = None, host_copy: HostCopy | None = None) -> str:
        iid = instance_id or f"{model}@{worker_id}/{role.value}"
        self.instances[worker_id][iid] = InstanceStatus(
            instance_id=iid, model=model, role=role, pool=pool, state=state, num_running=load,
            weight_segments=(WeightSegment(global_offset_bytes=0, num_bytes=4096),), host_copy=host_copy,
        )
        return iid

    def heartbeat(self, worker_id: str, now_ms: float) -> WorkerHeartbeat:
        self.seq += 1
        return WorkerHeartbeat(
            worker_id=worker_id, seq=self.seq, sent_unix_ms=now_ms,
            device=DeviceInfo(kind="cpu", name="test", hbm_bytes=1 << 30),
            pages=PageCounters(page_size_bytes=2 << 20, num_pages_total=512, num_pages_free=512, fragmentation=0.0),
            instances=tuple(self.instances[worker_id].values()),
            transfer_session=f"{worker_id}:7000",
        )

    def record(self, instance_id: str, now_ms: float) -> InstanceRecord:
        for wid, insts in self.instances.items():
            if instance_id in insts:
                st = insts[instance_id]
                return InstanceRecord(
                    instance_id=instance_id, model=st.model, worker_id=wid, role=st.role, pool=st.pool,
                    state=st.state, is_ready=st.state == ModelState.ACTIVE, updated_unix_ms=now_ms,
                )
        raise KeyError(instance_id)

    def apply(self, cmd: LifecycleCommand, now_ms: float, ok: bool = True) -> LifecycleReply:
        """Runs the command to its end state at once (ok) or fails it (not ok: the instance is FAILED)."""
        self.received.append(cmd)
        insts = self.instances[cmd.worker_id]
        if not ok:
            state = ModelState.FAILED
        elif cmd.action in UP:
            state = ModelState.ACTIVE
        elif cmd.action == LifecycleAction.WARM:
            state = ModelState.WARM
        else:
            state = ModelState.COLD
        insts[cmd.instance_id] = InstanceStatus(
            instance_id=cmd.instance_id, model=cmd.model, role=cmd.role, pool=cmd.pool, state=state,
            weight_segments=(WeightSegment(global_offset_bytes=0, num_bytes=4096),),
        )
        return LifecycleReply(command_id=cmd.command_id, instance_id=cmd.instance_id, ok=ok, state=state,
                              detail="" if ok else "injected failure")

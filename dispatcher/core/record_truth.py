"""A worker's own heartbeat against the registry records of its instances: which records it proves wrong.

The registry is written by the worker (its transitions, a refresh every 5 s) and by the reconciler, which marks the
records of a worker it takes for dead FAILED. The reconciler can be wrong about that: right after its own start (it
has read the registry but not yet heard the workers) or after losing its own NATS node, it finds every worker silent
(seen in the three-node e2e test: both records FAILED 0.2 s after the reconciler started). The workers' next refresh
puts the truth back, but a refresh is a JetStream write, and during a leader election (a node lost) it fails for
as long as the election lasts; the dispatcher then had no routable instance, and a new request waited for one (30 s,
then `no_instance`) while the instances streamed on. The worker's heartbeat, which reaches the dispatcher every
0.5 s over core NATS, is fresher evidence from the instance's owner: a FAILED record written before a heartbeat that
reports the instance ACTIVE is stale. Records the reconciler writes for a drain (is_ready False, DRAINING) are not
undone: the worker may report ACTIVE for a moment before the drain command reaches it.
"""
from __future__ import annotations

from typing import Mapping

from contracts import InstanceRecord, ModelState, WorkerHeartbeat


def corrected_by_heartbeat(records: Mapping[str, InstanceRecord],
                           heartbeat: WorkerHeartbeat) -> dict[str, InstanceRecord]:
    """Key -> corrected record for each record of the heartbeat's worker that says FAILED, was written before the
    heartbeat was sent, and names an instance the heartbeat reports ACTIVE: ready and ACTIVE as of the heartbeat
    (a newer record lifts the core's ban on the instance, InstanceView.update)."""
    active = {st.instance_id for st in heartbeat.instances if st.state == ModelState.ACTIVE}
    if not active:
        return {}
    return {key: record.model_copy(update={"is_ready": True, "state": ModelState.ACTIVE,
                                           "updated_unix_ms": heartbeat.sent_unix_ms})
            for key, record in records.items()
            if record.worker_id == heartbeat.worker_id and record.instance_id in active
            and record.state == ModelState.FAILED and record.updated_unix_ms < heartbeat.sent_unix_ms}

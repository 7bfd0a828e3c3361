"""Subject names of the bus: the only place they are spelt. Model and worker names become one subject token each."""
from __future__ import annotations

import re

PREFIX = "janus"

# gateway -> dispatcher (queue group DISPATCH_QUEUE); payload GenerateRequest, reply SubmitAck
REQ_WILDCARD = f"{PREFIX}.req.*"
DISPATCH_QUEUE = "dispatchers"
# gateway -> workers, dispatchers: a client went away; payload CancelRequest
CANCEL = f"{PREFIX}.cancel"
# worker -> dispatchers: a prefill finished (EPDT correction); payload PrefillDone
PREFILL_DONE = f"{PREFIX}.event.prefill"
# worker -> dispatchers: a request finished, with its on-time output tokens (token-level attainment); payload
# RequestOutcome
REQUEST_OUTCOME = f"{PREFIX}.event.outcome"
# worker -> all: lifecycle transitions; payload LifecycleEvent
LIFECYCLE_EVENT = f"{PREFIX}.event.lifecycle"
# worker -> all: heartbeats; payload WorkerHeartbeat
WORKER_TELEMETRY_WILDCARD = f"{PREFIX}.telemetry.worker.*"
# dispatcher -> gateways: liveness; payload DispatcherHeartbeat
DISPATCHER_TELEMETRY_WILDCARD = f"{PREFIX}.telemetry.dispatcher.*"
# dispatcher -> oracle, planners: load windows; payload ModelLoadWindow
MODEL_TELEMETRY_WILDCARD = f"{PREFIX}.telemetry.model.*"
# planners -> oracle (request/reply)
ORACLE_CAPACITY = f"{PREFIX}.oracle.capacity"
ORACLE_ELASTICITY = f"{PREFIX}.oracle.elasticity"
ORACLE_QUEUE = "oracles"
# planners -> reconciler, auditors; kept in the JetStream stream PLANS
PLAN_STEADY = f"{PREFIX}.plan.steady"
PLAN_ELASTIC = f"{PREFIX}.plan.elastic"
PLAN_ACTION = f"{PREFIX}.plan.action"  # reconciler: a command issued for a plan, and its outcome
PLAN_STATUS = f"{PREFIX}.plan.status"  # reconciler: a plan done, superseded, blocked or ignored
PLAN_WILDCARD = f"{PREFIX}.plan.>"
PLANS_STREAM = "PLANS"
# health: every service answers on its own subject and on the broadcast one
HEALTH_WILDCARD = f"{PREFIX}.health.>"
HEALTH_ALL = f"{PREFIX}.health.all"
# KV buckets
INSTANCES_BUCKET = "instances"
# the planners' leases: one key per role (steady-planner, elastic-scaler, reconciler), entries expire (planner/leader.py)
LEASES_BUCKET = "leases"
# gateway replies: <REPLY_PREFIX>.<gateway id>.<request id>
REPLY_PREFIX = f"{PREFIX}.reply"

_SAFE = re.compile(r"^[A-Za-z0-9_-]+$")


def token(name: str) -> str:
    """One subject token for a model or worker name. Names outside [A-Za-z0-9_-] are escaped (`.` would split the
    subject, `*` and `>` are wildcards) with `~xx` hex, which no plain name contains, so two names never collide."""
    if not name:
        raise ValueError("an empty name cannot be a subject token")
    if _SAFE.match(name):
        return name
    return "".join(ch if _SAFE.match(ch) else "".join(f"~{b:02x}" for b in ch.encode()) for ch in name)


def untoken(tok: str) -> str:
    """Inverse of `token`."""
    if "~" not in tok:
        return tok
    out = bytearray()
    i = 0
    while i < len(tok):
        if tok[i] == "~":
            out.append(int(tok[i + 1 : i + 3], 16))
            i += 3
        else:
            out.extend(tok[i].encode())
            i += 1
    return out.decode()


def req(model: str) -> str:
    return f"{PREFIX}.req.{token(model)}"


def worker_run(worker_id: str) -> str:
    return f"{PREFIX}.worker.{token(worker_id)}.run"


def worker_cmd(worker_id: str) -> str:
    return f"{PREFIX}.worker.{token(worker_id)}.cmd"


def worker_move(worker_id: str) -> str:
    return f"{PREFIX}.worker.{token(worker_id)}.move"


def worker_resend(worker_id: str) -> str:
    return f"{PREFIX}.worker.{token(worker_id)}.resend"


def worker_holds(worker_id: str) -> str:
    return f"{PREFIX}.worker.{token(worker_id)}.holds"


def worker_telemetry(worker_id: str) -> str:
    return f"{PREFIX}.telemetry.worker.{token(worker_id)}"


def model_telemetry(model: str) -> str:
    return f"{PREFIX}.telemetry.model.{token(model)}"


def dispatcher_telemetry(dispatcher_id: str) -> str:
    return f"{PREFIX}.telemetry.dispatcher.{token(dispatcher_id)}"


def reply(gateway_id: str, request_id: str) -> str:
    return f"{REPLY_PREFIX}.{token(gateway_id)}.{token(request_id)}"


def reply_wildcard(gateway_id: str) -> str:
    return f"{REPLY_PREFIX}.{token(gateway_id)}.*"


def health(service: str, instance: str) -> str:
    return f"{PREFIX}.health.{token(service)}.{token(instance)}"


def instance_key(instance_id: str) -> str:
    """Key in the `instances` bucket (KV keys allow [-/_=.a-zA-Z0-9]; `token` output is a subset)."""
    return token(instance_id).replace("~", "=")

"""NATS users per service with subject permissions, and the server configuration that enforces them.

Each service may publish and subscribe only where its job needs: a worker cannot publish plans, a gateway cannot
command workers, nobody but the reconciler sends lifecycle commands. Replies to requests a service received are
allowed through `allow_responses`. `janus up` generates fresh passwords per cluster (kept in the state directory,
mode 0600) and hands each service its own; `janus nats-config` writes the same for a production NATS cluster.
"""
from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

JS_API = "$JS.API.>"  # JetStream API (streams, consumers, KV)
KV_INSTANCES = "$KV.instances.>"
INBOX = "_INBOX.>"
HEALTH = "janus.health.>"


@dataclass(frozen=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]


SERVICE_PERMISSIONS: dict[str, Permissions] = {
    "gateway": Permissions(  # reads telemetry, lifecycle events and plans for its read-only status page
        publish=("janus.req.*", "janus.cancel", "janus.worker.*.resend", JS_API, INBOX),
        subscribe=("janus.reply.>", "janus.telemetry.>", "janus.plan.>", "janus.event.lifecycle", INBOX, HEALTH)),
    "dispatcher": Permissions(
        publish=("janus.worker.*.run", "janus.reply.>", "janus.telemetry.model.*", "janus.telemetry.dispatcher.*",
                 JS_API, INBOX),
        subscribe=("janus.req.*", "janus.cancel", "janus.event.prefill", "janus.telemetry.worker.*", INBOX, HEALTH)),
    "worker": Permissions(
        # janus.worker.*.run: a prefill worker reserves KV blocks on, and hands requests over to, a decode worker
        # janus.cancel: a P/D request that ends at its first token releases the decode worker's reservation
        publish=("janus.reply.>", "janus.event.prefill", "janus.event.lifecycle", "janus.telemetry.worker.*",
                 "janus.worker.*.run", "janus.worker.*.resend", "janus.cancel", KV_INSTANCES, JS_API, INBOX),
        subscribe=("janus.worker.>", "janus.cancel", "janus.telemetry.worker.*", INBOX, HEALTH)),
    "oracle": Permissions(  # heartbeats: how many replicas served each load window it learns from
        publish=(INBOX,),
        subscribe=("janus.oracle.>", "janus.telemetry.model.*", "janus.telemetry.worker.*", INBOX, HEALTH)),
    "steady-planner": Permissions(
        publish=("janus.plan.steady", "janus.oracle.>", JS_API, INBOX),
        subscribe=("janus.telemetry.>", "janus.plan.>", INBOX, HEALTH)),
    "elastic-scaler": Permissions(
        publish=("janus.plan.elastic", "janus.oracle.>", JS_API, INBOX),
        subscribe=("janus.telemetry.>", "janus.plan.>", INBOX, HEALTH)),
    "reconciler": Permissions(
        publish=("janus.worker.*.cmd", "janus.plan.action", "janus.plan.status", KV_INSTANCES, JS_API, INBOX),
        subscribe=("janus.plan.>", "janus.telemetry.>", "janus.event.lifecycle", INBOX, HEALTH)),
    # people and tools (janus up's health checks, janus status, janus audit): read everything, command nothing
    "operator": Permissions(
        publish=(HEALTH, JS_API, INBOX),
        subscribe=(">",)),
}


def generate_credentials() -> dict[str, str]:
    return {user: secrets.token_urlsafe(24) for user in SERVICE_PERMISSIONS}


def load_or_create_credentials(path: Path) -> dict[str, str]:
    """Passwords for each service user, created once per state directory (file mode 0600)."""
    if path.exists():
        creds = json.loads(path.read_text())
        if set(creds) >= set(SERVICE_PERMISSIONS):
            return creds
    creds = generate_credentials()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(creds, f)
    return creds


def _quoted(items: tuple[str, ...]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def nats_authorization_block(credentials: dict[str, str]) -> str:
    """The `authorization { users = [...] }` block of a nats-server configuration file."""
    users = []
    for user, perms in SERVICE_PERMISSIONS.items():
        users.append(
            f"    {{user: {json.dumps(user)}, password: {json.dumps(credentials[user])}, permissions: {{\n"
            f"      publish: {{allow: {_quoted(perms.publish)}}},\n"
            f"      subscribe: {{allow: {_quoted(perms.subscribe)}}},\n"
            f"      allow_responses: true\n"
            f"    }}}}")
    return "authorization {\n  users = [\n" + ",\n".join(users) + "\n  ]\n}\n"


def write_nats_config(path: Path, credentials: dict[str, str], *, tls_cert: Path | None = None,
                      tls_key: Path | None = None, tls_ca: Path | None = None) -> Path:
    parts = [nats_authorization_block(credentials)]
    if tls_cert and tls_key:
        ca = f"\n  ca_file: {json.dumps(str(tls_ca))}" if tls_ca else ""
        parts.append(f"tls {{\n  cert_file: {json.dumps(str(tls_cert))}\n  key_file: {json.dumps(str(tls_key))}"
                     f"{ca}\n}}\n")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(parts))
    return path


def user_for_service(service: str) -> str:
    return service if service in SERVICE_PERMISSIONS else "operator"


def operator_login(settings) -> tuple[str | None, str | None]:
    """Credentials for tools (status, audit): the settings' own, else the operator of a `janus up` state dir."""
    if settings.nats_user:
        return settings.nats_user, settings.nats_password
    path = Path(settings.state_dir) / "credentials.json"
    if path.exists():
        return "operator", json.loads(path.read_text()).get("operator")
    return None, None

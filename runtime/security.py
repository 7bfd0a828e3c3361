"""NATS users per service with subject permissions, and the server configuration that enforces them.

Each service may publish and subscribe only where its job needs: a worker cannot publish plans, a gateway cannot
command workers, nobody but the reconciler sends lifecycle commands. Replies to requests a service received are
allowed through `allow_responses`. `janus up` generates fresh passwords per cluster (kept in the state directory,
mode 0600) and hands each service its own; `janus nats-config` writes the same for a production NATS cluster (and a
`passwords.env` a Kubernetes Secret is generated from).
"""
from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from contracts import subjects

INBOX = "_INBOX.>"
HEALTH = "janus.health.>"
PLANS = subjects.PLANS_STREAM
KV_STREAM = f"KV_{subjects.INSTANCES_BUCKET}"  # the stream behind the `instances` KV bucket
KV_INSTANCES_WRITE = f"$KV.{subjects.INSTANCES_BUCKET}.>"  # a KV put or delete is a publish on $KV.<bucket>.<key>
KV_LEASES = f"KV_{subjects.LEASES_BUCKET}"  # the planners' leader leases (planner/leader.py)


def lease(role: str) -> tuple[str, ...]:
    """A planner's campaign: create the lease bucket when first (or bring its TTL to the lease policy's), read a
    lease (a refused create looks at the key), and write its own role's key only: a planner cannot take, refresh
    or delete another role's lease."""
    return (*js_configure(KV_LEASES), *js_get(KV_LEASES), f"$KV.{subjects.LEASES_BUCKET}.{role}")


# JetStream is reached only through API subjects named after one stream, never "$JS.API.>": with the whole API a
# service could create a stream whose RePublish target is a worker's command subject (the server does not check a
# RePublish target against the creator's publish permissions), or delete and purge the audit trail. Nobody gets
# STREAM.DELETE, STREAM.PURGE, STREAM.MSG.DELETE or CONSUMER.DELETE (the PLANS stream refuses the first three in its
# own configuration as well). These are the calls nats-py 2.16 makes, seen in a nats-server trace.
def js_get(stream: str) -> tuple[str, ...]:
    """Look up a stream and get one message of it (the last one on a subject, say)."""
    return (f"$JS.API.STREAM.INFO.{stream}", f"$JS.API.STREAM.MSG.GET.{stream}")


def js_read(stream: str) -> tuple[str, ...]:
    """js_get, and follow the stream with an ephemeral (ordered) consumer (a KV watch is one)."""
    api = "$JS.API"
    return (*js_get(stream), f"{api}.CONSUMER.CREATE.{stream}", f"{api}.CONSUMER.CREATE.{stream}.>",
            f"{api}.CONSUMER.INFO.{stream}.*")


def js_create(stream: str) -> tuple[str, ...]:
    """Create the stream when missing (every service that needs it at start may be the first one up)."""
    return (f"$JS.API.STREAM.INFO.{stream}", f"$JS.API.STREAM.CREATE.{stream}")


def js_configure(stream: str) -> tuple[str, ...]:
    """Create it, or bring an existing one's configuration (replicas, retention, deny-delete) up to date."""
    return (*js_create(stream), f"$JS.API.STREAM.UPDATE.{stream}")


@dataclass(frozen=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]

    def __post_init__(self) -> None:  # the js_* groups overlap: each subject once in the server configuration
        object.__setattr__(self, "publish", tuple(dict.fromkeys(self.publish)))
        object.__setattr__(self, "subscribe", tuple(dict.fromkeys(self.subscribe)))


SERVICE_PERMISSIONS: dict[str, Permissions] = {
    "gateway": Permissions(  # reads the registry, telemetry, lifecycle events and plans for its status page
        publish=("janus.req.*", "janus.cancel", "janus.worker.*.resend", *js_read(KV_STREAM),
                 *js_get(PLANS), INBOX),
        subscribe=("janus.reply.>", "janus.telemetry.>", "janus.plan.>", "janus.event.lifecycle", INBOX, HEALTH)),
    "dispatcher": Permissions(  # watches the registry; creates it with the cluster's replicas when first up
        publish=("janus.worker.*.run", "janus.worker.*.holds", "janus.worker.*.move", "janus.reply.>",
                 "janus.telemetry.model.*",
                 "janus.telemetry.dispatcher.*",
                 *js_create(KV_STREAM), *js_read(KV_STREAM), INBOX),
        subscribe=("janus.req.*", "janus.cancel", "janus.event.prefill", "janus.event.outcome",
                   "janus.telemetry.worker.*", INBOX, HEALTH)),
    "worker": Permissions(
        # janus.worker.*.run: a prefill worker reserves KV blocks on, and hands requests over to, a decode worker
        # janus.cancel: a P/D request that ends at its first token releases the decode worker's reservation
        publish=("janus.reply.>", "janus.event.prefill", "janus.event.outcome", "janus.event.lifecycle",
                 "janus.telemetry.worker.*", "janus.worker.*.run", "janus.worker.*.resend", "janus.cancel",
                 KV_INSTANCES_WRITE, *js_create(KV_STREAM), INBOX),
        subscribe=("janus.worker.>", "janus.cancel", "janus.telemetry.worker.*", INBOX, HEALTH)),
    "oracle": Permissions(  # heartbeats: how many replicas served each load window it learns from
        publish=(INBOX,),
        subscribe=("janus.oracle.>", "janus.telemetry.model.*", "janus.telemetry.worker.*", INBOX, HEALTH)),
    # the planners append to PLANS (each event chained to the last one, which they read) and configure it
    "steady-planner": Permissions(
        publish=("janus.plan.steady", "janus.oracle.>", *js_configure(PLANS), *js_get(PLANS),
                 *lease("steady-planner"), INBOX),
        subscribe=("janus.telemetry.>", "janus.plan.>", INBOX, HEALTH)),
    "elastic-scaler": Permissions(
        publish=("janus.plan.elastic", "janus.oracle.>", *js_configure(PLANS), *js_get(PLANS),
                 *lease("elastic-scaler"), INBOX),
        subscribe=("janus.telemetry.>", "janus.plan.>", INBOX, HEALTH)),
    "reconciler": Permissions(
        publish=("janus.worker.*.cmd", "janus.plan.action", "janus.plan.status", KV_INSTANCES_WRITE,
                 *js_configure(PLANS), *js_get(PLANS), *js_create(KV_STREAM), *js_read(KV_STREAM),
                 *lease("reconciler"), INBOX),
        subscribe=("janus.plan.>", "janus.telemetry.>", "janus.event.lifecycle", INBOX, HEALTH)),
    # people and tools (janus up's health checks, janus status, janus audit): read everything, command nothing, and
    # create, change, delete or purge nothing in JetStream
    "operator": Permissions(
        publish=(HEALTH, *js_read(PLANS), *js_read(KV_STREAM), *js_read(KV_LEASES), INBOX),
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
    write_private(path, json.dumps(creds))
    return creds


def write_private(path: Path, text: str) -> Path:
    """Write a file only its owner may read (0600), for anything holding a password or an API key. The mode is set
    on the open file too: O_CREAT's mode applies only to a new file, and an older file may have been 0644."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(text)
    return path


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
    return write_private(path, "\n".join(parts))


def write_password_env(path: Path, credentials: dict[str, str]) -> Path:
    """`user=password` lines (0600): what a Kubernetes Secret is made of (kustomize `secretGenerator: envs:`,
    deploy/k8s/base/kustomization.yaml); each deployment reads its own key as JANUS_NATS_PASSWORD."""
    return write_private(path, "".join(f"{user}={credentials[user]}\n" for user in SERVICE_PERMISSIONS))


def compose_password_var(user: str) -> str:
    """The variable docker-compose.yml reads a user's password from: JANUS_NATS_PASSWORD_STEADY_PLANNER."""
    return "JANUS_NATS_PASSWORD_" + user.upper().replace("-", "_")


def write_compose_env(path: Path, credentials: dict[str, str], nats_conf: Path) -> Path:
    """`docker compose --env-file` input (0600): where NATS finds its users (an absolute path, as compose mounts it)
    and each service's password (docker-compose.yml, docs/operations.md "Docker Compose")."""
    lines = [f"JANUS_NATS_CONF={Path(nats_conf).resolve()}\n"]
    lines += [f"{compose_password_var(user)}={credentials[user]}\n" for user in SERVICE_PERMISSIONS]
    return write_private(path, "".join(lines))


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

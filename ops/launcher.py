"""`janus up`: NATS and every service as separate OS processes, through the same `janus serve` entry points that
docker-compose uses. Ctrl-C stops everything cleanly.

Supervision: a service or nats-server node that exits on its own is restarted (a node on the same port and store
directory, so clients reconnect to the URLs they have and JetStream keeps its data), after a back-off and within a
restart budget that refills with the time the process ran (runtime/restart_budget.py). Each restart is a warning in
the launcher's log; a process that spends its budget (a crash loop) is an error with the tail of its log, and then
the launcher stops everything and exits with EXIT_GAVE_UP, so whatever runs `janus up` (systemd, a container
runtime, an operator) sees a failure instead of a cluster that looks up and serves nothing."""
from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from contracts import HealthReply, subjects
from runtime.bus import Bus
from runtime.nats_server import EmbeddedNats, NatsServerError
from runtime.ports import free_loopback_ports
from runtime.restart_budget import RestartBudget, RestartPolicy
from runtime.security import load_or_create_credentials, user_for_service, write_nats_config, write_private
from runtime.settings import DEVICE_ENV, ClusterConfig, JanusSettings, ModelSpec, shared_accelerators
from runtime.trace_file import TRACE_DIR_ENV

from .demo_models import ensure_demo_models
from .services import available_services

log = logging.getLogger("janus.up")

# `janus up` exits with this when a child or a NATS node spent its restart budget (everything else was stopped)
EXIT_GAVE_UP = 3
# how often the launcher looks for exited processes: a killed nats-server is back within about this plus its start
SUPERVISE_PERIOD_S = 0.25


def _die_with_parent() -> None:
    ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    os.setpgrp()  # Ctrl-C reaches the launcher only; it stops the children in order


@dataclass
class Supervised:
    """What the launcher remembers of one process it restarts: its budget and, after an exit, when to start it."""
    budget: RestartBudget = field(default_factory=RestartBudget)
    started_monotonic: float = 0.0
    restart_at_monotonic: float | None = None  # set between an exit and the restart
    gave_up: str | None = None  # why, once the budget is spent

    @property
    def num_restarts(self) -> int:
        return self.budget.num_restarts


@dataclass
class Child(Supervised):
    service: str = ""
    instance: str = ""
    args: list[str] = field(default_factory=list)
    proc: subprocess.Popen | None = None
    log_path: Path | None = None
    extra: dict = field(default_factory=dict)
    device: str = ""  # a worker's own device (JANUS_DEVICE in its environment); "" for other services

    @property
    def name(self) -> str:
        return self.instance

    def exit_code(self) -> int | None:
        """None while running (or never started)."""
        return None if self.proc is None else self.proc.poll()


@dataclass
class NatsNode(Supervised):
    """A nats-server node under supervision. A node stopped on purpose (EmbeddedNats.stop/kill) is not restarted:
    only one that exited by itself (a crash, `kill -9` from outside)."""
    node: EmbeddedNats | None = None

    @property
    def name(self) -> str:
        return self.node.name

    def exit_code(self) -> int | None:
        return self.node.exit_code()


class Cluster:
    """The processes of one local cluster."""

    def __init__(self, settings: JanusSettings, cluster: ClusterConfig, *, config_path: Path | None,
                 gateway_port: int | None = None, num_workers: int | None = None, num_nats_nodes: int = 1,
                 restart_policy: RestartPolicy = RestartPolicy()) -> None:
        self.settings = settings
        self.restart_policy = restart_policy
        self.cluster = cluster
        self.state_dir = Path(settings.state_dir)
        # the children read the effective config (command-line overrides included) from one file
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.config_path = self.state_dir / "cluster.effective.yaml"
        # 0600: it holds the gateway's API keys as given (the children read them from here)
        write_private(self.config_path, yaml.safe_dump(cluster.model_dump(mode="json"), sort_keys=False))
        self.gateway_port = cluster.gateway.port if gateway_port is None else gateway_port
        self.num_workers = num_workers or cluster.workers.count
        self.worker_devices = worker_devices(cluster, self.num_workers)
        # every service gets its own NATS user, allowed only the subjects its job needs (runtime/security.py)
        self.credentials = load_or_create_credentials(self.state_dir / "credentials.json")
        nats_conf = write_nats_config(self.state_dir / "nats.conf", self.credentials)
        self.nats_nodes = nats_cluster(self.state_dir, num_nats_nodes, ["-c", str(nats_conf)])
        self.nats = self.nats_nodes[0]
        self.supervised_nats = [NatsNode(node=node, budget=RestartBudget(restart_policy)) for node in self.nats_nodes]
        self.children: list[Child] = []
        self.is_stopping = False
        self.gateway_url: str | None = None

    def _serve_args(self, service: str, instance: str, extra: list[str] | None = None) -> list[str]:
        args = [sys.executable, "-m", "ops.cli", "serve", service, "--nats", self.nats_url, "--id", instance]
        return args + ["--config", str(self.config_path)] + (extra or [])

    def plan_children(self) -> list[Child]:
        return [dataclasses.replace(child, budget=RestartBudget(self.restart_policy),
                                    args=self._serve_args(child.service, child.instance, child.args))
                for child in planned_children(self.cluster, self.worker_devices, self.gateway_port)]

    def child_env(self, child: Child) -> dict[str, str]:
        """A child's environment: its own NATS user, a worker its own device, and spans to <state_dir>/traces
        for `janus trace` unless they go to an OTLP collector (or JANUS_TRACE_DIR says where)."""
        user = user_for_service(child.service)
        env = dict(os.environ, JANUS_STATE_DIR=str(self.state_dir), PYTHONUNBUFFERED="1", JANUS_NATS_USER=user,
                   JANUS_NATS_PASSWORD=self.credentials[user])
        if not env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
            env.setdefault(TRACE_DIR_ENV, str(self.state_dir / "traces"))
        if child.device:
            env[DEVICE_ENV] = child.device
        return env

    def spawn(self, child: Child) -> None:
        logs = self.state_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        child.log_path = logs / f"{child.instance}.log"
        env = self.child_env(child)
        with open(child.log_path, "ab") as out:
            child.proc = subprocess.Popen(child.args, stdout=out, stderr=subprocess.STDOUT, env=env,
                                          preexec_fn=_die_with_parent)
        child.started_monotonic = time.monotonic()

    async def start(self, timeout_s: float = 180.0) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        ensure_demo_models(self.cluster, self.settings.models_dir)
        for watched in self.supervised_nats:
            watched.node.start()
            watched.started_monotonic = time.monotonic()
        (self.state_dir / "nats.url").write_text(self.nats_url)  # for `janus status` and `janus audit`
        self.children = self.plan_children()
        for child in self.children:
            self.spawn(child)
        await self.wait_healthy(timeout_s)

    async def wait_healthy(self, timeout_s: float) -> None:
        bus = await self.operator_bus()
        try:
            deadline = time.monotonic() + timeout_s
            pending = {c.instance: c for c in self.children}
            while pending:
                for inst, child in list(pending.items()):
                    if child.proc.poll() is not None:
                        raise RuntimeError(f"{inst} exited with {child.proc.returncode}; see {child.log_path}:\n"
                                           f"{_tail(child.log_path)}")
                    try:
                        reply = await bus.request(subjects.health(child.service, inst), None, HealthReply,
                                                  timeout_s=0.5)
                    except Exception:  # noqa: BLE001 - not up yet
                        continue
                    if child.service == "gateway":
                        self.gateway_url = reply.detail.get("url")
                    pending.pop(inst)
                if pending and time.monotonic() > deadline:
                    raise TimeoutError(f"not healthy after {timeout_s} s: {', '.join(pending)}")
                await asyncio.sleep(0.2)
        finally:
            await bus.close()

    async def operator_bus(self) -> Bus:
        return await Bus.connect(self.nats_url, "launcher", user="operator", password=self.credentials["operator"])

    @property
    def nats_url(self) -> str:
        """Every node's URL: clients fail over between them."""
        return ",".join(node.url for node in self.nats_nodes if node.port is not None)

    def notice_exits(self, now_s: float) -> list[Supervised]:
        """Decide, once per exit, for every child and NATS node that exited by itself: restart it (when) or give up.
        Logs each decision; returns the processes given up on just now."""
        given_up = []
        for watched in [*self.supervised_nats, *self.children]:
            code = watched.exit_code()
            if code is None or self.is_stopping or watched.restart_at_monotonic is not None or watched.gave_up:
                continue
            uptime_s = now_s - watched.started_monotonic
            decision = watched.budget.on_exit(uptime_s)
            if decision.restart:
                watched.restart_at_monotonic = now_s + decision.delay_s
                log.warning("%s exited with %s after %.1f s; restarting in %.2f s (restart %d, %.1f left in its "
                            "budget)", watched.name, code, uptime_s, decision.delay_s, watched.num_restarts,
                            decision.tokens_left)
            else:
                watched.gave_up = decision.reason
                given_up.append(watched)
                log.error("GIVING UP on %s: exited with %s, %s.%s", watched.name, code, decision.reason,
                          _log_excerpt(watched))
        return given_up

    async def restart_due(self, now_s: float) -> list[str]:
        """Start again what `notice_exits` scheduled and whose back-off has passed; returns their names. A NATS node
        restarts on its own port and store (in a thread: its start polls for the port)."""
        restarted = []
        for watched in [*self.supervised_nats, *self.children]:
            due = watched.restart_at_monotonic
            if due is None or now_s < due:
                continue
            watched.restart_at_monotonic = None
            watched.started_monotonic = time.monotonic()
            try:
                if isinstance(watched, NatsNode):
                    await asyncio.to_thread(watched.node.restart)
                else:
                    self.spawn(watched)
            except (OSError, NatsServerError) as exc:  # counted as an exit at once: the budget decides next
                log.warning("%s did not start again: %s", watched.name, exc)
                continue
            restarted.append(watched.name)
        return restarted

    def restart_crashed(self) -> list[str]:
        """Restart children that died on their own now, back-off or not (within their budgets); for tests that kill
        children without a supervising loop. Returns what was restarted."""
        now_s = time.monotonic()
        self.notice_exits(now_s)
        restarted = []
        for child in self.children:
            if child.restart_at_monotonic is not None:
                child.restart_at_monotonic = None
                self.spawn(child)
                restarted.append(child.instance)
        return restarted

    async def supervise(self, stop: asyncio.Event, period_s: float = SUPERVISE_PERIOD_S) -> str | None:
        """Until `stop` is set: restart what exits. Returns None when stopped, or a line naming what was given up
        on (the caller stops the cluster)."""
        while not stop.is_set():
            given_up = self.notice_exits(time.monotonic())
            if given_up:
                return "; ".join(f"{w.name}: {w.gave_up}" for w in given_up)
            await self.restart_due(time.monotonic())
            try:
                await asyncio.wait_for(stop.wait(), period_s)
            except asyncio.TimeoutError:
                pass
        return None

    def stop(self, timeout_s: float = 40.0) -> None:
        """SIGTERM in reverse start order (gateway first: it stops taking requests), then NATS."""
        self.is_stopping = True  # what exits from here on is not restarted
        for child in reversed(self.children):
            if child.proc and child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for child in self.children:
            if child.proc is None:
                continue
            try:
                child.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.proc.kill()
                child.proc.wait()
        for node in self.nats_nodes:
            node.stop()


def worker_devices(cluster: ClusterConfig, num_workers: int) -> list[str]:
    """Each worker's device for `num_workers` workers (`janus up --workers` may differ from workers.count); a
    ConfigError (one line) when the number does not fit workers.devices or puts two workers on one accelerator."""
    from .effective import ConfigError

    try:
        devices = cluster.workers.devices_for(num_workers)
    except ValueError as exc:
        raise ConfigError(f"--workers: {exc}") from None
    shared = shared_accelerators(devices)
    if shared and not cluster.workers.share_devices:
        raise ConfigError(f"--workers {num_workers} puts {shared} (workers.device {cluster.workers.device}); set "
                          "workers.share_devices: true to allow it")
    return devices


def planned_children(cluster: ClusterConfig, devices: list[str], gateway_port: int) -> list[Child]:
    """What `janus up` starts, in start order: one worker per device, the other services (`replicas` copies each),
    the gateway last. `args` holds only each service's own extra arguments."""
    children = [Child(service="worker", instance=f"worker-{i}", device=device) for i, device in enumerate(devices)]
    for name in available_services():
        if name in ("worker", "gateway"):
            continue
        children += [Child(service=name, instance=f"{name}-{i}") for i in range(cluster.replicas.get(name, 1))]
    children.append(Child(service="gateway", instance="gateway-0", args=["--port", str(gateway_port)]))
    return children


def dry_run_lines(cluster: ClusterConfig, devices: list[str], gateway_port: int, num_nats_nodes: int) -> list[str]:
    """`janus up --dry-run`: every process it would start with its id, device and address, one line each."""
    # `janus up` runs NATS on loopback: the interface that reaches it, and so every worker's transfer host
    transfer_host = os.environ.get("JANUS_TRANSFER_HOST") or "127.0.0.1"
    port = "a free port" if gateway_port == 0 else str(gateway_port)
    lines = [f"{'PROCESS':<24} {'SERVICE':<16} {'DEVICE':<10} ADDRESS"]
    lines += [f"{f'nats-{i}':<24} {'nats-server':<16} {'-':<10} nats://127.0.0.1 (a free port, picked at start)"
              for i in range(num_nats_nodes)]
    for child in planned_children(cluster, devices, gateway_port):
        address = {"worker": f"transfer host {transfer_host}",
                   "gateway": f"http://{cluster.gateway.host}:{port}"}.get(child.service, "NATS only")
        lines.append(f"{child.instance:<24} {child.service:<16} {child.device or '-':<10} {address}")
    return lines


def nats_cluster(state_dir: Path, num_nodes: int, extra_args: list[str]) -> list[EmbeddedNats]:
    """One node, or a cluster of nodes routed to each other (JetStream replicated across them)."""
    if num_nodes == 1:
        return [EmbeddedNats(state_dir / "nats", extra_args=extra_args)]
    # picked before the nodes start, outside the ephemeral range (see free_loopback_ports)
    ports = free_loopback_ports(num_nodes)
    routes = ",".join(f"nats://127.0.0.1:{p}" for p in ports)
    return [EmbeddedNats(state_dir / f"nats-{i}", name=f"janus-nats-{i}",
                         extra_args=[*extra_args, "--cluster_name", "janus", "--cluster",
                                     f"nats://127.0.0.1:{ports[i]}", "--routes", routes])
            for i in range(num_nodes)]


# --- the oracle's training sets: `janus profile`, and profiling on first start -----------------------------------

NO_PROFILE_ENV = "JANUS_NO_PROFILE"


def training_set_path(state_dir: Path, model: str) -> Path:
    """Where a model's profile lives: the oracle service loads `<state_dir>/oracle/<model>.json` at start."""
    return Path(state_dir) / "oracle" / f"{model}.json"


def is_profiling_skipped() -> bool:
    return os.environ.get(NO_PROFILE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def profile_target(cluster: ClusterConfig, name: str, models_dir: Path) -> tuple[ModelSpec, Path]:
    """The model `janus profile --model NAME` measures and its checkpoint folder (a demo one is written if
    missing): the cluster config's model of that name, else the demo model of that name. Anything else is a
    ConfigError whose message is one line listing the models it could be."""
    from runtime.catalog import is_complete, model_dir
    from worker.engine.demo import DEMO_MODELS

    from .effective import ConfigError

    spec = cluster.model(name)
    if spec is None and name in DEMO_MODELS:
        spec = ModelSpec(name=name, demo=name)
    if spec is None:
        demos = [d for d in DEMO_MODELS if cluster.model(d) is None]
        raise ConfigError(f"unknown model {name!r}; configured: {', '.join(m.name for m in cluster.models) or 'none'}"
                          + (f" (or a demo model: {', '.join(demos)})" if demos else ""))
    if cluster.workers.device != "cpu":
        raise ConfigError(f"{name}: the cluster's workers run on {cluster.workers.device}; the profiler measures the "
                          "engine on this CPU only, which would not describe them")
    if spec.demo:
        path = ensure_demo_models(ClusterConfig(models=[spec]), models_dir)[spec.name]
    else:
        path = model_dir(spec, models_dir)
        if not is_complete(path):
            raise ConfigError(f"{name}: no complete Hugging Face checkpoint at {path} (config.json, tokenizer.json "
                              "and *.safetensors are needed)")
    return spec, path


def profile_on_first_start(settings: JanusSettings, cluster: ClusterConfig) -> list[str]:
    """Before `janus up` serves: profile (`janus profile --quick`, a child process each, so the launcher never
    imports torch) every demo model of a CPU cluster that has no training set at `<state_dir>/oracle/<model>.json`
    yet. Cached: once a model's file exists this does nothing. A model whose profile fails is served anyway (its
    oracle answers from the roofline). Returns the models profiled. KeyboardInterrupt passes through."""
    from oracle.profile.run import QUICK, estimate_s, format_duration

    state_dir = Path(settings.state_dir)
    if cluster.workers.device != "cpu":
        return []
    missing = [m.name for m in cluster.models if m.demo and not training_set_path(state_dir, m.name).exists()]
    others = [m.name for m in cluster.models if not m.demo and not training_set_path(state_dir, m.name).exists()]
    if others:
        print(f"janus: no oracle training set for {', '.join(others)}: the oracle answers from its roofline until "
              f"`janus profile --model NAME` writes one", flush=True)
    if not missing:
        return []
    print(f"janus: first start: profiling {', '.join(missing)} on this CPU so that the planners use learned GPs, not "
          f"the roofline: about {format_duration(estimate_s(QUICK))} per model here, once (cached in "
          f"{state_dir / 'oracle'}; `--no-profile` or {NO_PROFILE_ENV}=1 skips)", flush=True)
    started = time.monotonic()
    done = []
    for name in missing:
        cmd = [sys.executable, "-m", "ops.cli", "profile", "--model", name, "--quick", "--state-dir",
               str(state_dir)]
        if settings.config is not None:
            cmd += ["--config", str(settings.config)]
        rc = subprocess.run(cmd, env=dict(os.environ, JANUS_STATE_DIR=str(state_dir))).returncode
        if rc in (130, -signal.SIGINT):
            raise KeyboardInterrupt
        if rc != 0:
            print(f"janus: profiling {name} failed (exit {rc}); its oracle answers from the roofline", flush=True)
            continue
        done.append(name)
    if done:
        print(f"janus: profiled {', '.join(done)} in {format_duration(time.monotonic() - started)}", flush=True)
    return done


def _log_excerpt(watched: Supervised) -> str:
    path = watched.log_path if isinstance(watched, Child) else watched.node.log_path
    tail = _tail(path, 1500).strip()
    return f" The end of {path}:\n{tail}" if tail else ""


def _tail(path: Path | None, num_bytes: int = 3000) -> str:
    try:
        return path.read_bytes()[-num_bytes:].decode(errors="replace") if path else ""
    except OSError:
        return ""


async def run_up(settings: JanusSettings, cluster: ClusterConfig, *, config_path: Path | None,
                 gateway_port: int | None, num_workers: int | None, num_nats_nodes: int = 1) -> int:
    local = Cluster(settings, cluster, config_path=config_path, gateway_port=gateway_port, num_workers=num_workers,
                    num_nats_nodes=num_nats_nodes)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        print(f"janus: starting NATS and the services ({', '.join(available_services())}; "
              f"{local.num_workers} workers), state in {local.state_dir} ...", flush=True)
        await local.start()
        models = ", ".join(m.name for m in cluster.models)
        print(f"janus: NATS at {local.nats_url}", flush=True)
        print(f"janus: gateway at {local.gateway_url}  (models: {models})", flush=True)
        print(f"janus: try  curl {local.gateway_url}/v1/models   — Ctrl-C stops everything", flush=True)
        gave_up = await local.supervise(stop)
        if gave_up is not None:
            print(f"janus: gave up restarting {gave_up}; stopping everything (exit {EXIT_GAVE_UP})", file=sys.stderr,
                  flush=True)
            return EXIT_GAVE_UP
        return 0
    except (RuntimeError, TimeoutError) as exc:
        print(f"janus: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        print("janus: stopping ...", flush=True)
        local.stop()
        print("janus: stopped", flush=True)

"""`janus up`: NATS and every service as separate OS processes, through the same `janus serve` entry points that
docker-compose uses. A service that crashes is restarted (with back-off); Ctrl-C stops everything cleanly."""
from __future__ import annotations

import asyncio
import ctypes
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

from .bus import Bus
from .catalog import ensure_demo_models
from .nats_server import EmbeddedNats
from .security import load_or_create_credentials, user_for_service, write_nats_config, write_private
from .services import available_services
from .settings import ClusterConfig, JanusSettings, ModelSpec

log = logging.getLogger("janus.up")


def _die_with_parent() -> None:
    ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    os.setpgrp()  # Ctrl-C reaches the launcher only; it stops the children in order


@dataclass
class Child:
    service: str
    instance: str
    args: list[str]
    proc: subprocess.Popen | None = None
    num_restarts: int = 0
    started_monotonic: float = 0.0
    log_path: Path | None = None
    extra: dict = field(default_factory=dict)


class Cluster:
    """The processes of one local cluster."""

    def __init__(self, settings: JanusSettings, cluster: ClusterConfig, *, config_path: Path | None,
                 gateway_port: int | None = None, num_workers: int | None = None, num_nats_nodes: int = 1) -> None:
        self.settings = settings
        self.cluster = cluster
        self.state_dir = Path(settings.state_dir)
        # the children read the effective config (command-line overrides included) from one file
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.config_path = self.state_dir / "cluster.effective.yaml"
        # 0600: it holds the gateway's API keys as given (the children read them from here)
        write_private(self.config_path, yaml.safe_dump(cluster.model_dump(mode="json"), sort_keys=False))
        self.gateway_port = cluster.gateway.port if gateway_port is None else gateway_port
        self.num_workers = num_workers or cluster.workers.count
        # every service gets its own NATS user, allowed only the subjects its job needs (runtime/security.py)
        self.credentials = load_or_create_credentials(self.state_dir / "credentials.json")
        nats_conf = write_nats_config(self.state_dir / "nats.conf", self.credentials)
        self.nats_nodes = nats_cluster(self.state_dir, num_nats_nodes, ["-c", str(nats_conf)])
        self.nats = self.nats_nodes[0]
        self.children: list[Child] = []
        self.gateway_url: str | None = None

    def _serve_args(self, service: str, instance: str, extra: list[str] | None = None) -> list[str]:
        args = [sys.executable, "-m", "runtime.cli", "serve", service, "--nats", self.nats_url, "--id", instance]
        return args + ["--config", str(self.config_path)] + (extra or [])

    def plan_children(self) -> list[Child]:
        services = available_services()
        children = []
        for i in range(self.num_workers):
            children.append(Child("worker", f"worker-{i}", self._serve_args("worker", f"worker-{i}")))
        for name in services:
            if name in ("worker", "gateway"):
                continue
            for i in range(self.cluster.replicas.get(name, 1)):
                children.append(Child(name, f"{name}-{i}", self._serve_args(name, f"{name}-{i}")))
        children.append(Child("gateway", "gateway-0",
                              self._serve_args("gateway", "gateway-0", ["--port", str(self.gateway_port)])))
        return children

    def spawn(self, child: Child) -> None:
        logs = self.state_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        child.log_path = logs / f"{child.instance}.log"
        user = user_for_service(child.service)
        env = dict(os.environ, JANUS_STATE_DIR=str(self.state_dir), PYTHONUNBUFFERED="1", JANUS_NATS_USER=user,
                   JANUS_NATS_PASSWORD=self.credentials[user])
        with open(child.log_path, "ab") as out:
            child.proc = subprocess.Popen(child.args, stdout=out, stderr=subprocess.STDOUT, env=env,
                                          preexec_fn=_die_with_parent)
        child.started_monotonic = time.monotonic()

    async def start(self, timeout_s: float = 180.0) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        ensure_demo_models(self.cluster, self.settings.models_dir)
        for node in self.nats_nodes:
            node.start()
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

    def restart_crashed(self, max_num_restarts: int = 5) -> list[str]:
        """Restart children that died on their own; returns what was restarted."""
        restarted = []
        for child in self.children:
            if child.proc is None or child.proc.poll() is None:
                continue
            if child.num_restarts >= max_num_restarts:
                continue
            backoff_s = min(10.0, 0.5 * 2 ** child.num_restarts)
            if time.monotonic() - child.started_monotonic < backoff_s:
                continue
            log.warning("%s exited with %s; restarting", child.instance, child.proc.returncode)
            child.num_restarts += 1
            self.spawn(child)
            restarted.append(child.instance)
        return restarted

    def stop(self, timeout_s: float = 40.0) -> None:
        """SIGTERM in reverse start order (gateway first: it stops taking requests), then NATS."""
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


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def nats_cluster(state_dir: Path, num_nodes: int, extra_args: list[str]) -> list[EmbeddedNats]:
    """One node, or a cluster of nodes routed to each other (JetStream replicated across them)."""
    if num_nodes == 1:
        return [EmbeddedNats(state_dir / "nats", extra_args=extra_args)]
    route_ports = [_free_port() for _ in range(num_nodes)]
    routes = ",".join(f"nats://127.0.0.1:{p}" for p in route_ports)
    return [EmbeddedNats(state_dir / f"nats-{i}", name=f"janus-nats-{i}",
                         extra_args=[*extra_args, "--cluster_name", "janus", "--cluster",
                                     f"nats://127.0.0.1:{route_ports[i]}", "--routes", routes])
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
    from worker.engine.demo import DEMO_MODELS

    from .catalog import is_complete, model_dir
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
        cmd = [sys.executable, "-m", "runtime.cli", "profile", "--model", name, "--quick", "--state-dir",
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
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
            except asyncio.TimeoutError:
                local.restart_crashed()
        return 0
    except (RuntimeError, TimeoutError) as exc:
        print(f"janus: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        print("janus: stopping ...", flush=True)
        local.stop()
        print("janus: stopped", flush=True)

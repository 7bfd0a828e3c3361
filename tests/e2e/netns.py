"""Hosts on one machine: Linux network namespaces on a private bridge, each with its own 10.x address, so that
processes started in them (`ip netns exec`) talk over real network interfaces, and a host's link can be cut.

The bridge lives in the root namespace and has the network's first address, so the test process (the "operator's
machine") reaches every host. Every name carries the creating process's pid (`jmh<pid>...`): names are unique per
run, and what a killed run left behind is found and removed by the next one (`sweep_leftovers`). Processes started
on a host die with the test process (PR_SET_PDEATHSIG survives `ip netns exec`, which execs the command).
"""
from __future__ import annotations

import ctypes
import ipaddress
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "jmh"  # every bridge, veth and namespace this module makes starts with it, then the pid
_counter = itertools.count()


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=10)


def unavailable_reason() -> str | None:
    """Why namespaces cannot be made here (a skip reason), or None when they can."""
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    probe = f"{PREFIX}{os.getpid()}-probe"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"ip netns add is not permitted here: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def _pid_alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def sweep_leftovers() -> list[str]:
    """Remove the namespaces and links of runs whose process is gone (a run killed before its clean-up)."""
    removed = []
    for name in _ip("netns", "list").stdout.split():
        m = re.match(rf"{PREFIX}(\d+)-", name)
        if m and not _pid_alive(int(m.group(1))):
            _ip("netns", "del", name, check=False)
            removed.append(name)
    for link in json.loads(_ip("-j", "link", "show").stdout or "[]"):
        m = re.match(rf"{PREFIX}(\d+)", link.get("ifname", ""))
        if m and not _pid_alive(int(m.group(1))):
            _ip("link", "del", link["ifname"], check=False)
            removed.append(link["ifname"])
    return removed


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: a killed test run leaves no process behind


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.0.0.0/8 that overlaps no route of this machine (other runs' bridges included)."""
    used = []
    for route in json.loads(_ip("-j", "route", "show").stdout or "[]"):
        with_prefix = route.get("dst", "")
        if with_prefix and with_prefix != "default":
            used.append(ipaddress.ip_network(with_prefix if "/" in with_prefix else f"{with_prefix}/32", strict=False))
    start = os.getpid() * 7 + next(_counter)
    for i in range(4096):
        k = (start + i) % (200 * 256)
        candidate = ipaddress.ip_network(f"10.{50 + k // 256}.{k % 256}.0/24")
        if not any(candidate.overlaps(u) for u in used):
            return candidate
    raise RuntimeError("no free 10.x.y.0/24 for the test network")


@dataclass
class Host:
    """One network namespace: a "machine" with one interface (eth0) on the network's bridge."""

    name: str
    namespace: str
    address: str
    veth: str  # the root-namespace end of its link: what `cut` takes down
    processes: list[subprocess.Popen] = field(default_factory=list)

    def popen(self, argv: list[str], *, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start `argv` in this host's namespace, output to `log`; it dies with the test process."""
        with log.open("ab") as out:
            proc = subprocess.Popen(["ip", "netns", "exec", self.namespace, *argv], stdout=out,
                                    stderr=subprocess.STDOUT, env=env, preexec_fn=_die_with_parent)
        self.processes.append(proc)
        return proc

    def run(self, *argv: str) -> str:
        return subprocess.run(["ip", "netns", "exec", self.namespace, *argv], capture_output=True, text=True,
                              check=True, timeout=10).stdout

    def cut(self) -> None:
        """Pull the cable: the host's link goes down, packets to and from it are dropped (no reset is sent)."""
        _ip("link", "set", self.veth, "down")

    def restore(self) -> None:
        _ip("link", "set", self.veth, "up")


class Network:
    """A bridge in the root namespace and hosts on it; `close()` removes everything, processes first."""

    def __init__(self) -> None:
        self.tag = f"{PREFIX}{os.getpid()}{chr(ord('a') + next(_counter) % 26)}"  # <= 11 chars: veths add 2
        self.subnet = _free_subnet()
        self._addresses = self.subnet.hosts()
        self.gateway_address = str(next(self._addresses))
        self.bridge = f"{self.tag}br"
        self.hosts: list[Host] = []
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway_address}/{self.subnet.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def add_host(self, name: str) -> Host:
        index = len(self.hosts)
        namespace, veth = f"{self.tag}-{name}", f"{self.tag}v{index}"
        address = str(next(self._addresses))
        _ip("netns", "add", namespace)
        host = Host(name=name, namespace=namespace, address=address, veth=veth)
        self.hosts.append(host)
        _ip("link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
        _ip("link", "set", f"{veth}p", "netns", namespace)
        _ip("link", "set", veth, "master", self.bridge)
        _ip("link", "set", veth, "up")
        _ip("netns", "exec", namespace, "ip", "link", "set", f"{veth}p", "name", "eth0")
        _ip("netns", "exec", namespace, "ip", "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", "eth0")
        _ip("netns", "exec", namespace, "ip", "link", "set", "eth0", "up")
        _ip("netns", "exec", namespace, "ip", "link", "set", "lo", "up")
        _ip("netns", "exec", namespace, "ip", "route", "add", "default", "via", self.gateway_address)
        return host

    def close(self, timeout_s: float = 20.0) -> None:
        """Stop every process on every host (SIGTERM, then SIGKILL past the deadline), then remove the namespaces
        (their veth ends go with them) and the bridge. Safe to call twice."""
        procs = [p for host in self.hosts for p in host.processes if p.poll() is None]
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for proc in procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for host in self.hosts:
            _ip("netns", "del", host.namespace, check=False)
            _ip("link", "del", host.veth, check=False)
        self.hosts.clear()
        _ip("link", "del", self.bridge, check=False)


def wait_listening(address: str, port: int, timeout_s: float, *, banner: bytes = b"") -> None:
    """Until a TCP connect to address:port succeeds (and the server's first bytes start with `banner`)."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((address, port), timeout=1.0) as sock:
                if not banner or sock.recv(len(banner)).startswith(banner):
                    return
        except OSError as exc:
            last = exc
        time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {address}:{port} after {timeout_s} s ({last})")


NATS_CLIENT_PORT, NATS_ROUTE_PORT, NATS_MONITOR_PORT = 4222, 6222, 8222  # each host has its own ports


@dataclass
class NatsNode:
    """A nats-server node of a cluster, on one host: clients on :4222, routes on :6222, monitoring on :8222."""

    host: Host
    name: str
    store_dir: Path
    route_urls: list[str]
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host.address}:{NATS_CLIENT_PORT}"

    def start(self, nats_server: str, timeout_s: float = 20.0) -> "NatsNode":
        self.store_dir.mkdir(parents=True, exist_ok=True)
        a = self.host.address
        self.proc = self.host.popen(
            [nats_server, "-a", a, "-p", str(NATS_CLIENT_PORT), "-m", str(NATS_MONITOR_PORT), "-js",
             "-sd", str(self.store_dir / "jetstream"), "-n", self.name, "--cluster_name", "janus",
             "--cluster", f"nats://{a}:{NATS_ROUTE_PORT}", "--routes", ",".join(self.route_urls)],
            log=self.store_dir / "nats-server.log")
        wait_listening(a, NATS_CLIENT_PORT, timeout_s, banner=b"INFO")
        return self

    def kill9(self) -> None:
        """kill -9; the store stays, so `start` again brings the node back with its JetStream data."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)  # `ip netns exec` exec'd the server: this pid is the server
            self.proc.wait()

    def monitor(self, endpoint: str, timeout_s: float = 2.0) -> dict:
        """GET /routez, /connz, ... of this node's monitoring port."""
        url = f"http://{self.host.address}:{NATS_MONITOR_PORT}/{endpoint}"
        with urllib.request.urlopen(url, timeout=timeout_s) as reply:  # noqa: S310 - our own test network
            return json.loads(reply.read())

    def client_names(self) -> list[str]:
        return sorted(c.get("name", "") for c in self.monitor("connz?limit=1024").get("connections", []))


def nats_cluster(hosts: list[Host], store_root: Path, nats_server: str) -> list[NatsNode]:
    """One node on each host, routed to all the others; returned once every node has a route to every other."""
    routes = [f"nats://{h.address}:{NATS_ROUTE_PORT}" for h in hosts]
    nodes = [NatsNode(host=h, name=f"nats-{h.name}", store_dir=store_root / f"nats-{h.name}", route_urls=routes)
             for h in hosts]
    for node in nodes:
        node.start(nats_server)
    wait_routed(nodes, timeout_s=30.0)
    return nodes


def wait_routed(nodes: list[NatsNode], timeout_s: float) -> None:
    """Until each node has routes to all the others (the cluster is whole)."""
    deadline = time.monotonic() + timeout_s
    want = {n.name for n in nodes}
    while True:
        missing = {}
        for node in nodes:
            try:
                peers = {r.get("remote_name") or r.get("remote_id") for r in node.monitor("routez").get("routes", [])}
            except OSError as exc:
                peers = set()
                missing[node.name] = str(exc)
            if not want - {node.name} <= peers:
                missing[node.name] = f"routes to {sorted(peers)}"
        if not missing:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the NATS cluster did not form within {timeout_s} s: {missing}")
        time.sleep(0.1)

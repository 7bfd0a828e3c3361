"""The embedded nats-server launcher."""
from __future__ import annotations

import os

from runtime.nats_server import EmbeddedNats


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_starts_on_a_free_port_with_jetstream_and_leaves_nothing_behind(tmp_path):
    a = EmbeddedNats(tmp_path / "a").start()
    b = EmbeddedNats(tmp_path / "b").start()
    try:
        assert a.port != b.port and 4222 not in (a.port, b.port)
        assert a.url.startswith("nats://127.0.0.1:")
        assert (tmp_path / "a" / "jetstream").exists()
        pids = [a.pid, b.pid]
    finally:
        a.stop()
        b.stop()
    assert not any(_alive(p) for p in pids)


def test_restart_keeps_port_and_store(tmp_path):
    server = EmbeddedNats(tmp_path / "s").start()
    try:
        port, old_pid = server.port, server.pid
        server.restart()
        assert server.port == port and server.pid != old_pid
        assert not _alive(old_pid)
    finally:
        server.stop()

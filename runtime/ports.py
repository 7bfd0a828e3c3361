"""Loopback ports picked before the server that listens on them starts."""
from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE_PATH = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_port_range(path: Path = EPHEMERAL_RANGE_PATH) -> tuple[int, int]:
    """The ports the kernel hands out on its own (binds to port 0, the source ports of outgoing connections),
    inclusive. Linux's default where the file cannot be read."""
    try:
        low, high = (int(v) for v in path.read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_loopback_ports(count: int, ephemeral: tuple[int, int] | None = None) -> list[int]:
    """`count` distinct loopback ports free now, for servers started a little later, outside the ephemeral range.
    A port the kernel could hand out (as bind-to-0 would pick one) may meanwhile become the source port of an
    outgoing connection or the port of a server that asked for any, and the server meant to listen there dies with
    "address already in use". That happened to a NATS cluster's router port: each node learns all the route ports
    before the first one starts."""
    low, high = ephemeral or ephemeral_port_range()
    candidates = [p for p in range(1024, 65536) if not low <= p <= high]
    random.shuffle(candidates)  # two clusters started at once rarely try the same ports
    ports: list[int] = []
    for port in candidates:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use
        ports.append(port)
        if len(ports) == count:
            return ports
    raise OSError(f"no {count} free loopback ports outside the ephemeral range {low}-{high}")

"""Ports picked before their server starts (a cluster's route ports) lie outside the kernel's ephemeral range: a
port the kernel could hand out may meanwhile become a route connection's source port (CI saw a node die with
"address already in use" on its router port)."""
import socket

import pytest

from ops.launcher import nats_cluster
from runtime.ports import ephemeral_port_range, free_loopback_ports


def test_ports_are_distinct_free_and_outside_the_ephemeral_range():
    low, high = ephemeral_port_range()
    ports = free_loopback_ports(5)
    assert len(set(ports)) == 5
    assert not any(low <= p <= high for p in ports), (ports, low, high)
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free: raises if not


def test_a_port_in_use_is_skipped_and_too_few_free_is_a_clear_error():
    ephemeral = (1024, 65533)  # leaves 65534 and 65535
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 65534))
        assert free_loopback_ports(1, ephemeral) == [65535]
        with pytest.raises(OSError, match="no 2 free loopback ports"):
            free_loopback_ports(2, ephemeral)


def test_the_ephemeral_range_falls_back_to_linux_defaults_when_unreadable(tmp_path):
    assert ephemeral_port_range(tmp_path / "missing") == (32768, 60999)
    (tmp_path / "range").write_text("40000\t50000\n")
    assert ephemeral_port_range(tmp_path / "range") == (40000, 50000)


def test_each_node_of_a_cluster_routes_to_all_and_listens_on_its_own(tmp_path):
    nodes = nats_cluster(tmp_path, 3, [])
    listens = [n.extra_args[n.extra_args.index("--cluster") + 1] for n in nodes]
    routes = {n.extra_args[n.extra_args.index("--routes") + 1] for n in nodes}
    assert len(set(listens)) == 3 and routes == {",".join(listens)}
    low, high = ephemeral_port_range()
    assert not any(low <= int(url.rsplit(":", 1)[1]) <= high for url in listens)

"""The Mooncake wrapper over real transfer engines (TCP loopback): reads and writes by global offset land exactly,
and failures are errors, never silent."""
from __future__ import annotations

import pytest
import torch

from worker.dataplane.transfer import MooncakeTransfer, TransferError, TransferSettings, _split


@pytest.fixture(scope="module")
def pair():
    a = MooncakeTransfer.start(TransferSettings(max_chunk_bytes=1 << 16))
    b = MooncakeTransfer.start(TransferSettings(max_chunk_bytes=1 << 16))
    region_a = torch.arange(1 << 20, dtype=torch.int32).to(torch.uint8)  # 1 MiB "global region" of a
    region_b = torch.zeros(1 << 20, dtype=torch.uint8)
    a.register(region_a.data_ptr(), region_a.numel())
    b.register(region_b.data_ptr(), region_b.numel())
    yield a, b, region_a, region_b
    a.close()
    b.close()


def test_sessions_are_host_and_port_and_the_peer_base_is_its_first_registered_buffer(pair):
    a, b, region_a, _ = pair
    host, port = a.session.rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0 and a.session != b.session
    assert b.remote_base(a.session) == region_a.data_ptr()


def test_read_by_offset_copies_exactly_those_bytes(pair):
    a, b, region_a, region_b = pair
    region_b.zero_()
    local = region_b.data_ptr()
    # two pieces, one longer than a chunk, at odd offsets
    moved = b.read(a.session, [local + 10, local + 300_000], [4_096, 200_003], [150_000, 77])
    assert moved == 150_077
    assert torch.equal(region_b[10:150_010], region_a[4_096:154_096])
    assert torch.equal(region_b[300_000:300_077], region_a[200_003:200_080])
    assert int(region_b[150_010:300_000].count_nonzero()) == 0  # nothing else touched


def test_write_by_offset_lands_in_the_peer(pair):
    a, b, region_a, region_b = pair
    region_b[:4096] = 7
    before = region_a.clone()
    b.write(a.session, [region_b.data_ptr()], [65_536], [4096])
    assert torch.all(region_a[65_536:65_536 + 4096] == 7)
    region_a.copy_(before)


def test_out_of_range_and_unreachable_peers_raise(pair):
    a, b, _, region_b = pair
    with pytest.raises(TransferError, match="failed"):
        b.read(a.session, [region_b.data_ptr()], [(1 << 20) - 10], [4096])  # runs past a's region
    with pytest.raises(TransferError):
        b.read("127.0.0.1:1", [region_b.data_ptr()], [0], [16])
    with pytest.raises(ValueError):
        b.read(a.session, [region_b.data_ptr()], [0], [0])


def test_split_cuts_long_pieces_into_chunks():
    assert _split([100], [1000], [25], 10) == ([100, 110, 120], [1000, 1010, 1020], [10, 10, 5])


def test_the_transfer_host_is_the_interface_that_reaches_nats_unless_set(monkeypatch):
    from worker.dataplane.transfer import host_reaching, transfer_settings

    monkeypatch.delenv("JANUS_TRANSFER_HOST", raising=False)
    assert transfer_settings("nats://127.0.0.1:4222").host == "127.0.0.1"
    # comma-separated URLs: the first that resolves decides
    assert host_reaching("nats://no-such-host.invalid:4222, nats://127.0.0.1:4223") == "127.0.0.1"
    assert host_reaching("") == "127.0.0.1"
    monkeypatch.setenv("JANUS_TRANSFER_HOST", "10.1.2.3")
    assert transfer_settings("nats://127.0.0.1:4222").host == "10.1.2.3"


def _num_threads() -> int:
    """Threads of this process, native ones included (the engine's are not Python threads)."""
    import os

    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not __import__("os").path.isdir("/proc/self/task"), reason="needs Linux /proc")
def test_close_destroys_the_engine_there_and_then():
    """The engine's destructor stops its threads and holds the GIL about a second: it must run at close(), not in a
    later garbage-collection pass of whatever the process does then (worker/dataplane/transfer.py `close`)."""
    before = _num_threads()
    te = MooncakeTransfer.start()
    scratch = torch.zeros(16, dtype=torch.uint8)
    te.register(scratch.data_ptr(), scratch.numel())
    started = _num_threads()
    assert started > before
    te.close()
    assert te.is_closed and _num_threads() < started  # its threads ended at close, while `te` is still referenced
    with pytest.raises(TransferError, match="closed"):
        te.register(scratch.data_ptr(), scratch.numel())
    with pytest.raises(TransferError, match="closed"):
        te.read("127.0.0.1:1", [scratch.data_ptr()], [0], [16])

"""Segment pairing and chunked copies: every byte of the source stream lands at its place in the target stream."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.lifecycle.host_copy import HostWeights, chunked_copy
from worker.lifecycle.segments import block_pieces, chunk_ranges, coalesce, pair_segments


def _layout(lengths: list[int], gap: int, start: int) -> list[tuple[int, int]]:
    """Segments of the given lengths placed at increasing offsets with gaps, like page runs in a pool."""
    out, offset = [], start
    for n in lengths:
        out.append((offset, n))
        offset += n + gap
    return out


def _split(total: int, cuts: list[int]) -> list[int]:
    points = sorted({c % total for c in cuts if 0 < c % total} | {0, total})
    return [b - a for a, b in zip(points, points[1:])]


@settings(max_examples=60, deadline=None)
@given(total=st.integers(1, 5000), cuts_local=st.lists(st.integers(1, 10_000), max_size=6),
       cuts_remote=st.lists(st.integers(1, 10_000), max_size=6), gap=st.integers(0, 64))
def test_pairing_copies_the_remote_stream_onto_the_local_one(total, cuts_local, cuts_remote, gap):
    local = _layout(_split(total, cuts_local), gap, start=7)
    remote = _layout(_split(total, cuts_remote), gap + 3, start=100)
    src_space = bytearray(range(256)) * 64
    src_space = src_space[: 100 + total + (gap + 3) * 8]
    stream = b"".join(bytes(src_space[o:o + n]) for o, n in remote)
    dst_space = bytearray(7 + total + gap * 8)
    for lo, ro, n in pair_segments(local, remote):
        dst_space[lo:lo + n] = src_space[ro:ro + n]
    assert b"".join(bytes(dst_space[o:o + n]) for o, n in local) == stream


def test_pairing_refuses_streams_of_different_length():
    with pytest.raises(ValueError, match="not the same weight layout"):
        pair_segments([(0, 10)], [(0, 11)])


def test_coalesce_merges_only_ranges_that_continue_on_both_sides():
    assert coalesce([(0, 100, 8), (8, 108, 8), (16, 200, 8), (24, 208, 8)]) == [(0, 100, 16), (16, 200, 16)]
    assert coalesce([(0, 100, 8), (16, 108, 8)]) == [(0, 100, 8), (16, 108, 8)]


def test_block_pieces_need_enough_reserved_blocks():
    assert block_pieces([0, 8], [64, 72, 80], 8) == [(0, 64, 16)]
    with pytest.raises(ValueError, match="only 1 reserved"):
        block_pieces([0, 8], [64], 8)


def test_chunk_ranges_cover_exactly():
    assert chunk_ranges(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert chunk_ranges(0, 4) == []


@pytest.mark.parametrize("num_bytes,chunk_bytes,num_lanes", [(1, 1, 1), (1000, 7, 3), (1 << 20, 1 << 16, 2),
                                                             ((1 << 20) + 5, 1 << 20, 4)])
def test_chunked_copy_is_bit_exact(num_bytes, chunk_bytes, num_lanes):
    src = torch.randint(0, 256, (num_bytes,), dtype=torch.uint8)
    dst = torch.zeros(num_bytes, dtype=torch.uint8)
    report = chunked_copy(dst, src, chunk_bytes=chunk_bytes, num_lanes=num_lanes)
    assert torch.equal(dst, src) and report.num_bytes == num_bytes and report.copy_ms >= 0


def test_chunked_copy_rejects_mismatched_buffers():
    with pytest.raises(ValueError, match="cannot copy"):
        chunked_copy(torch.zeros(4, dtype=torch.uint8), torch.zeros(5, dtype=torch.uint8))
    with pytest.raises(ValueError, match="uint8"):
        chunked_copy(torch.zeros(4), torch.zeros(4))


def test_host_copy_round_trip_restores_the_device_bytes():
    device = torch.randint(0, 256, (300_000,), dtype=torch.uint8)
    host = HostWeights.allocate(device.numel(), pin=False)
    host.snapshot_from(device, chunk_bytes=65_536)
    original = device.clone()
    device.zero_()
    host.restore_into(device, chunk_bytes=100_000, num_lanes=3)
    assert torch.equal(device, original)
    with pytest.raises(ValueError):
        HostWeights.allocate(0, pin=False)


def test_checksums_name_their_algorithm_and_catch_one_flipped_bit():
    from worker.engine.checksum import bytes_checksum
    from worker.lifecycle.checksums import algorithm_of, checksum, segment_checksums

    data = torch.randint(0, 256, (100_003,), dtype=torch.uint8)
    first = segment_checksums(data, [50_000, 50_003])
    assert all(algorithm_of(c) == "w64" for c in first)
    assert first == segment_checksums(data.clone(), [50_000, 50_003])  # a function of the bytes
    assert first[1] == f"w64:{bytes_checksum(data[50_000:])}"  # the engine's one function, tagged
    flipped = data.clone()
    flipped[77_777] ^= 1
    second = segment_checksums(flipped, [50_000, 50_003])
    assert second[0] == first[0] and second[1] != first[1]
    assert segment_checksums(data, [100_003]) == [checksum(data)]
    for stale in ("deadbeef", "crc32:00000000", "sum:0"):  # untagged, or from a peer with the old algorithms
        with pytest.raises(ValueError, match="known algorithm"):
            algorithm_of(stale)
    with pytest.raises(ValueError, match="inside the buffer"):
        segment_checksums(data, [100_004])

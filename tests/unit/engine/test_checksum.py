"""The weights' fingerprint (`worker.engine.checksum`, "w64"): the numpy host path and the torch device path agree
with each other and with a plain-Python transcription of the definition, for any length and alignment; it sees every
flipped bit, reordered words and swapped pages."""
from __future__ import annotations

import pytest
import torch

from worker.engine.checksum import (
    _LENGTH_MULTIPLIER,
    _ROW_MULTIPLIER,
    _TABLE,
    WORDS_PER_ROW,
    _device_sums,
    _host_sums,
    bytes_checksum,
    segment_checksums,
)

MASK = (1 << 64) - 1


def _definition(data: bytes) -> str:
    """The docstring's formula, word by word in Python integers (the oracle)."""
    padded = data + b"\0" * (-len(data) % 8)
    plain = weighted = 0
    for i in range(len(padded) // 8):
        word = int.from_bytes(padded[8 * i : 8 * i + 8], "little")
        row, col = divmod(i, WORDS_PER_ROW)
        plain += word
        weighted += word * (int(_TABLE[col]) + row * _ROW_MULTIPLIER)
    plain += len(data) * _LENGTH_MULTIPLIER
    return f"{plain & MASK:016x}{weighted & MASK:016x}"


def _random(num_bytes: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (num_bytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


ROW_BYTES = 8 * WORDS_PER_ROW


@pytest.mark.parametrize("num_bytes", [1, 7, 8, 9, ROW_BYTES - 3, ROW_BYTES, 2 * ROW_BYTES + 13])
def test_the_function_is_its_definition(num_bytes):
    data = _random(num_bytes, seed=num_bytes)
    assert bytes_checksum(data) == _definition(bytes(data.numpy()))


@pytest.mark.parametrize("start,num_bytes", [(0, 9 << 20), (3, (9 << 20) + 5), (8, 1000), (5, 123_457)])
def test_host_and_device_paths_agree_for_any_length_and_alignment(start, num_bytes):
    # 9 MiB crosses the 8 MiB chunk boundary; an odd start makes the device path copy to an aligned buffer
    data = _random(start + num_bytes, seed=start)[start:]
    assert _host_sums(data.numpy()) == _device_sums(data)


def test_every_flipped_bit_and_reordering_is_seen():
    page = 2 << 20
    data = _random(4 * page, seed=1)
    base = bytes_checksum(data)
    for index in (0, 1, 4095, page + 17, 4 * page - 1):
        changed = data.clone()
        changed[index] ^= 0x01
        assert bytes_checksum(changed) != base
    swapped_pages = torch.cat([data[page : 2 * page], data[:page], data[2 * page :]])
    assert bytes_checksum(swapped_pages) != base  # same words, same column positions: rows tell them apart
    swapped_words = data.clone()
    swapped_words[0:8], swapped_words[8:16] = data[8:16].clone(), data[0:8].clone()
    assert bytes_checksum(swapped_words) != base
    assert bytes_checksum(torch.cat([data, data.new_zeros(8)])) != base  # trailing zeros change the length


def test_segments_and_bad_input():
    data = _random(1 << 16)
    assert segment_checksums(data, [1 << 15, 1 << 15]) == [bytes_checksum(data[: 1 << 15]),
                                                          bytes_checksum(data[1 << 15 :])]
    with pytest.raises(ValueError):
        segment_checksums(data, [1 << 17])
    with pytest.raises(ValueError):
        bytes_checksum(data.view(torch.int16))

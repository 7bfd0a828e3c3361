"""Verify before ready: per-segment checksums against a reference, then one canary step.

The reference checksums (worker/lifecycle/checksums.py) cover a given segmentation of the weight byte stream: the
source replica's segments for a fork (`ForkSource.segments`, each with its checksum), the segments recorded when this
instance was last active for a warm restore. The target computes its own checksums over the *same* byte ranges,
whatever page runs it holds them in. The canary (the engine's `verify_weights`) then runs the model on a fixed prompt
and compares with the result the engine recorded when it loaded the checkpoint from disk.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

from contracts import WeightSegment

from .checksums import algorithm_of, segment_checksums


@dataclass(frozen=True)
class Verdict:
    is_ok: bool
    why: str
    checksum_ms: float = 0.0
    canary_ms: float = 0.0

    @property
    def timings_ms(self) -> dict[str, float]:
        return {"checksum_ms": self.checksum_ms, "canary_ms": self.canary_ms}


@dataclass(frozen=True)
class Reference:
    """What the weights must hash to: one checksum per consecutive byte range of the weight stream."""

    lengths: tuple[int, ...]
    checksums: tuple[str, ...]

    @classmethod
    def of_segments(cls, segments: Sequence[WeightSegment]) -> "Reference":
        return cls(tuple(s.num_bytes for s in segments), tuple(s.checksum for s in segments))

    @property
    def has_checksums(self) -> bool:
        return bool(self.checksums) and all(self.checksums)


def has_weights(engine: Any) -> bool:
    """Engines without model math (the echo engine) carry no weight buffer: nothing to copy or verify."""
    return getattr(engine, "weight_buffer", None) is not None


def checksums_over(engine: Any, lengths: Sequence[int], algorithm: str | None = None) -> list[str]:
    return segment_checksums(engine.weight_buffer, list(lengths), algorithm)


def verify(engine: Any, reference: Reference | None) -> Verdict:
    """Checksums (when a reference has them), then the canary. Call with the engine parked (not stepping)."""
    if not has_weights(engine):
        return Verdict(True, "no weights to verify")
    checksum_ms = 0.0
    if reference is not None and reference.has_checksums:
        started = time.perf_counter()
        total = engine.weight_buffer.numel()
        if sum(reference.lengths) != total:
            return Verdict(False, f"the reference covers {sum(reference.lengths)} bytes, the weights are {total}")
        try:
            algorithm = algorithm_of(reference.checksums[0])
        except ValueError as exc:
            return Verdict(False, str(exc))
        got = checksums_over(engine, reference.lengths, algorithm)
        checksum_ms = (time.perf_counter() - started) * 1e3
        bad = [i for i, (a, b) in enumerate(zip(got, reference.checksums)) if a != b]
        if bad:
            return Verdict(False, f"checksum mismatch in {len(bad)} of {len(got)} segments (first: {bad[0]})",
                           checksum_ms)
    started = time.perf_counter()
    if getattr(engine, "reference_canary", True) is None:
        # built without reading the checkpoint (a fork target, a load into host memory): the checksums just proved
        # the bytes equal a verified copy's, so the canary run now becomes the reference; it must at least be finite
        if reference is None or not reference.has_checksums:
            return Verdict(False, "no reference canary and no checksums: nothing to verify the weights against")
        try:
            engine.record_reference_canary()
        except ValueError as exc:
            return Verdict(False, str(exc), checksum_ms, (time.perf_counter() - started) * 1e3)
        return Verdict(True, "checksums match; canary recorded as the reference", checksum_ms,
                       (time.perf_counter() - started) * 1e3)
    is_canary_ok = engine.verify_weights()
    canary_ms = (time.perf_counter() - started) * 1e3
    if not is_canary_ok:
        return Verdict(False, "canary step differs from the reference recorded at load", checksum_ms, canary_ms)
    return Verdict(True, "checksums and canary match" if checksum_ms else "canary matches", checksum_ms, canary_ms)

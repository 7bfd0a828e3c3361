"""Per-owner virtual layouts: the weight view and the KV view of one model on the device.

A view is a virtual range reserved once and kept for the owner's life, so the tensors handed to its engine stay
valid views while pages are mapped into and out of it (KV churn, sleep, wake). Slot i of a view is bytes
[i * page_size, (i + 1) * page_size) of it; `*_page` tables say which physical page backs each slot.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from enum import Enum
from heapq import heappop, heappush
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    import torch

UNMAPPED = -1


class OwnerState(Enum):
    ACTIVE = "active"
    SLEEPING = "sleeping"  # pages being unmapped: no KV traffic
    ASLEEP = "asleep"  # views reserved, no pages
    WAKING = "waking"  # fresh pages being mapped
    COMPACTING = "compacting"  # its pages are moving under its views: its engine is paused


@dataclass
class WeightView:
    base_address: int
    num_pages: int
    num_bytes: int
    tensor: "torch.Tensor"  # the whole view, num_pages * page_size bytes
    slot_page: list[int] | None = None  # slot -> physical page; None while the weights hold no pages
    is_kept_on_wake: bool = True  # False after release_weights: a wake leaves this view empty


@dataclass
class KvView:
    base_address: int
    max_num_pages: int
    tensor: "torch.Tensor"
    slot_page: list[int] = field(default_factory=list)
    cached_slots: list[int] = field(default_factory=list)  # mapped, idle; sorted by page id, highest first
    in_use_slots: set[int] = field(default_factory=set)
    free_slots: list[int] = field(default_factory=list)  # min-heap of unmapped slots
    num_refilling: int = 0  # slots being mapped by the refill thread, outside the pool lock
    num_trimming: int = 0  # slots being unmapped by the refill thread
    slept_in_use_slots: set[int] = field(default_factory=set)  # mapped again on wake

    def __post_init__(self) -> None:
        if not self.slot_page:
            self.slot_page = [UNMAPPED] * self.max_num_pages
            self.free_slots = list(range(self.max_num_pages))  # sorted is a valid heap

    @property
    def num_in_flight(self) -> int:
        return self.num_refilling + self.num_trimming

    def cache_insert(self, slot: int) -> None:
        slot_page = self.slot_page
        bisect.insort(self.cached_slots, slot, key=lambda s: -slot_page[s])

    def cache_insert_many(self, slots: Iterable[int]) -> None:
        slot_page = self.slot_page
        self.cached_slots.extend(slots)
        self.cached_slots.sort(key=lambda s: -slot_page[s])

    def pop_free_slots(self, count: int) -> list[int]:
        free_slots = self.free_slots
        return [heappop(free_slots) for _ in range(count)]

    def push_free_slots(self, slots: Iterable[int]) -> None:
        slot_page, free_slots = self.slot_page, self.free_slots
        for slot in slots:
            slot_page[slot] = UNMAPPED
            heappush(free_slots, slot)


@dataclass
class Owner:
    name: str
    state: OwnerState = OwnerState.ACTIVE
    is_busy: bool = False  # a weight or lifecycle operation is mapping/unmapping outside the pool lock
    weights: WeightView | None = None
    kv: KvView | None = None
    retired_bases: list[tuple[int, int]] = field(default_factory=list)  # (base, num pages) of replaced weight views


def mapping_runs(slot_pages: Iterable[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(slot, page) pairs -> (first slot, first page, count) runs where both slot and page advance by one: each run is
    one backend call on the CPU (mmap maps a contiguous part of the memfd at once)."""
    runs: list[tuple[int, int, int]] = []
    for slot, page in sorted(slot_pages):
        if runs:
            first_slot, first_page, count = runs[-1]
            if slot == first_slot + count and page == first_page + count:
                runs[-1] = (first_slot, first_page, count + 1)
                continue
        runs.append((slot, page, 1))
    return runs


def slot_runs(slots: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted slots -> (first slot, count) runs of consecutive slots: one unmap call each."""
    runs: list[tuple[int, int]] = []
    for slot in sorted(slots):
        if runs and slot == runs[-1][0] + runs[-1][1]:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((slot, 1))
    return runs

"""Which instances hold a request's prompt prefix, as the dispatcher can know it: by remembering what it sent where.

The engines cache full KV blocks of prompts keyed by their tokens and the prefix before them (docs/engine.md,
"Prefix caching"), and a request whose leading blocks an instance holds computes only the rest. The dispatcher sees
every prompt it routes, so it keeps, per instance, the chained keys of the blocks it sent there (least recently
routed dropped first, at most `capacity_blocks` per instance), and LST-IMH's p_ij becomes the prefill of the tokens
the instance would not find cached (`DispatcherCore._proc_rows`). An approximation of the engine's cache, as
llm-d's approximate prefix scorer is: it does not see the engine's evictions, so it may promise a hit the engine no
longer has (the deadline margin covers a miss; `capacity_blocks` bounds it) and never sees another dispatcher's
routing. Keys are Python's hash of int tuples, stable across processes (no hash seed for ints); they need not equal
the engine's sha256 keys, only follow the same blocks: full blocks of every prompt token but the last, which the
engine always computes.

Pure: no clock, no I/O. Lookups go by key to the instances holding it, so a round costs nothing for instances that
hold none of its prompts."""
from __future__ import annotations

from collections import OrderedDict
from typing import Sequence


def prefix_block_keys(token_ids: Sequence[int], block_size: int) -> tuple[int, ...]:
    """Chained keys of the full blocks of `token_ids[:-1]`: key k names blocks 0..k, so two prompts share key k
    exactly when they share their first (k + 1) * block_size tokens (up to hash collisions)."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    num_blocks = (len(token_ids) - 1) // block_size
    keys = []
    parent = 0
    tokens = tuple(token_ids)
    for b in range(num_blocks):
        parent = hash((parent, tokens[b * block_size:(b + 1) * block_size]))
        keys.append(parent)
    return tuple(keys)


class PrefixAffinityIndex:
    """Per instance, the block keys the dispatcher routed there, least recently routed first out."""

    def __init__(self, block_size: int, capacity_blocks: int) -> None:
        if block_size < 1 or capacity_blocks < 1:
            raise ValueError(f"block_size and capacity_blocks must be >= 1, got {block_size}, {capacity_blocks}")
        self.block_size = block_size
        self.capacity_blocks = capacity_blocks
        self._blocks: dict[str, OrderedDict[int, None]] = {}  # instance -> keys, oldest first
        self._holders: dict[int, set[str]] = {}  # key -> instances holding it
        self._version: dict[str, int] = {}  # instance -> bumped whenever the keys it holds change
        self._next_version = 0

    def record(self, instance_id: str, keys: Sequence[int]) -> None:
        """A request with these prompt keys was sent to `instance_id`: its engine will hold them (refreshed as most
        recently used when it held them already)."""
        if not keys:
            return
        blocks = self._blocks.setdefault(instance_id, OrderedDict())
        num_before = len(blocks)
        # the head most recent: a prefix's tail goes before its head, as the engine lets its blocks go
        for key in reversed(keys):
            if key in blocks:
                blocks.move_to_end(key)
            else:
                blocks[key] = None
                self._holders.setdefault(key, set()).add(instance_id)
        is_changed = len(blocks) != num_before
        while len(blocks) > self.capacity_blocks:
            old, _ = blocks.popitem(last=False)
            self._drop_holder(old, instance_id)
        if is_changed:
            self._bump(instance_id)

    def forget(self, instance_id: str) -> None:
        """The instance is gone, slept or reloaded: its cache went with it."""
        for key in self._blocks.pop(instance_id, ()):
            self._drop_holder(key, instance_id)
        self._bump(instance_id)

    def retain(self, instance_ids: set[str]) -> None:
        """Forget every instance not in `instance_ids` (those not serving now: a sleeping or reloading engine drops
        its cache, and one that comes back starts empty)."""
        for instance_id in [i for i in self._blocks if i not in instance_ids]:
            self.forget(instance_id)

    def cached_tokens(self, keys: Sequence[int]) -> dict[str, int]:
        """Per instance holding at least the first block: how many leading prompt tokens it holds (whole blocks).

        What an instance holds of one chain of keys is always a prefix of it (`record` touches a block's parent
        after the block, so a parent is never older than its child and goes after it), so each holder's depth is
        found by binary search: a round asks this for every queued request."""
        if not keys:
            return {}
        first = self._holders.get(keys[0])
        if not first:
            return {}
        holders = self._holders
        out = {}
        for instance_id in first:
            lo, hi = 1, len(keys)  # it holds keys[:lo]; not more than keys[:hi]
            while lo < hi:
                mid = (lo + hi + 1) // 2
                held_by = holders.get(keys[mid - 1])
                if held_by is not None and instance_id in held_by:
                    lo = mid
                else:
                    hi = mid - 1
            out[instance_id] = lo * self.block_size
        return out

    def stamp(self, keys: Sequence[int]) -> frozenset:
        """What `cached_tokens(keys)` depends on: the versions of the instances holding the first key. Equal stamps,
        equal answers (a round asks again for every request still queued: the core keeps the answer with its stamp)."""
        first = self._holders.get(keys[0]) if keys else None
        if not first:
            return frozenset()
        version = self._version
        return frozenset([(instance_id, version[instance_id]) for instance_id in first])

    def _bump(self, instance_id: str) -> None:
        self._next_version += 1
        self._version[instance_id] = self._next_version

    def num_blocks(self, instance_id: str) -> int:
        return len(self._blocks.get(instance_id, ()))

    def _drop_holder(self, key: int, instance_id: str) -> None:
        holders = self._holders.get(key)
        if holders is not None:
            holders.discard(instance_id)
            if not holders:
                del self._holders[key]

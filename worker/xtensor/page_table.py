"""Who owns each physical page, and how many pages each owner holds of each kind. Pure bookkeeping.

Assigning a page that has an owner raises: the "no page is owned twice" invariant is checked on every move, not
only in tests.
"""
from __future__ import annotations

from typing import Iterable

WEIGHTS = "weights"
KV = "kv"
PAGE_KINDS = (WEIGHTS, KV)


class PageOwnershipError(RuntimeError):
    """A page was given to a second owner, or taken from an owner that does not hold it."""


class PageTable:
    def __init__(self, num_pages: int) -> None:
        self._owner_kind: list[tuple[str, str] | None] = [None] * num_pages
        self._num_pages_by_owner_kind: dict[tuple[str, str], int] = {}

    def assign(self, page_ids: Iterable[int], owner: str, kind: str) -> None:
        entry = (owner, kind)
        table = self._owner_kind
        count = 0
        for page_id in page_ids:
            if table[page_id] is not None:
                raise PageOwnershipError(f"page {page_id} is already owned by {table[page_id]}, not free for {entry}")
            table[page_id] = entry
            count += 1
        counts = self._num_pages_by_owner_kind
        counts[entry] = counts.get(entry, 0) + count

    def assign_one(self, page_id: int, owner: str, kind: str) -> None:
        """`assign([page_id], ...)` without the loop: the on-demand KV path maps one page at a time."""
        entry = (owner, kind)
        table = self._owner_kind
        if table[page_id] is not None:
            raise PageOwnershipError(f"page {page_id} is already owned by {table[page_id]}, not free for {entry}")
        table[page_id] = entry
        counts = self._num_pages_by_owner_kind
        counts[entry] = counts.get(entry, 0) + 1

    def unassign_one(self, page_id: int, owner: str, kind: str) -> None:
        """`unassign([page_id], ...)` without the loop: a trim gives back one page at a time."""
        entry = (owner, kind)
        table = self._owner_kind
        if table[page_id] != entry:
            raise PageOwnershipError(f"page {page_id} is owned by {table[page_id]}, not by {entry}")
        table[page_id] = None
        counts = self._num_pages_by_owner_kind
        remaining = counts[entry] - 1
        if remaining:
            counts[entry] = remaining
        else:
            del counts[entry]

    def unassign(self, page_ids: Iterable[int], owner: str, kind: str) -> None:
        entry = (owner, kind)
        table = self._owner_kind
        count = 0
        for page_id in page_ids:
            if table[page_id] != entry:
                raise PageOwnershipError(f"page {page_id} is owned by {table[page_id]}, not by {entry}")
            table[page_id] = None
            count += 1
        counts = self._num_pages_by_owner_kind
        remaining = counts.get(entry, 0) - count
        if remaining:
            counts[entry] = remaining
        else:
            counts.pop(entry, None)

    def owner_of(self, page_id: int) -> tuple[str, str] | None:
        return self._owner_kind[page_id]

    def num_pages(self, owner: str, kind: str) -> int:
        return self._num_pages_by_owner_kind.get((owner, kind), 0)

    def counts(self) -> dict[tuple[str, str], int]:
        return dict(self._num_pages_by_owner_kind)

    def snapshot(self) -> list[tuple[str, str] | None]:
        return list(self._owner_kind)

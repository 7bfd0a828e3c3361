"""Leader election for the planners (docs/operations.md: Leader election), the decisions only: when to try for the
lease, when to refresh it, and whether this copy may act. The NATS part (planner/leader.py) performs the writes on a
KV bucket whose entries expire `ttl_s` after their last write and reports what happened here.

Safety: a leader measures its lease from when it *sent* its last successful write, and stops acting `safety_s`
before that write's entry can expire; the server lets a standby create the key only once the entry has expired. So
two copies never both believe they lead, as long as clocks advance at about the same rate. A copy paused past its
lease (a long GC, a stopped VM) could still send a command it decided on before: the epoch fences that (workers
refuse commands older than the newest epoch they have seen)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class LeasePolicy:
    ttl_s: float = 1.5  # the bucket's TTL: a lease nobody refreshed for this long is gone, and a standby takes it
    refresh_s: float = 0.3  # how often the leader writes its lease again (several writes per TTL: one lost is fine)
    safety_s: float = 0.4  # the leader stops acting this long before its lease could expire
    poll_s: float = 0.2  # how often a standby tries to take the lease

    def __post_init__(self) -> None:
        if not 0 < self.refresh_s < self.ttl_s - self.safety_s:
            raise ValueError(f"refresh_s ({self.refresh_s}) must be positive and below ttl_s - safety_s "
                             f"({self.ttl_s} - {self.safety_s}): the leader would lose its lease between refreshes")
        if self.safety_s < 0 or self.poll_s <= 0:
            raise ValueError("safety_s must be >= 0 and poll_s > 0")


Step = Literal["acquire", "refresh"]


class Lease:
    """One copy's view of its lease. Time is a monotonic clock in seconds; `revision` is the KV entry's revision
    (the bucket's sequence: it only grows, across every key). The epoch of a term is the revision of the write that
    won it, so a later term always has a larger epoch."""

    def __init__(self, policy: LeasePolicy = LeasePolicy()) -> None:
        self.policy = policy
        self.epoch = 0  # of the current term, or of the last one held (0: never led)
        self.revision = 0  # of our last write (0: we hold nothing)
        self._confirmed_at_s: float | None = None  # when our last successful write was sent
        self.num_terms = 0

    @property
    def holds(self) -> bool:
        return self.revision > 0

    def next_step(self) -> Step:
        return "refresh" if self.holds else "acquire"

    def delay_s(self) -> float:
        """Until the next write attempt."""
        return self.policy.refresh_s if self.holds else self.policy.poll_s

    def may_act(self, now_s: float) -> bool:
        """Leader now: holds the lease and its last write is recent enough that nobody else can have taken it."""
        return (self.holds and self._confirmed_at_s is not None
                and now_s - self._confirmed_at_s < self.policy.ttl_s - self.policy.safety_s)

    def on_won(self, sent_at_s: float, revision: int) -> None:
        """Our create succeeded: a new term, whose epoch is this revision."""
        self.epoch = self.revision = revision
        self._confirmed_at_s = sent_at_s
        self.num_terms += 1

    def on_refreshed(self, sent_at_s: float, revision: int) -> None:
        self.revision = revision
        self._confirmed_at_s = sent_at_s

    def on_lost(self) -> None:
        """Someone else holds the key, or ours expired (our update with the last revision was refused)."""
        self.revision = 0
        self._confirmed_at_s = None

    def on_unreachable(self, now_s: float) -> None:
        """A write that got no answer: we may still hold the lease, but past its safe time we hold nothing."""
        if self.holds and not self.may_act(now_s):
            self.on_lost()

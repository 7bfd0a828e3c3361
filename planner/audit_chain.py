"""The PLANS hash chains, checked: each event names the digest of the event stored before it on the same subject
(`prev_event_sha256`, `contracts.plans.audit_digest`; one chain per subject, as each has one writer), and the
stream's sequence numbers leave no gap, so `janus audit --verify` finds an event that was altered, removed or
inserted after it was stored. Pure: stored events in, a report out.

What it cannot see: events that aged out at the start of the stream (max_age) look like chains that start later, so
the first event kept on each subject is taken on trust unless the stream still starts at seq 1 (then it must name no
predecessor); and a rewrite of the whole stream from some point on by someone who can also publish (a planner's
credentials) with a fresh chain. The stream refuses deletes and purges in its own configuration, so removing an
event takes the server's files or an administrator.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Iterable

from contracts.plans import audit_digest

PREV_FIELD = "prev_event_sha256"


@dataclass(frozen=True)
class StoredEvent:
    seq: int
    subject: str
    data: bytes


@dataclass
class ChainReport:
    first_seq: int  # what the stream says it keeps
    last_seq: int
    num_checked: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def is_intact(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        if self.is_intact:
            return (f"PLANS chain intact: {self.num_checked} event(s), seq {self.first_seq}..{self.last_seq}"
                    if self.num_checked else "PLANS is empty: nothing to verify")
        return f"PLANS chain BROKEN: {len(self.problems)} problem(s) in {self.num_checked} event(s)"


def _prev_digest_of(event: StoredEvent) -> str | None:
    """The digest the event names, or None for a payload that is not a chained event."""
    try:
        payload = json.loads(event.data)
    except ValueError:
        return None
    value = payload.get(PREV_FIELD) if isinstance(payload, dict) else None
    return value if isinstance(value, str) else None


def verify_chain(events: Iterable[StoredEvent], *, first_seq: int, last_seq: int) -> ChainReport:
    """Check `events` (the stream's, in sequence order) against each other and against the stream's first and last
    sequence numbers: a gap in the sequence is a removed event, a digest that does not match the event before it on
    its subject is an altered, removed or inserted one."""
    report = ChainReport(first_seq=first_seq, last_seq=last_seq)
    prev_seq = first_seq - 1
    last_on: dict[str, StoredEvent] = {}  # subject -> the event before, on that subject
    for event in events:
        report.num_checked += 1
        if event.seq != prev_seq + 1:
            report.problems.append(f"seq {prev_seq + 1}..{event.seq - 1}: missing (removed from the stream)")
        prev_seq = event.seq
        named = _prev_digest_of(event)
        before = last_on.get(event.subject)
        last_on[event.subject] = event
        if named is None:
            report.problems.append(f"seq {event.seq}: not a chained event (no {PREV_FIELD})")
        elif before is not None and named != audit_digest(before.subject, before.data):
            report.problems.append(f"seq {event.seq}: does not follow seq {before.seq}, the event before it on "
                                   f"{event.subject} (an event was altered, removed or inserted)")
        elif before is None and first_seq == 1 and named:
            report.problems.append(f"seq {event.seq}: names a predecessor on {event.subject}, but none was stored")
    if prev_seq < last_seq:
        report.problems.append(f"seq {prev_seq + 1}..{last_seq}: missing at the end (removed from the stream)")
    return report

"""Poison requests: a request whose instance failed under it twice is not dispatched again.

Pure. An engine that breaks while serving a request cannot say which of its requests broke it, so every request it
held goes back to the queue. A request that broke the engine itself would then break the next instance, and the
next: after failing on MAX_NUM_INSTANCE_FAILURES distinct instances it ends with an internal error naming its id
(HTTP 500), and the fleet is spared a third failure. A request handed back for any other reason (its instance was
not ready, or drained) costs a dispatch attempt, not a failure.
"""
from __future__ import annotations

MAX_NUM_INSTANCE_FAILURES = 2


def note_instance_failure(failed_on: tuple[str, ...], instance_id: str) -> tuple[str, ...]:
    """The instances a request has failed on, with `instance_id` added once."""
    return failed_on if instance_id in failed_on else failed_on + (instance_id,)


def is_poison(failed_on: tuple[str, ...]) -> bool:
    return len(failed_on) >= MAX_NUM_INSTANCE_FAILURES


def poison_message(request_id: str, failed_on: tuple[str, ...]) -> str:
    return (f"request {request_id} failed on {len(failed_on)} instances ({', '.join(failed_on)}) and is not "
            f"dispatched again (poison request)")

"""The lease decisions (planner/core/lease.py): when a copy may act, and that a later term has a larger epoch."""
from __future__ import annotations

import pytest

from planner.core.lease import Lease, LeasePolicy
from worker.core.fencing import EpochFence
from contracts import ErrorCode

POLICY = LeasePolicy(ttl_s=1.5, refresh_s=0.3, safety_s=0.4, poll_s=0.2)


def test_a_leader_acts_only_within_its_ttl_less_the_safety_margin_from_its_last_write_sent():
    lease = Lease(POLICY)
    assert lease.next_step() == "acquire" and not lease.may_act(0.0) and lease.delay_s() == POLICY.poll_s
    lease.on_won(sent_at_s=10.0, revision=7)
    assert lease.epoch == 7 and lease.next_step() == "refresh" and lease.delay_s() == POLICY.refresh_s
    assert lease.may_act(10.0) and lease.may_act(11.09)
    assert not lease.may_act(11.11)  # 1.5 - 0.4: the standby may take the key at 11.5 at the earliest
    lease.on_refreshed(sent_at_s=11.0, revision=12)
    assert lease.may_act(12.0) and lease.epoch == 7  # a refresh keeps the term


def test_a_leader_that_cannot_refresh_stops_acting_and_then_holds_nothing():
    lease = Lease(POLICY)
    lease.on_won(sent_at_s=0.0, revision=3)
    lease.on_unreachable(0.5)  # still within its safe time: it keeps the lease (and acts)
    assert lease.holds and lease.may_act(0.5)
    lease.on_unreachable(1.2)
    assert not lease.holds and lease.next_step() == "acquire" and lease.epoch == 3


def test_a_lease_taken_by_another_copy_is_lost_and_the_next_term_has_a_larger_epoch():
    a, b = Lease(POLICY), Lease(POLICY)
    a.on_won(0.0, revision=4)
    a.on_refreshed(0.3, revision=9)
    a.on_lost()  # its update with revision 9 refused: b created the key after a's entry expired
    b.on_won(2.0, revision=10)
    assert not a.may_act(2.0) and b.may_act(2.0) and b.epoch > a.epoch


@pytest.mark.parametrize("kwargs", [{"refresh_s": 1.2}, {"refresh_s": 0.0}, {"safety_s": -0.1}, {"poll_s": 0.0}])
def test_a_policy_that_could_lose_the_lease_between_refreshes_is_refused(kwargs):
    with pytest.raises(ValueError):
        LeasePolicy(**kwargs)


def test_the_fence_refuses_an_older_epoch_than_the_newest_seen():
    fence = EpochFence()
    assert fence.admit(0) is None  # unelected senders pass until an elected one was seen
    assert fence.admit(5, "reconciler-0") is None and fence.admit(5) is None
    refused = fence.admit(4, "reconciler-1")
    assert refused.code == ErrorCode.STALE_EPOCH and not refused.retryable
    assert "reconciler-1" in refused.message and refused.detail == {"epoch": "4", "newest_epoch": "5"}
    assert fence.admit(9) is None and fence.admit(5) is not None and fence.newest_epoch == 9

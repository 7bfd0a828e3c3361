"""A lease write of ours that landed after we stopped waiting for its answer (planner/leader.py `_reclaim_own`):
the copy finds its own entry in the lease key and takes it back at once, where it used to stand by until that entry
expired, and with it the whole cluster's planning, while the process was still catching up after a stall. Another
holder's entry is never taken. Real nats-server; the bucket's TTL is made long here (30 s), so that waiting for
expiry instead of reclaiming cannot pass the test."""
from __future__ import annotations

import asyncio
import json

from contracts import subjects
from planner.core.lease import LeasePolicy
from planner.leader import Leadership
from runtime.jetstream import ensure_kv
from tests.polling import wait_for

LONG_TTL = LeasePolicy(ttl_s=30.0)
RECLAIM_LIMIT_S = 10.0  # a third of the TTL: only a reclaim, never the entry's expiry, leads this soon


async def test_a_copy_takes_back_its_own_unanswered_lease_and_never_another_holders(bus_factory):
    bus = await bus_factory("lease-reclaim-test")
    kv = await ensure_kv(bus.js, subjects.LEASES_BUCKET, ttl_s=LONG_TTL.ttl_s)
    mine, theirs = "reclaim-test-mine", "reclaim-test-theirs"
    # what a create of ours answered too late leaves: the key, holding our name
    landed = await kv.create(mine, json.dumps({"holder": "copy-0"}).encode())
    await kv.create(theirs, json.dumps({"holder": "copy-9"}).encode())
    own = Leadership(bus, mine, "copy-0", policy=LONG_TTL)
    other = Leadership(bus, theirs, "copy-1", policy=LONG_TTL)
    await own.start()
    await other.start()
    try:
        await wait_for(own.is_leader, what="the copy leading on its own entry", timeout_s=RECLAIM_LIMIT_S)
        assert own.epoch > landed and own.lease.num_terms == 1
        entry = await kv.get(mine)
        assert json.loads(entry.value)["holder"] == "copy-0" and entry.revision >= own.epoch
        await asyncio.sleep(1.0)  # several polls of the other copy, all refused
        assert not other.is_leader() and other.epoch == 0
        assert json.loads((await kv.get(theirs)).value)["holder"] == "copy-9"
    finally:
        await own.stop()
        await other.stop()
        for key in (mine, theirs):
            try:
                await kv.delete(key)
            except Exception:  # noqa: BLE001 - deleted by stop already
                pass
        await ensure_kv(bus.js, subjects.LEASES_BUCKET, ttl_s=LeasePolicy().ttl_s)  # the suite's usual TTL

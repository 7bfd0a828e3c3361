"""DecodeBacklog keeps each instance's backlog as a running count; it must always equal the definition (last
report + requests sent that the report cannot include), whatever order the events come in."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from contracts import InstanceRecord, InstanceRole, ModelState, Pool
from dispatcher.core.decode_routing import DecodeBacklog

INSTANCES = ("d0", "d1", "d2")
REQUESTS = tuple(f"r{k}" for k in range(8))

event = st.one_of(
    st.tuples(st.just("sent"), st.sampled_from(INSTANCES), st.sampled_from(REQUESTS)),
    st.tuples(st.just("done"), st.sampled_from(REQUESTS), st.integers(0, 100)),
    st.tuples(st.just("forget"), st.sampled_from(REQUESTS)),
    st.tuples(st.just("report"), st.sampled_from(INSTANCES), st.integers(0, 100), st.integers(0, 20)),
    st.tuples(st.just("lost"), st.sampled_from(INSTANCES)),
)


def _from_scratch(b: DecodeBacklog, instance_id: str) -> int:
    reported = b._reported.get(instance_id, (0.0, 0))[1]
    return reported + len(b._sent.get(instance_id, ()))


def _record(instance_id: str, max_num_seqs: int = 8) -> InstanceRecord:
    return InstanceRecord(instance_id=instance_id, model="m", worker_id="w", role=InstanceRole.DECODE,
                          pool=Pool.ELASTIC, state=ModelState.ACTIVE, is_ready=True, max_num_seqs=max_num_seqs,
                          updated_unix_ms=0.0)


def _apply(b: DecodeBacklog, e: tuple) -> None:
    if e[0] == "sent":
        if e[2] not in b._instance_of:  # a request is sent once (the core forgets it before any retry)
            b.record_sent(e[1], e[2])
    elif e[0] == "done":
        b.record_prefill_done(e[1], float(e[2]))
    elif e[0] == "forget":
        b.forget_request(e[1])
    elif e[0] == "report":
        b.report(e[1], float(e[2]), e[3])
    else:
        b.forget_instance(e[1])


@settings(max_examples=300, deadline=None)
@given(st.lists(event, max_size=60))
def test_the_running_count_equals_the_definition(events):
    b = DecodeBacklog()
    for e in events:
        _apply(b, e)
        for instance_id in INSTANCES:
            assert b.backlog(instance_id) == _from_scratch(b, instance_id)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(event, st.tuples(st.just("choose"), st.integers(0, 2))), max_size=80))
def test_choose_from_its_heap_is_the_minimum_of_the_key_after_any_events(events):
    """choose keeps a heap per model across calls with the same candidate tuple; whatever happened to the backlogs
    in between, it must answer what a scan over the key would. A new tuple (the registry changed) starts over."""
    b = DecodeBacklog()
    tuples = [tuple(_record(i, max_num_seqs=4 * (k + 1)) for k, i in enumerate(INSTANCES)),
              tuple(_record(i, max_num_seqs=8) for i in INSTANCES[:2])]
    for e in events:
        if e[0] == "choose":
            candidates = tuples[e[1] % 2]
            expected = min(candidates, key=lambda r: (b.backlog(r.instance_id),
                                                      b.backlog(r.instance_id) / r.max_num_seqs, r.instance_id))
            assert b.choose(candidates) is expected
        else:
            _apply(b, e)


def test_choose_takes_the_least_backlog_then_the_emptier_share_then_the_id():
    b = DecodeBacklog()
    b.report("a", 0.0, 3)
    b.report("b", 0.0, 2)
    b.record_sent("b", "r1")  # b: 3, a: 3
    big, small = _record("b", max_num_seqs=16), _record("a", max_num_seqs=8)
    assert b.choose([small, big]).instance_id == "b"  # 3/16 < 3/8
    b.record_sent("b", "r2")
    assert b.choose([small, big]).instance_id == "a"  # 4 > 3
    assert b.choose([_record("c"), _record("a")]).instance_id == "c"  # c has no backlog at all
    assert b.choose([]) is None


def test_choose_is_the_minimum_of_its_documented_key():
    import random

    rng = random.Random(7)
    for _ in range(300):
        b = DecodeBacklog()
        records = [_record(f"d{rng.randrange(40):02d}-{k}", max_num_seqs=rng.choice([4, 8, 16]))
                   for k in range(rng.randrange(1, 12))]
        rng.shuffle(records)
        for r in records:
            b.report(r.instance_id, 0.0, rng.choice([0, 0, 1, 2, 4, 8]))
        expected = min(records, key=lambda r: (b.backlog(r.instance_id),
                                               b.backlog(r.instance_id) / r.max_num_seqs, r.instance_id))
        assert b.choose(records) is expected

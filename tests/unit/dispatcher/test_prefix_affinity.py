"""Prefix-aware routing (dispatcher/core/prefix_affinity.py): the dispatcher remembers the prompt blocks it sent to
each instance, predicts p_ij from the tokens an instance would not find cached, and among equally free instances
the holder of a prefix takes its request; deadlines decide first."""
from __future__ import annotations

import pytest

from contracts import GenerateRequest, InstanceRole, SamplingParams
from dispatcher.core import DispatchPolicy, DispatcherCore, ThroughputPrefillModel
from dispatcher.core.prefix_affinity import PrefixAffinityIndex, prefix_block_keys

from .helpers import TOKENS_PER_S, assigns, heartbeat, record

BLOCK = 16
SYSTEM = tuple(range(1000, 1000 + 64 * BLOCK))  # a 1,024-token system prompt the chats share


def chat(request_id: str, at_ms: float, tokens: tuple[int, ...], slo_ms: float = 1000.0) -> GenerateRequest:
    return GenerateRequest(request_id=request_id, model="m", prompt_token_ids=tokens,
                           sampling=SamplingParams(max_tokens=8), arrival_unix_ms=at_ms,
                           ttft_deadline_unix_ms=at_ms + slo_ms, tpot_slo_ms=50.0, reply_subject="r")


def make_core(**knobs) -> DispatcherCore:
    knobs.setdefault("publish_period_ms", 60_000.0)
    core = DispatcherCore(DispatchPolicy(**knobs), ThroughputPrefillModel(TOKENS_PER_S))
    core.on_instances(0.0, [record("a"), record("b"), record("c")])
    return core


def test_keys_name_a_block_and_everything_before_it_and_leave_the_last_token_out():
    base = tuple(range(3 * BLOCK))
    assert len(prefix_block_keys(base, BLOCK)) == 2  # 48 tokens: the last is always computed, so 2 full blocks
    assert len(prefix_block_keys(base + (7,), BLOCK)) == 3
    longer = prefix_block_keys(base + tuple(range(40)), BLOCK)
    assert longer[:3] == prefix_block_keys(base + (7,), BLOCK)
    changed = (base[0] + 1,) + base[1:] + tuple(range(40))  # the first token differs: no key is shared after it
    assert not set(prefix_block_keys(changed, BLOCK)) & set(longer)
    with pytest.raises(ValueError):
        prefix_block_keys(base, 0)


def test_the_index_finds_the_longest_held_prefix_per_instance_and_drops_the_tail_first():
    index = PrefixAffinityIndex(BLOCK, capacity_blocks=6)
    first = prefix_block_keys(tuple(range(4 * BLOCK + 1)), BLOCK)  # 4 blocks
    index.record("a", first)
    index.record("b", first[:2])
    assert index.cached_tokens(first) == {"a": 4 * BLOCK, "b": 2 * BLOCK}
    other = prefix_block_keys(tuple(range(500, 500 + 3 * BLOCK + 1)), BLOCK)  # 3 blocks: "a" holds 7 > 6
    index.record("a", other)
    assert index.num_blocks("a") == 6
    assert index.cached_tokens(first)["a"] == 3 * BLOCK  # the tail block of the older prompt went first
    assert index.cached_tokens(other)["a"] == 3 * BLOCK
    index.forget("a")
    assert index.cached_tokens(first) == {"b": 2 * BLOCK} and index.num_blocks("a") == 0


def first_turn_on_b(core: DispatcherCore):
    """An unrelated prompt keeps "a" busy while a chat's first turn comes: the turn lands on "b"."""
    (other,) = assigns(core.on_request(0.0, chat("x", 0.0, tuple(range(1000)))))
    (first,) = assigns(core.on_request(10.0, chat("t1", 10.0, SYSTEM + (1, 2, 3))))
    assert (other.instance_id, first.instance_id) == ("a", "b")
    assert first.predicted_prefill_ms == pytest.approx(len(SYSTEM + (1, 2, 3)) / TOKENS_PER_S * 1e3)
    core.on_prefill_done(150.0, "a", "x")
    core.on_prefill_done(200.0, "b", "t1")
    # both replies done (a chat sends its next turn after the reply): the heartbeat shows no decode backlog
    core.on_heartbeat(250.0, heartbeat(250.0, {"a": 0, "b": 0, "c": 0}, role=InstanceRole.COLOCATED))


def test_the_next_turn_of_a_chat_goes_to_the_instance_holding_its_prefix_predicted_on_the_new_tokens():
    core = make_core()
    first_turn_on_b(core)
    turn = SYSTEM + (1, 2, 3) + tuple(range(9000, 9000 + 60))
    (second,) = assigns(core.on_request(300.0, chat("t2", 300.0, turn)))
    assert second.instance_id == "b"  # all three free and idle: without the prefix, "a" (by position)
    uncached = len(turn) - len(SYSTEM)  # the system prompt's 64 whole blocks are held
    assert second.predicted_prefill_ms == pytest.approx(uncached / TOKENS_PER_S * 1e3)


def test_without_the_knob_the_next_turn_goes_by_the_instances_order_and_its_full_prompt():
    core = make_core(is_prefix_affine=False)
    first_turn_on_b(core)
    turn = SYSTEM + (1, 2, 3, 4, 5)
    (second,) = assigns(core.on_request(300.0, chat("t2", 300.0, turn)))
    assert second.instance_id == "a"  # all free and idle: by position
    assert second.predicted_prefill_ms == pytest.approx(len(turn) / TOKENS_PER_S * 1e3)


def test_a_busy_holder_that_would_miss_the_deadline_does_not_get_the_request():
    core = make_core(is_late_binding=False)  # every plan committed at once: the holder's queue is known
    core.on_instances(0.0, [record("a")])  # one instance at first: it holds the prefix and gets busy
    assert assigns(core.on_request(0.0, chat("t1", 0.0, SYSTEM + (1,))))[0].instance_id == "a"
    (busy,) = assigns(core.on_request(10.0, chat("long", 10.0, tuple(range(50_000)), slo_ms=60_000.0)))
    assert busy.instance_id == "a"  # 5 s of prefill
    core.on_instances(20.0, [record("a"), record("b"), record("c")])
    (second,) = assigns(core.on_request(30.0, chat("t2", 30.0, SYSTEM + (1, 2), slo_ms=500.0)))
    assert second.instance_id != "a"  # its queue would miss a 500 ms TTFT: another computes the prompt whole
    assert second.predicted_prefill_ms == pytest.approx(len(SYSTEM + (1, 2)) / TOKENS_PER_S * 1e3)


def test_a_lost_instance_is_forgotten_with_its_cache():
    core = make_core()
    (first,) = assigns(core.on_request(0.0, chat("t1", 0.0, SYSTEM + (1,))))
    core.on_prefill_done(200.0, first.instance_id, "t1")
    others = [r for r in ("a", "b", "c") if r != first.instance_id]
    core.on_instances(300.0, [record(r) for r in others])  # the holder slept: gone from the routable set
    core.on_instances(400.0, [record(r) for r in ("a", "b", "c")])  # back, with an empty cache
    (second,) = assigns(core.on_request(500.0, chat("t2", 500.0, SYSTEM + (1, 2))))
    assert second.predicted_prefill_ms == pytest.approx(len(SYSTEM + (1, 2)) / TOKENS_PER_S * 1e3)


def test_turns_of_two_chats_queued_together_each_go_to_their_own_holder():
    """LST-IMH gives the first of equally free instances every request it can finish in time; with affinity, each
    queued turn then moves to the near-free instance holding its chat, where everything committed stays on time."""
    other = tuple(range(5000, 5000 + 64 * BLOCK))  # a second chat's system prompt

    def two_chats(core: DispatcherCore) -> dict[str, str]:
        first_turn_on_b(core)  # chat 1 is held by "b"
        (u1,) = assigns(core.on_request(300.0, chat("u1", 300.0, other + (9,))))
        assert u1.instance_id == "a"  # all idle: by position
        core.on_prefill_done(450.0, "a", "u1")
        core.on_heartbeat(480.0, heartbeat(480.0, {"a": 0, "b": 0, "c": 0}, role=InstanceRole.COLOCATED))
        both = core.on_requests(500.0, [chat("t2", 500.0, SYSTEM + (1, 2, 3, 4)), chat("u2", 500.0, other + (9, 8))])
        return {a.request_id: a.instance_id for a in assigns(both)}

    assert two_chats(make_core()) == {"t2": "b", "u2": "a"}
    assert two_chats(make_core(is_prefix_affine=False)) == {"t2": "a", "u2": "a"}  # they fit one's deadlines


def test_a_prefix_every_request_shares_does_not_pile_decoding_on_its_first_holder():
    """A system prompt common to all requests: its first holder gets a request another co-located instance would
    take only while it decodes at most prefix_max_decode_gap more; past that the other takes one and holds the
    prompt too, and from then on neither is preferred."""
    core = make_core(prefix_max_decode_gap=2)
    placed = []
    for n in range(12):  # one at a time: each prefill done before the next arrives, every reply still decoding
        (a,) = assigns(core.on_request(100.0 * n, chat(f"s{n}", 100.0 * n, SYSTEM + (n,))))
        core.on_prefill_done(100.0 * n + 50.0, a.instance_id, f"s{n}")
        placed.append(a.instance_id)
    counts = {i: placed.count(i) for i in set(placed)}
    assert set(counts) == {"a", "b", "c"} and max(counts.values()) - min(counts.values()) <= 3, placed
    without_gap = make_core(prefix_max_decode_gap=1000)
    for n in range(12):
        (a,) = assigns(without_gap.on_request(100.0 * n, chat(f"s{n}", 100.0 * n, SYSTEM + (n,))))
        without_gap.on_prefill_done(100.0 * n + 50.0, a.instance_id, f"s{n}")
        placed[n] = a.instance_id
    assert set(placed) == {placed[0]}  # every request on the prompt's first holder

"""The decode floor (`ElasticPolicy.decode_kv_fill_target`): a disaggregated model keeps at least as many decode
instances as the sequences in flight at its decode instances fill, from the KV their heartbeats report."""
from __future__ import annotations

import pytest
from planner_test_oracles import TableOracle, bare_elastic, window

from contracts import InstanceRole, InstanceStatus, ModelState, Pool
from planner.core import DecodeKV, ElasticScaler, decode_kv_by_model
from planner.core.elastic import decode_floor, split_prefill_decode, with_decode_floor

# The table oracle sizes "m" at 8 instances for 4 replicas' worth of tokens (its bound 1 - exp(-3 m / 4) - 0.005
# reaches 0.99 from m = 8); 512-token prompts and 128-token answers at the policy's ratio 2.0 split them 5 prefill /
# 3 decode.
RATE_RPS = 4000.0 / 640.0
SPLIT = (5, 3)
# Two decode instances of 100 blocks each: 38 sequences hold 190 (5 each) and 40 wait for room.
FULL = DecodeKV(num_instances=2, num_kv_blocks_used=190, num_kv_blocks_free=10, num_running=38, num_waiting=40)


def _scaler(**knobs) -> ElasticScaler:
    scaler = ElasticScaler(TableOracle(), bare_elastic(is_debounced=False, **knobs))
    scaler.observe(window("m", RATE_RPS, 1_000.0))
    return scaler


def _pd(plan) -> tuple[int, int]:
    (target,) = [t for t in plan.targets if t.model == "m"]
    return target.num_prefill, target.num_decode


def test_the_floor_counts_the_blocks_held_and_a_running_sequences_share_per_waiting_one():
    # 190 held + 40 waiting x 5 = 390 blocks; 100 per instance at 0.9: ceil(4.33) = 5
    assert decode_floor(FULL, 0.9) == 5
    assert decode_floor(FULL, 1.0) == 4  # 3.9 instances' worth
    assert decode_floor(FULL._replace(num_waiting=0), 0.9) == 3  # 190 / 90 = 2.1
    half = DecodeKV(num_instances=4, num_kv_blocks_used=180, num_kv_blocks_free=220, num_running=30, num_waiting=0)
    assert decode_floor(half, 0.9) == 2, "a half-full decode pool needs half its instances"
    assert decode_floor(DecodeKV(2, 0, 0, 0, 0), 0.9) == 0, "no KV reported: no floor"
    assert decode_floor(DecodeKV(0, 0, 0, 0, 0), 0.9) == 0


def test_a_split_keeps_its_decode_floor_from_its_prefill_instances_while_one_is_left():
    assert with_decode_floor((5, 2), 4) == (3, 4)
    assert with_decode_floor((5, 2), 9) == (1, 6), "one prefill instance is left"
    assert with_decode_floor((5, 2), 1) == (5, 2), "a floor below the split changes nothing"
    assert with_decode_floor((2, 0), 5) == (2, 0), "a colocated count has no decode instances to floor"
    assert split_prefill_decode(8, window("m", RATE_RPS, 0.0).features, bare_elastic(), None, 5) == (3, 5)


def test_heartbeats_give_each_model_its_serving_decode_instances_kv():
    def status(iid, model, role, state, used, free, running, waiting):
        return ("w", InstanceStatus(instance_id=iid, model=model, role=role, pool=Pool.ELASTIC, state=state,
                                    num_kv_blocks_used=used, num_kv_blocks_free=free, num_running=running,
                                    num_waiting=waiting))

    instances = [
        status("d1", "m", InstanceRole.DECODE, ModelState.ACTIVE, 90, 10, 18, 5),
        status("d2", "m", InstanceRole.DECODE, ModelState.ACTIVE, 100, 0, 20, 35),
        status("d3", "m", InstanceRole.DECODE, ModelState.DRAINING, 50, 50, 10, 0),  # leaving: not counted
        status("p1", "m", InstanceRole.PREFILL, ModelState.ACTIVE, 30, 70, 0, 9),  # a prefill's KV is not decode's
        status("c1", "n", InstanceRole.COLOCATED, ModelState.ACTIVE, 30, 70, 3, 0),
    ]
    assert decode_kv_by_model(instances) == {"m": FULL}


def test_a_full_decode_pool_raises_the_count_by_the_decode_instances_it_needs():
    off = _scaler().tick(1_000.0, ["m"], 64, decode_kv={"m": FULL}).plan
    assert _pd(off) == SPLIT, "without decode_kv_fill_target the heartbeats' KV changes nothing"
    plan = _scaler(decode_kv_fill_target=0.9).tick(1_000.0, ["m"], 64, decode_kv={"m": FULL}).plan
    (target,) = plan.targets
    assert _pd(plan) == (5, 5), "the split's prefill count, and the decode instances the sequences fill"
    assert "sequences in flight fill 5 decode instances to 0.9 of their KV" in target.reason
    calm = FULL._replace(num_kv_blocks_used=60, num_kv_blocks_free=140, num_running=12, num_waiting=0)
    assert _pd(_scaler(decode_kv_fill_target=0.9).tick(1_000.0, ["m"], 64, decode_kv={"m": calm}).plan) == SPLIT


def test_a_short_budget_takes_the_floors_devices_from_prefill():
    plan = _scaler(decode_kv_fill_target=0.9).tick(1_000.0, ["m"], 8, decode_kv={"m": FULL}).plan
    assert _pd(plan) == (3, 5) and plan.is_scaled_down


def test_a_colocated_model_has_no_decode_floor():
    scaler = ElasticScaler(TableOracle(), bare_elastic(is_debounced=False, decode_kv_fill_target=0.9,
                                                       min_num_disaggregated=9))
    scaler.observe(window("m", RATE_RPS, 1_000.0))
    assert _pd(scaler.tick(1_000.0, ["m"], 64, decode_kv={"m": FULL}).plan) == (8, 0)


def test_the_floor_is_on_by_default():
    from planner.core import ElasticPolicy

    assert ElasticPolicy().decode_kv_fill_target == 0.75


@pytest.mark.parametrize("fill", [0.0, 1.5])
def test_a_fill_target_outside_0_1_is_refused(fill):
    with pytest.raises(ValueError, match="decode_kv_fill_target"):
        bare_elastic(decode_kv_fill_target=fill)

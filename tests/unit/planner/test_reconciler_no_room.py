"""Make before break when there is no room for the replacement (issue 24): a steady plan that claims a device whose
elastic instance cannot be replaced elsewhere used to wait forever. The elastic instance waited for its model's
replacement, which had no free device; the device that would have freed up held the steady model's old elastic
instance, which waited for its steady replacement on the claimed device. Now the removal waits only while a
replacement may come: when the placer finds no device for the model's missing instances, none of its wanted
instances is coming up and no removal is freeing a device for it, the old instance goes after
`ReconcilerPolicy.no_room_wait_ms` (the plan wins)."""
from __future__ import annotations

from test_planner_reconciler import POLICY, boot, converge, elastic, heartbeats, steady

from contracts import InstanceRole, LifecycleAction, ModelState, Pool
from planner.core.reconciler import Reconciler

C, P, D = InstanceRole.COLOCATED, InstanceRole.PREFILL, InstanceRole.DECODE
UP = (LifecycleAction.ACTIVATE, LifecycleAction.FORK_FROM)


def run_all(rec: Reconciler, workers, commands, now: float) -> list:
    """`converge`, returning every command: these and all that followed."""
    return [*commands, *(c for e in converge(rec, workers, commands, now) for c in e.commands)]


def settle(rec: Reconciler, workers, now: float, quiet_ms: float = 5_000.0, step_ms: float = 500.0,
           max_num_rounds: int = 100) -> tuple[float, list]:
    """Heartbeats, a tick, the workers run what it sends, time moves on by `step_ms`; until nothing was sent for
    `quiet_ms` (longer than the policy's no_room_wait_ms). Returns (time, every command sent)."""
    assert quiet_ms > POLICY.no_room_wait_ms
    sent, quiet_since = [], now
    for _ in range(max_num_rounds):
        heartbeats(rec, workers, now)
        commands = list(rec.on_tick(now).commands)
        if commands:
            sent += run_all(rec, workers, commands, now)
            quiet_since = now
        elif now - quiet_since >= quiet_ms:
            return now, sent
        now += step_ms
    raise AssertionError("still sending commands")


def where(workers, model: str, role: InstanceRole, pool: Pool) -> list[str]:
    """Workers holding an ACTIVE instance of `model` in `role` and `pool`."""
    return sorted(w for w, insts in workers.instances.items() for st in insts.values()
                  if st.model == model and st.role == role and st.pool == pool and st.state == ModelState.ACTIVE)


def _hot_split_and_tail(worker_ids: list[str]):
    """`hot` as one prefill and one decode instance, `tail` colocated, all elastic, all ready."""
    rec, workers = boot(worker_ids)
    converge(rec, workers, rec.on_elastic_plan(0.0, elastic("e1", {"hot": (1, 1), "tail": (1, 0)})).commands, 0.0)
    now, _ = settle(rec, workers, 10.0)
    (decode_on,) = where(workers, "hot", D, Pool.ELASTIC)
    (tail_on,) = where(workers, "tail", C, Pool.ELASTIC)
    return rec, workers, now, decode_on, tail_on


def test_a_steady_claim_on_a_device_whose_elastic_instance_has_no_room_elsewhere_does_not_deadlock():
    rec, workers, now, decode_on, tail_on = _hot_split_and_tail(["w0", "w1", "w2"])
    # The steady plan packs `tail` onto the device of hot's decode instance; the elastic plan keeps hot at (1, 1).
    # No device is free: hot's new decode instance can only go where tail's elastic instance now is, which leaves
    # once tail's steady instance is up, which needs hot's decode instance gone.
    plans_ms = now
    effects = [rec.on_steady_plan(now, steady("s1", {decode_on: ("tail",)})),
               rec.on_elastic_plan(now, elastic("e2", {"hot": (1, 1)}))]
    sent = run_all(rec, workers, [c for e in effects for c in e.commands], now)
    now, more = settle(rec, workers, now + 100.0)
    sent += more
    assert where(workers, "tail", C, Pool.STEADY) == [decode_on], "the steady plan got its device"
    assert where(workers, "tail", C, Pool.ELASTIC) == [], "tail's old elastic instance left"
    assert where(workers, "hot", D, Pool.ELASTIC) == [tail_on], "hot's decode instance came back on the freed device"
    assert len(where(workers, "hot", P, Pool.ELASTIC)) == 1
    # in that order: hot's old decode instance went first (nothing could replace it before), then tail moved
    order = [(c.model, c.role, c.worker_id, c.action in UP) for c in sent]
    assert order.index(("hot", D, decode_on, False)) < order.index(("tail", C, decode_on, True)) \
        < order.index(("tail", C, tail_on, False)) < order.index(("hot", D, tail_on, True))
    (gone,) = [c for c in sent if (c.model, c.role, c.worker_id, c.action in UP) == ("hot", D, decode_on, False)]
    assert gone.issued_unix_ms - plans_ms >= POLICY.no_room_wait_ms, "not before the wait: a plan may free a device"
    assert rec.is_done("s1") and rec.is_done("e2")


def test_with_room_elsewhere_the_claimed_instance_stays_until_its_replacement_is_ready():
    rec, workers, now, decode_on, tail_on = _hot_split_and_tail(["w0", "w1", "w2", "w3"])
    (spare,) = [w for w in workers.instances if not any(workers.instances[w].values())]
    heartbeats(rec, workers, now)
    effects = [rec.on_steady_plan(now, steady("s1", {decode_on: ("tail",)})),
               rec.on_elastic_plan(now, elastic("e2", {"hot": (1, 1)}))]
    sent = [c for e in effects for c in e.commands]
    ups = [c for c in sent if c.action in UP]
    assert [(c.model, c.role, c.worker_id) for c in ups] == [("hot", D, spare)], "the replacement goes first"
    assert not [c for c in sent if c.action not in UP], "make before break: nothing removed yet"
    heartbeats(rec, workers, now + 50.0)
    assert not [c for c in rec.on_tick(now + 50.0).commands if c.action not in UP], "still not before it is ready"
    converge(rec, workers, ups, now + 100.0)
    now, _ = settle(rec, workers, now + 200.0)
    assert where(workers, "hot", D, Pool.ELASTIC) == [spare]
    assert where(workers, "tail", C, Pool.STEADY) == [decode_on]
    assert where(workers, "tail", C, Pool.ELASTIC) == []


def test_a_model_handed_to_the_elastic_pool_with_no_free_device_gives_up_its_steady_device():
    rec, workers = boot(["w0"])
    converge(rec, workers, rec.on_steady_plan(0.0, steady("s1", {"w0": ("m",)})).commands, 0.0)
    now, _ = settle(rec, workers, 10.0)
    # m goes elastic and x takes its device; the only device is w0: m's elastic instance can only follow m's
    # steady one out of it (before the fix, m's steady instance waited for an elastic replica that had no device)
    effects = [rec.on_steady_plan(now, steady("s2", {"w0": ("x",)}).model_copy(update={"elastic_models": ("m",)})),
               rec.on_elastic_plan(now, elastic("e1", {"m": (1, 0)}))]
    converge(rec, workers, [c for e in effects for c in e.commands], now)
    now, _ = settle(rec, workers, now + 100.0)
    assert where(workers, "x", C, Pool.STEADY) == ["w0"]
    assert where(workers, "m", C, Pool.STEADY) == []


def test_while_a_removal_frees_a_device_the_claimed_instance_waits_for_its_replacement_there():
    rec, workers = boot(["w0", "w1", "w2", "w3"])
    plan = elastic("e1", {"hot": (1, 1), "tail": (1, 0), "idle": (1, 0)})
    converge(rec, workers, rec.on_elastic_plan(0.0, plan).commands, 0.0)
    now, _ = settle(rec, workers, 10.0)
    (decode_on,) = where(workers, "hot", D, Pool.ELASTIC)
    (idle_on,) = where(workers, "idle", C, Pool.ELASTIC)
    # No device is free, but `idle` leaves (count 0): its device is on its way to free, so hot's decode instance on
    # the claimed device keeps serving until its replacement is up there
    effects = [rec.on_steady_plan(now, steady("s1", {decode_on: ("tail",)})),
               rec.on_elastic_plan(now, elastic("e2", {"hot": (1, 1), "idle": (0, 0)}))]
    first = [(c.model, c.action) for e in effects for c in e.commands]
    assert first == [("idle", LifecycleAction.WARM)], first
    sent = run_all(rec, workers, [c for e in effects for c in e.commands], now)
    now, more = settle(rec, workers, now + 100.0)
    order = [(c.model, c.role, c.worker_id, c.action in UP) for c in [*sent, *more]]
    assert order.index(("hot", D, idle_on, True)) < order.index(("hot", D, decode_on, False)), "make before break"
    assert where(workers, "hot", D, Pool.ELASTIC) == [idle_on]
    assert where(workers, "tail", C, Pool.STEADY) == [decode_on]
    assert where(workers, "tail", C, Pool.ELASTIC) == []

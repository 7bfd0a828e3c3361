"""Random event sequences against DispatcherCore (hypothesis state machine): nothing is ever sent to an instance
that is not ready, every request is in exactly one place, and the EPDT bookkeeping stays consistent."""
from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from contracts import ErrorCode, InstanceRecord, InstanceRole, ModelState
from dispatcher.core import (
    Algorithm,
    Assign,
    DispatchPolicy,
    DispatcherCore,
    OverloadPolicy,
    PublishLoad,
    Reject,
    Relaxed,
    Requeued,
    ThroughputPrefillModel,
)

from .helpers import TOKENS_PER_S, record, request

# instance id -> (model, role)
INSTANCES = {
    "c0": ("m", InstanceRole.COLOCATED),
    "c1": ("m", InstanceRole.COLOCATED),
    "p0": ("m", InstanceRole.PREFILL),
    "d0": ("m", InstanceRole.DECODE),
    "x0": ("n", InstanceRole.COLOCATED),
}
MODELS = ("m", "n", "z")  # z never has an instance
STATES = ("ready", "waking", "draining", "failed", "absent")


class DispatcherMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.core: DispatcherCore | None = None
        self.now = 0.0
        self.records: dict[str, InstanceRecord] = {}
        self.banned_at: dict[str, float] = {}
        self.state: dict[str, str] = {}  # request -> queued | inflight | done | rejected | cancelled
        self.where: dict[str, str] = {}  # inflight request -> instance
        self.num_requests = 0

    @initialize(
        algorithm=st.sampled_from(list(Algorithm)),
        overload=st.sampled_from(list(OverloadPolicy)),
        is_work_conserving=st.booleans(),
        max_num_attempts=st.integers(1, 3),
    )
    def setup(self, algorithm, overload, is_work_conserving, max_num_attempts):
        policy = DispatchPolicy(algorithm=algorithm, overload=overload, is_work_conserving=is_work_conserving,
                                max_num_attempts=max_num_attempts, publish_period_ms=400.0)
        self.core = DispatcherCore(policy, ThroughputPrefillModel(TOKENS_PER_S))

    # ------------------------------------------------------------------ the mirror of "routable"
    def is_routable(self, instance_id: str) -> bool:
        r = self.records.get(instance_id)
        return (r is not None and r.is_ready and r.state == ModelState.ACTIVE and instance_id not in self.banned_at)

    def has_decode(self, model: str) -> bool:
        return any(self.is_routable(i) and m == model and role == InstanceRole.DECODE
                   for i, (m, role) in INSTANCES.items())

    def inflight_at(self, instance_id: str) -> set[str]:
        return {rid for rid, iid in self.where.items() if iid == instance_id and self.state[rid] == "inflight"}

    def apply(self, effects) -> None:
        for e in effects:
            if isinstance(e, Assign):
                assert self.state.get(e.request_id) == "queued", (e, self.state.get(e.request_id))
                model, role = INSTANCES[e.instance_id]
                assert self.is_routable(e.instance_id), f"assigned to a non-ready instance: {e}"
                assert model == e.model
                assert role in (InstanceRole.COLOCATED, InstanceRole.PREFILL)
                if role == InstanceRole.PREFILL:
                    assert e.decode_instance_id is not None and self.is_routable(e.decode_instance_id)
                    assert INSTANCES[e.decode_instance_id] == (model, InstanceRole.DECODE)
                else:
                    assert e.decode_instance_id is None
                assert e.predicted_prefill_ms > 0 and e.expected_done_ms >= self.now
                self.state[e.request_id] = "inflight"
                self.where[e.request_id] = e.instance_id
            elif isinstance(e, Requeued):
                assert self.state.get(e.request_id) == "inflight" and self.where[e.request_id] == e.instance_id
                self.state[e.request_id] = "queued"
                del self.where[e.request_id]
            elif isinstance(e, Reject):
                if e.code in (ErrorCode.INSTANCE_FAILED, ErrorCode.POISON_REQUEST):  # lost where it ran
                    assert self.state.get(e.request_id) == "inflight"
                    del self.where[e.request_id]
                else:
                    assert e.code in (ErrorCode.OVERLOADED, ErrorCode.NO_INSTANCE)
                    assert self.state.get(e.request_id) == "queued"
                self.state[e.request_id] = "rejected"
            elif isinstance(e, Relaxed):
                assert self.state.get(e.request_id) == "queued"
                assert self.core.policy.overload == OverloadPolicy.REQUEUE
            else:
                assert isinstance(e, PublishLoad)

    # ------------------------------------------------------------------ events
    @rule(states=st.lists(st.sampled_from(STATES), min_size=len(INSTANCES), max_size=len(INSTANCES)),
          is_stale=st.booleans())
    def registry(self, states, is_stale):
        updated_ms = self.now - 100.0 if is_stale else self.now
        records = []
        for (iid, (model, role)), state in zip(INSTANCES.items(), states):
            if state == "absent":
                continue
            model_state = {"ready": ModelState.ACTIVE, "waking": ModelState.WAKING,
                           "draining": ModelState.DRAINING, "failed": ModelState.FAILED}[state]
            records.append(record(iid, model=model, role=role, is_ready=state == "ready", state=model_state,
                                  updated_ms=updated_ms))
        new = {r.instance_id: r for r in records}
        for iid, at in list(self.banned_at.items()):
            r = new.get(iid)
            if r is None or not r.is_ready or r.state != ModelState.ACTIVE or r.updated_unix_ms > at:
                del self.banned_at[iid]  # the registry caught up with the loss
        self.records = new
        self.apply(self.core.on_instances(self.now, records))

    @rule(tokens=st.integers(1, 12_000), slo_ms=st.sampled_from([200.0, 1000.0, 3000.0]),
          model=st.sampled_from(MODELS))
    def arrive(self, tokens, slo_ms, model):
        rid = f"r{self.num_requests}"
        self.num_requests += 1
        self.state[rid] = "queued"
        self.apply(self.core.on_request(self.now, request(rid, self.now, tokens=tokens, slo_ms=slo_ms, model=model)))

    @rule(dt_ms=st.floats(0.0, 400.0))
    def advance(self, dt_ms):
        self.now += dt_ms

    @rule()
    def tick(self):
        wake = self.core.next_wakeup_ms()
        if wake is not None and wake > self.now:
            self.now = wake
        self.apply(self.core.on_tick(self.now))

    @precondition(lambda self: any(s == "inflight" for s in self.state.values()))
    @rule(data=st.data(), ok=st.booleans())
    def prefill_done(self, data, ok):
        rid = data.draw(st.sampled_from(sorted(r for r, s in self.state.items() if s == "inflight")))
        iid = self.where[rid]
        if ok:
            self.state[rid] = "done"
            del self.where[rid]
        effects = self.core.on_prefill_done(self.now, iid, rid, ok)
        self.apply(effects)
        if not ok:
            assert self.state[rid] in ("queued", "inflight", "rejected")  # retried or out of attempts

    @precondition(lambda self: any(s == "done" for s in self.state.values()))
    @rule(data=st.data())
    def stale_report(self, data):
        rid = data.draw(st.sampled_from(sorted(r for r, s in self.state.items() if s == "done")))
        assert not [e for e in self.core.on_prefill_done(self.now, "c0", rid) if not isinstance(e, PublishLoad)]

    @precondition(lambda self: any(s in ("queued", "inflight") for s in self.state.values()))
    @rule(data=st.data())
    def cancel(self, data):
        rid = data.draw(st.sampled_from(sorted(r for r, s in self.state.items() if s in ("queued", "inflight"))))
        self.state[rid] = "cancelled"
        self.where.pop(rid, None)
        self.apply(self.core.on_cancel(self.now, rid))

    @rule(instance_id=st.sampled_from(sorted(INSTANCES)))
    def lose(self, instance_id):
        self.banned_at[instance_id] = self.now
        self.apply(self.core.on_instance_lost(self.now, instance_id))

    # ------------------------------------------------------------------ invariants
    @invariant()
    def every_request_is_in_exactly_one_place(self):
        if self.core is None:
            return
        queued = {rid for rid, s in self.state.items() if s == "queued"}
        core_queued = [rid for model in MODELS for rid in self.core.queued_ids(model)]
        assert len(core_queued) == len(set(core_queued))
        assert set(core_queued) == queued
        assert set(self.core.inflight_ids()) == {rid for rid, s in self.state.items() if s == "inflight"}
        for iid in INSTANCES:
            assert set(self.core.outstanding(iid)) == self.inflight_at(iid)

    @invariant()
    def epdt_bounds_hold(self):
        if self.core is None:
            return
        for iid in INSTANCES:
            epdt = self.core.epdt_ms(iid)
            if epdt is None:
                continue
            pending = self.core.pending_prefill_ms(iid)
            available = max(self.now, epdt)
            assert available <= self.now + pending + 1e-6
            if not self.core.outstanding(iid):
                assert available == self.now

    @invariant()
    def wakeups_are_finite(self):
        if self.core is not None:
            wake = self.core.next_wakeup_ms()
            assert wake is None or wake == wake and wake != float("inf")


TestDispatcherMachine = DispatcherMachine.TestCase
TestDispatcherMachine.settings = settings(max_examples=40, stateful_step_count=30, deadline=None,
                                          suppress_health_check=[HealthCheck.too_slow])

"""Recording of core inputs and decisions, and their replay: the seam for "the simulator and the live system make
the same decisions on a recorded scenario".

Format: JSON lines. The first line is a header {"kind": "janus-recording", "version": 1, "config": {...}} with what
rebuilding the cores needs (dispatch policy, prefill-time model, planner policies). Every other line is one call
into a core, in the order it was made:

    {"seq": n, "core": "dispatcher/<model>" | "steady" | "elastic" | "oracle",
     "call": "<method>", "args": {...}, "decision": {...}}

- dispatcher calls: on_request(now_ms, request), on_instances(now_ms, records), on_prefill_done(now_ms,
  instance_id, request_id, ok, first_token_ms), on_heartbeat(now_ms, heartbeat), on_tick(now_ms),
  on_request_outcome(now_ms, request_id, model, num_output_tokens, num_on_time_tokens); the decision is
  the list of effects reduced to what routing decided: assign (request, instance, decode instance, late) and
  reject (request, code). Load windows published are inputs of the planners, recorded there.
- planner calls: observe(window), plan(now_ms, models, worker_ids, trigger) with the plan's bins and pools as its
  decision, tick(now_ms, elastic_models, budget_devices) with its targets.
- oracle replies are recorded as inputs of the planners ("oracle" lines carry query and reply), so a replay does not
  depend on a fitted model: it answers from the recording in order.

`SystemRun(..., record=True)` records a simulated run. The live services do not record yet: a shell would wrap its
core with `RecordingDispatcher` / `RecordingPlanner` and its oracle client with `RecordingOracle` (docs/sim.md,
"Recording and replay"). `replay` feeds any recording to fresh cores and reports every decision that differs."""
from __future__ import annotations

import dataclasses
import json
from collections import deque
from pathlib import Path
from typing import Any

from contracts import (CapacityQuery, CapacityReply, ElasticityQuery, ElasticityReply, InstanceRecord,
                       ModelLoadWindow, WorkerHeartbeat)
from dispatcher.core import Assign, DispatchPolicy, DispatchRequest, Reject
from dispatcher.core.effects import MoveDecodes

VERSION = 1


class Recorder:
    """Collects lines in memory; `write` saves them."""

    def __init__(self, config: dict):
        self.header = {"kind": "janus-recording", "version": VERSION, "config": config}
        self.lines: list[dict] = []

    def add(self, core: str, call: str, args: dict, decision: Any = None) -> None:
        self.lines.append({"seq": len(self.lines), "core": core, "call": call, "args": args, "decision": decision})

    def write(self, path: Path) -> None:
        with open(path, "w") as handle:
            handle.write(json.dumps(self.header) + "\n")
            for line in self.lines:
                handle.write(json.dumps(line) + "\n")


def read(path: Path) -> tuple[dict, list[dict]]:
    with open(path) as handle:
        header = json.loads(handle.readline())
        if header.get("kind") != "janus-recording" or header.get("version") != VERSION:
            raise ValueError(f"{path}: not a janus recording of version {VERSION}")
        return header, [json.loads(line) for line in handle if line.strip()]


# ---------------------------------------------------------------------------------------------- decisions
def routing_decisions(effects) -> list[list]:
    out = []
    for e in effects:
        if isinstance(e, Assign):
            out.append(["assign", e.request_id, e.instance_id, e.decode_instance_id, e.is_late])
        elif isinstance(e, Reject):
            out.append(["reject", e.request_id, e.code.value])
        elif isinstance(e, MoveDecodes):
            out.append(["move", e.instance_id, e.target_instance_id, e.max_requests])
    return out


def steady_decision(plan) -> dict:
    return {"bins": {b.worker_id: list(b.models) for b in plan.bins}, "steady": list(plan.steady_models),
            "elastic": list(plan.elastic_models)}


def elastic_decision(plan) -> dict:
    return {t.model: [t.num_prefill, t.num_decode] for t in plan.targets}


def reconcile_decision(effects) -> list[list]:
    """The commands a reconciliation sent: instance, action, worker, the group's other devices, fork source."""
    return [[c.instance_id, c.action.value, c.worker_id, list(c.peer_worker_ids),
             c.fork_source.instance_id if c.fork_source else None] for c in effects.commands]


def _request_args(request: DispatchRequest) -> dict:
    d = dataclasses.asdict(request)
    d.pop("source", None)
    return d


# ---------------------------------------------------------------------------------------------- wrappers
class RecordingDispatcher:
    """Wraps a DispatcherCore: same methods, each call and its routing decisions recorded."""

    def __init__(self, core, recorder: Recorder, name: str):
        self.core = core
        self.recorder = recorder
        self.name = f"dispatcher/{name}"

    def __getattr__(self, attr):
        return getattr(self.core, attr)

    def on_request(self, now_ms: float, request: DispatchRequest):
        effects = self.core.on_request(now_ms, request)
        self.recorder.add(self.name, "on_request", {"now_ms": now_ms, "request": _request_args(request)},
                          routing_decisions(effects))
        return effects

    def on_instances(self, now_ms: float, records):
        records = list(records)
        effects = self.core.on_instances(now_ms, records)
        self.recorder.add(self.name, "on_instances",
                          {"now_ms": now_ms, "records": [r.model_dump(mode="json") for r in records]},
                          routing_decisions(effects))
        return effects

    def on_prefill_done(self, now_ms: float, instance_id: str, request_id: str, ok: bool = True,
                        first_token_ms: float | None = None):
        effects = self.core.on_prefill_done(now_ms, instance_id, request_id, ok, first_token_ms)
        self.recorder.add(self.name, "on_prefill_done",
                          {"now_ms": now_ms, "instance_id": instance_id, "request_id": request_id, "ok": ok,
                           "first_token_ms": first_token_ms}, routing_decisions(effects))
        return effects

    def on_heartbeat(self, now_ms: float, heartbeat: WorkerHeartbeat):
        effects = self.core.on_heartbeat(now_ms, heartbeat)
        self.recorder.add(self.name, "on_heartbeat", {"now_ms": now_ms, "heartbeat": _heartbeat_args(heartbeat)},
                          routing_decisions(effects))
        return effects

    def on_tick(self, now_ms: float):
        effects = self.core.on_tick(now_ms)
        self.recorder.add(self.name, "on_tick", {"now_ms": now_ms}, routing_decisions(effects))
        return effects

    def on_request_outcome(self, now_ms: float, request_id: str, model: str, num_output_tokens: int,
                           num_on_time_tokens: int):
        # an input of routing too: the finished request leaves its instance's decode backlog
        effects = self.core.on_request_outcome(now_ms, request_id, model, num_output_tokens, num_on_time_tokens)
        self.recorder.add(self.name, "on_request_outcome",
                          {"now_ms": now_ms, "request_id": request_id, "model": model,
                           "num_output_tokens": num_output_tokens, "num_on_time_tokens": num_on_time_tokens},
                          routing_decisions(effects))
        return effects


def _heartbeat_args(hb: WorkerHeartbeat) -> dict:
    # only what decode routing and co-located tie-breaking read (the simulator builds partial heartbeats with
    # model_construct)
    return {"worker_id": hb.worker_id, "sent_unix_ms": hb.sent_unix_ms,
            "instances": [{"instance_id": s.instance_id, "model": s.model, "role": s.role.value,
                           "pool": s.pool.value, "state": s.state.value, "num_waiting": s.num_waiting,
                           "num_running": s.num_running, "decode_tokens_per_s": s.decode_tokens_per_s}
                          for s in hb.instances]}


class RecordingOracle:
    """Wraps an OracleLike: every query and reply recorded (replies are inputs of the planners)."""

    def __init__(self, oracle, recorder: Recorder):
        self.oracle = oracle
        self.recorder = recorder

    def capacity(self, query: CapacityQuery) -> CapacityReply:
        reply = self.oracle.capacity(query)
        self.recorder.add("oracle", "capacity", {"query": query.model_dump(mode="json"),
                                                 "reply": reply.model_dump(mode="json")})
        return reply

    def elasticity(self, query: ElasticityQuery) -> ElasticityReply:
        reply = self.oracle.elasticity(query)
        self.recorder.add("oracle", "elasticity", {"query": query.model_dump(mode="json"),
                                                   "reply": reply.model_dump(mode="json")})
        return reply


class RecordingPlanner:
    """Wraps a SteadyPlanner ("steady") or an ElasticScaler ("elastic")."""

    def __init__(self, planner, recorder: Recorder, kind: str):
        if kind not in ("steady", "elastic"):
            raise ValueError("kind is steady or elastic")
        self.planner = planner
        self.recorder = recorder
        self.kind = kind

    def __getattr__(self, attr):
        return getattr(self.planner, attr)

    def observe(self, window: ModelLoadWindow) -> None:
        self.planner.observe(window)
        self.recorder.add(self.kind, "observe", {"window": window.model_dump(mode="json")})

    def plan(self, now_ms: float, models, worker_ids, trigger: str = "periodic"):
        decision = self.planner.plan(now_ms, models, worker_ids, trigger)
        self.recorder.add("steady", "plan", {"now_ms": now_ms, "models": list(models),
                                             "worker_ids": list(worker_ids), "trigger": trigger},
                          steady_decision(decision.plan))
        return decision

    def tick(self, now_ms: float, elastic_models, budget_devices: int, *, devices_per_instance=None,
             in_flight=None, decode_kv=None):
        decision = self.planner.tick(now_ms, elastic_models, budget_devices,
                                     devices_per_instance=devices_per_instance, in_flight=in_flight,
                                     decode_kv=decode_kv)
        self.recorder.add("elastic", "tick", {"now_ms": now_ms, "models": list(elastic_models),
                                              "budget_devices": budget_devices,
                                              "devices_per_instance": dict(devices_per_instance or {}),
                                              "in_flight": dict(in_flight or {}),
                                              "decode_kv": {m: list(kv) for m, kv in (decode_kv or {}).items()}},
                          elastic_decision(decision.plan))
        return decision

    def wake(self, now_ms: float, budget_devices: int):
        plan = self.planner.wake(now_ms, budget_devices)
        self.recorder.add("elastic", "wake", {"now_ms": now_ms, "budget_devices": budget_devices},
                          None if plan is None else elastic_decision(plan))
        return plan


class RecordingReconciler:
    """Wraps a planner.core.Reconciler: every input (plans, heartbeats, records, replies, ticks) recorded, and the
    commands each reconciliation sent. A heartbeat that is the worker's last one again (liveness only) is recorded
    as such, without its body."""

    def __init__(self, core, recorder: Recorder):
        self.core = core
        self.recorder = recorder
        self._last: dict[str, object] = {}

    def __getattr__(self, attr):
        return getattr(self.core, attr)

    def _effects(self, call: str, args: dict, effects):
        self.recorder.add("reconciler", call, args, reconcile_decision(effects))
        return effects

    def on_steady_plan(self, now_ms: float, plan):
        return self._effects("on_steady_plan", {"now_ms": now_ms, "plan": plan.model_dump(mode="json")},
                             self.core.on_steady_plan(now_ms, plan))

    def on_elastic_plan(self, now_ms: float, plan):
        return self._effects("on_elastic_plan", {"now_ms": now_ms, "plan": plan.model_dump(mode="json")},
                             self.core.on_elastic_plan(now_ms, plan))

    def on_tick(self, now_ms: float):
        return self._effects("on_tick", {"now_ms": now_ms}, self.core.on_tick(now_ms))

    def observe_heartbeat(self, now_ms: float, hb) -> None:
        self.core.observe_heartbeat(now_ms, hb)
        if self._last.get(hb.worker_id) is hb:
            self.recorder.add("reconciler", "observe_heartbeat", {"now_ms": now_ms, "same_as_last": hb.worker_id})
            return
        self._last[hb.worker_id] = hb
        self.recorder.add("reconciler", "observe_heartbeat", {"now_ms": now_ms, "heartbeat": hb.model_dump(mode="json")})

    def observe_alive(self, now_ms: float, worker_ids) -> None:
        worker_ids = list(worker_ids)
        self.core.observe_alive(now_ms, worker_ids)
        self.recorder.add("reconciler", "observe_alive", {"now_ms": now_ms, "worker_ids": worker_ids})

    def observe_record(self, record) -> None:
        self.core.observe_record(record)
        self.recorder.add("reconciler", "observe_record", {"record": record.model_dump(mode="json")})

    def observe_record_deleted(self, instance_id: str) -> None:
        self.core.observe_record_deleted(instance_id)
        self.recorder.add("reconciler", "observe_record_deleted", {"instance_id": instance_id})

    def observe_reply(self, now_ms: float, reply) -> None:
        self.core.observe_reply(now_ms, reply)
        self.recorder.add("reconciler", "observe_reply", {"now_ms": now_ms, "reply": reply.model_dump(mode="json")})


# ---------------------------------------------------------------------------------------------- replay
class ReplayOracle:
    """Answers the planners from the recorded replies, in order; a query that differs from the recorded one is
    itself a divergence."""

    def __init__(self, lines: list[dict]):
        self._queue = deque(line for line in lines if line["core"] == "oracle")
        self.mismatches: list[str] = []

    def _next(self, call: str, query) -> dict:
        if not self._queue:
            raise LookupError(f"replay asked the oracle for {call} beyond the recording")
        line = self._queue.popleft()
        if line["call"] != call or line["args"]["query"] != query.model_dump(mode="json"):
            self.mismatches.append(f"oracle #{line['seq']}: {call} query differs from the recording")
        return line["args"]["reply"]

    def capacity(self, query: CapacityQuery) -> CapacityReply:
        return CapacityReply.model_validate(self._next("capacity", query))

    def elasticity(self, query: ElasticityQuery) -> ElasticityReply:
        return ElasticityReply.model_validate(self._next("elasticity", query))


@dataclasses.dataclass
class ReplayReport:
    num_calls: int
    num_decisions: int
    mismatches: list[str]

    @property
    def is_identical(self) -> bool:
        return not self.mismatches


def replay(header: dict, lines: list[dict], prefill_time=None) -> ReplayReport:
    """Feed every recorded input to fresh cores built from the header; compare each decision with the recorded
    one. `prefill_time`: the dispatcher's PrefillTimeModel (default: rebuilt from the header)."""
    from dispatcher.core import DispatcherCore
    from planner.core import DecodeKV, ElasticScaler, PlannerPolicy, Reconciler, SteadyPlanner

    config = header["config"]
    policy = DispatchPolicy.model_validate(config["dispatch_policy"])
    prefill_time = prefill_time or prefill_time_from_config(config["prefill_time"])
    oracle = ReplayOracle(lines)
    planner = PlannerPolicy.model_validate(config.get("planner_policy", {}))
    steady = SteadyPlanner(oracle, planner.steady, planner.pool)
    scaler = ElasticScaler(oracle, planner.elastic)
    reconciler = Reconciler(planner.reconciler)
    heartbeats: dict[str, WorkerHeartbeat] = {}
    cores: dict[str, DispatcherCore] = {}
    mismatches: list[str] = []
    num_decisions = 0
    for line in lines:
        core, call, args = line["core"], line["call"], line["args"]
        got: Any = None
        if core.startswith("dispatcher/"):
            d = cores.setdefault(core, DispatcherCore(policy, prefill_time, dispatcher_id=core))
            if call == "on_request":
                got = routing_decisions(d.on_request(args["now_ms"], DispatchRequest(**args["request"])))
            elif call == "on_instances":
                records = [InstanceRecord.model_validate(r) for r in args["records"]]
                got = routing_decisions(d.on_instances(args["now_ms"], records))
            elif call == "on_prefill_done":
                got = routing_decisions(d.on_prefill_done(args["now_ms"], args["instance_id"], args["request_id"],
                                                          args["ok"], args["first_token_ms"]))
            elif call == "on_heartbeat":
                got = routing_decisions(d.on_heartbeat(args["now_ms"], _heartbeat(args["heartbeat"])))
            elif call == "on_tick":
                got = routing_decisions(d.on_tick(args["now_ms"]))
            elif call == "on_request_outcome":
                got = routing_decisions(d.on_request_outcome(**args))
            else:
                raise ValueError(f"line {line['seq']}: unknown dispatcher call {call!r}")
        elif core in ("steady", "elastic") and call == "observe":
            (steady if core == "steady" else scaler).observe(ModelLoadWindow.model_validate(args["window"]))
            continue
        elif core == "steady" and call == "plan":
            got = steady_decision(steady.plan(args["now_ms"], args["models"], args["worker_ids"],
                                              args["trigger"]).plan)
        elif core == "elastic" and call == "tick":
            got = elastic_decision(scaler.tick(args["now_ms"], args["models"], args["budget_devices"],
                                               devices_per_instance=args.get("devices_per_instance"),
                                               in_flight=args.get("in_flight"),
                                               decode_kv={m: DecodeKV(*kv) for m, kv in
                                                          args.get("decode_kv", {}).items()}).plan)
        elif core == "elastic" and call == "wake":
            woken = scaler.wake(args["now_ms"], args["budget_devices"])
            got = None if woken is None else elastic_decision(woken)
        elif core == "reconciler":
            got = _replay_reconciler(reconciler, heartbeats, call, args)
            if got is None:
                continue
        elif core == "oracle":
            continue
        else:
            raise ValueError(f"line {line['seq']}: unknown core/call {core}/{call}")
        num_decisions += 1
        if got != line["decision"]:
            mismatches.append(f"#{line['seq']} {core}.{call}: recorded {line['decision']!r}, replayed {got!r}")
    return ReplayReport(len(lines), num_decisions, mismatches + oracle.mismatches)


def _replay_reconciler(reconciler, heartbeats: dict, call: str, args: dict) -> list | None:
    """One recorded reconciler call on a fresh core: the commands it sends, or None for an input without a
    decision."""
    from contracts import ElasticPlan, LifecycleReply, SteadyPlan

    if call == "observe_alive":
        reconciler.observe_alive(args["now_ms"], args["worker_ids"])
    elif call == "observe_heartbeat":
        if "same_as_last" in args:
            hb = heartbeats[args["same_as_last"]]
        else:
            hb = WorkerHeartbeat.model_validate(args["heartbeat"])
            heartbeats[hb.worker_id] = hb
        reconciler.observe_heartbeat(args["now_ms"], hb)
    elif call == "observe_record":
        reconciler.observe_record(InstanceRecord.model_validate(args["record"]))
    elif call == "observe_record_deleted":
        reconciler.observe_record_deleted(args["instance_id"])
    elif call == "observe_reply":
        reconciler.observe_reply(args["now_ms"], LifecycleReply.model_validate(args["reply"]))
    elif call == "on_steady_plan":
        return reconcile_decision(reconciler.on_steady_plan(args["now_ms"], SteadyPlan.model_validate(args["plan"])))
    elif call == "on_elastic_plan":
        return reconcile_decision(reconciler.on_elastic_plan(args["now_ms"],
                                                             ElasticPlan.model_validate(args["plan"])))
    elif call == "on_tick":
        return reconcile_decision(reconciler.on_tick(args["now_ms"]))
    else:
        raise ValueError(f"unknown reconciler call {call!r}")
    return None


def _heartbeat(args: dict) -> WorkerHeartbeat:
    from contracts import InstanceRole, InstanceStatus, ModelState, Pool

    statuses = tuple(InstanceStatus.model_construct(
        instance_id=s["instance_id"], model=s["model"], role=InstanceRole(s["role"]), pool=Pool(s["pool"]),
        state=ModelState(s["state"]), num_waiting=s["num_waiting"], num_running=s["num_running"],
        decode_tokens_per_s=s.get("decode_tokens_per_s"))
        for s in args["instances"])
    return WorkerHeartbeat.model_construct(worker_id=args["worker_id"], seq=0, sent_unix_ms=args["sent_unix_ms"],
                                           instances=statuses)


def prefill_time_from_config(config: dict):
    """The dispatcher's prefill-time model from a recording header: "roofline" (the simulator's: device, and per
    model its shape and tp) or "throughput" (the service's ThroughputPrefillModel arguments)."""
    from dispatcher.core import ThroughputPrefillModel

    if config["kind"] == "throughput":
        return ThroughputPrefillModel(config["default_tokens_per_s"], overhead_ms=config.get("overhead_ms", 0.0),
                                      tokens_per_s_by_model=config.get("tokens_per_s_by_model"))
    if config["kind"] == "roofline":
        from oracle.specs import device, model_shape

        from .costmodel import step_cost
        from .dispatch import SimPrefillTime

        dev = device(config["device"])
        return SimPrefillTime({name: step_cost(dev, model_shape(m["shape"]), m["tp"])
                               for name, m in config["models"].items()})
    raise ValueError(f"unknown prefill-time model {config['kind']!r}")

"""Moving running decodes off a draining decode instance in the simulator: the dispatcher core orders the moves
from heartbeats (dispatcher/core/moves.py), the simulated engine takes the decodes out at a step boundary, their KV
crosses the link, and the target continues them; every token is scored once, on the instance that emitted it."""
import math

from dispatcher.core import DispatchPolicy
from oracle.roofline import RooflineModel
from oracle.specs import device, model_shape
from sim.costmodel import StepCost
from sim.dispatch import CoreDispatch
from sim.event_loop import Sim
from sim.recording import Recorder, replay
from sim.requests import RequestTable
from sim.trace import Trace

DEV = device("nvidia-h200")
COST = StepCost(RooflineModel(DEV, model_shape("qwen2-7b"), 1))  # ~4.5 ms a decode step: 2,000 tokens ~9 s
NUM = 12  # long decodes, on two decode instances


def _run(moves: bool, tpot_s: float = 0.05, recorder=None):
    trace = Trace.build([0.001 * k for k in range(NUM)], [0] * NUM, [300] * NUM, [2000 + 10 * k for k in range(NUM)],
                        ("m",))
    table = RequestTable(trace, [2.0], [tpot_s])
    sim = Sim(table, 3, DEV.hbm_bytes * 0.9, DEV.d2d_bytes_per_s)
    CoreDispatch(sim, ("m",), [COST], _policy(moves), recorder=recorder)
    sim.launch(0, "prefill", "elastic", (0,), COST, 0.0)
    source = sim.launch(0, "decode", "elastic", (1,), COST, 0.0)
    target = sim.launch(0, "decode", "elastic", (2,), COST, 0.0)
    sim.at(2.0, lambda t: sim.drain(source, t))
    sim.run()
    removed = {iid: t for t, iid, what, _ in sim.lifecycle_log if what == "removed"}
    return sim, table, source, target, removed


def _policy(moves: bool) -> DispatchPolicy:
    return DispatchPolicy(moves_draining_decodes=moves, move_after_draining_ms=1000.0)


def test_a_draining_decode_instance_hands_its_decodes_over_and_leaves_early():
    sim, table, source, target, removed = _run(moves=True)
    assert sim.num_decodes_moved == NUM // 2  # the source held half of them
    last_finish = max(table.finish_s)
    # drained at 2 s, moved after a second of draining (and a heartbeat): the source left then, not at the end
    assert 3.0 <= removed[source.instance_id] < 4.0 < last_finish
    assert not any(math.isnan(t) for t in table.finish_s)
    # a generous TPOT: every token on time, counted once, wherever it was emitted
    assert list(table.num_on_time) == list(table.output_tokens)


def test_without_the_knob_the_source_decodes_to_the_end():
    sim, table, source, _, removed = _run(moves=False)
    assert sim.num_decodes_moved == 0
    assert removed[source.instance_id] > 0.9 * max(table.finish_s)  # its longest decode ran to its end there
    assert list(table.num_on_time) == list(table.output_tokens)


def test_a_target_near_its_tpot_takes_nothing():
    # a TPOT SLO the target's step already uses more than 0.6 of: no room, no move
    step_s = COST.decode_s(NUM // 2, NUM // 2 * 2300)
    sim, table, source, _, removed = _run(moves=True, tpot_s=step_s * 1.5)
    assert sim.num_decodes_moved == 0
    assert removed[source.instance_id] > 4.0


def test_the_moves_are_recorded_and_replayed():
    """The dispatcher's orders come from heartbeats (with the decode rates they carry): recorded, and made again by a
    fresh core fed the same inputs."""
    recorder = Recorder({"dispatch_policy": _policy(True).model_dump(mode="json"), "prefill_time": {
        "kind": "roofline", "device": "nvidia-h200", "models": {"m": {"shape": "qwen2-7b", "tp": 1}}}})
    sim, *_ = _run(moves=True, recorder=recorder)
    ordered = [line for line in recorder.lines if any(d[0] == "move" for d in line.get("decision") or [])]
    assert ordered and sum(d[3] for line in ordered for d in line["decision"]) == sim.num_decodes_moved
    report = replay(recorder.header, recorder.lines)
    assert report.is_identical, report.mismatches[:5]

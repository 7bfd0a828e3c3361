"""The recording format and its replay: the decisions the simulator's cores made are made again from the recorded
inputs alone (the live system records the same lines; see sim/recording.py)."""
import copy
import json

import pytest

from sim.recording import read, replay
from sim.scenario import build_scenario
from sim.servegen import servegen_trace
from sim.systems.base import SystemRun
from sim.systems.janus import JanusControl

from .shared_data import needs_traces


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    trace = servegen_trace(num_apps=8, num_requests=3000, duration_s=60, seed=1).window(0, 12)
    run = SystemRun(build_scenario(trace, num_devices=64), JanusControl(), record=True)
    run.run()
    path = tmp_path_factory.mktemp("rec") / "janus.jsonl"
    run.recorder.write(path)
    return path


@needs_traces
def test_recording_holds_every_core(recording):
    header, lines = read(recording)
    cores = {line["core"].split("/")[0] for line in lines}
    assert cores == {"dispatcher", "steady", "elastic", "oracle", "reconciler"}
    calls = {line["call"] for line in lines}
    assert {"on_request", "on_prefill_done", "on_instances", "on_tick", "plan", "tick", "observe"} <= calls
    assert {"on_steady_plan", "on_elastic_plan", "observe_heartbeat", "observe_alive", "observe_record",
            "observe_reply"} <= calls
    commands = [c for line in lines if line["core"] == "reconciler" and line["decision"] for c in line["decision"]]
    assert "fork_from" in {c[1] for c in commands}, "the reconciler placed the simulated Janus"
    assert header["config"]["dispatch_policy"]["algorithm"] == "lst_imh"
    # the decode instances' KV reaches the scaler from the simulated workers' heartbeats, as live
    decode_kv = [kv for line in lines if line["call"] == "tick" for kv in line["args"]["decode_kv"].values()]
    assert any(used > 0 and free > 0 for _, used, free, _, _ in decode_kv), "decode instances report their KV"


@needs_traces
def test_replay_makes_the_same_decisions(recording):
    report = replay(*read(recording))
    assert report.num_decisions > 1000
    assert report.is_identical, report.mismatches[:5]


@needs_traces
def test_replay_feeds_the_scaler_the_decode_kv_it_saw(tmp_path):
    """With the decode floor on, a tick's decision depends on the heartbeats' decode KV: the replay gives the
    scaler the recorded KV (a changed KV input changes the decision)."""
    from planner.core import ElasticPolicy, PlannerPolicy

    trace = servegen_trace(num_apps=8, num_requests=3000, duration_s=60, seed=1).window(0, 12)
    policy = PlannerPolicy(elastic=ElasticPolicy(decode_kv_fill_target=0.02))  # binds at once
    run = SystemRun(build_scenario(trace, num_devices=64), JanusControl(planner_policy=policy), record=True)
    run.run()
    path = tmp_path / "janus.jsonl"
    run.recorder.write(path)
    header, lines = read(path)
    report = replay(header, lines)
    assert report.is_identical, report.mismatches[:5]
    ticks = [i for i, line in enumerate(lines) if line["call"] == "tick" and line["args"]["decode_kv"]]
    assert ticks
    # One tick at a time without its KV, the latest first, until one splits otherwise (a debounced or unchanged
    # count does not show it; a tick whose change sends later ticks questions the recording never answered ends
    # that replay early, and the next tick is tried).
    from pydantic import ValidationError

    from planner.core import OracleAnswerError

    changed_at = None
    for i in reversed(ticks):
        edited = copy.deepcopy(lines)
        edited[i]["args"]["decode_kv"] = {}
        try:
            report = replay(header, edited)
        except (OracleAnswerError, ValidationError):
            continue
        if any(m.startswith(f"#{lines[i]['seq']} elastic.tick") for m in report.mismatches):
            changed_at = i
            break
    assert changed_at is not None, "without the KV, no floor: another split at some tick"


@needs_traces
def test_replay_reports_a_changed_decision(recording, tmp_path):
    header, lines = read(recording)
    assigned = next(line for line in lines if line["call"] == "on_request" and line["decision"]
                    and line["decision"][0][0] == "assign")
    assigned["decision"][0][2] = "some-other-instance"
    elastic = next(line for line in lines if line["call"] == "tick")
    elastic["args"]["budget_devices"] = 0  # a different input: the scaler must now decide differently
    command = next(line for line in lines if line["core"] == "reconciler" and line["decision"])
    command["decision"][0][2] = "some-other-worker"
    report = replay(header, lines)
    assert not report.is_identical
    assert any(f"#{assigned['seq']} " in m for m in report.mismatches)
    assert any(f"#{command['seq']} reconciler." in m for m in report.mismatches)


def test_replay_refuses_other_files(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps({"kind": "something-else"}) + "\n")
    with pytest.raises(ValueError):
        read(path)


def test_an_outcome_is_recorded_and_replayed_since_it_moves_decode_routing(tmp_path):
    """A finished request leaves its instance's decode backlog at its outcome (DispatcherCore.on_request_outcome),
    so the outcome is an input of routing: recorded, replayed, and without it a later tie goes elsewhere."""
    from contracts import InstanceRole
    from dispatcher.core import DispatchPolicy, DispatcherCore, ThroughputPrefillModel
    from sim.recording import Recorder, RecordingDispatcher

    from ..dispatcher.helpers import assigns, heartbeat, record, request

    policy = DispatchPolicy()
    recorder = Recorder({"dispatch_policy": policy.model_dump(mode="json"),
                         "prefill_time": {"kind": "throughput", "tokens_per_s": 2000.0}})
    core = RecordingDispatcher(DispatcherCore(policy, ThroughputPrefillModel(2000.0)), recorder, "m")
    core.on_instances(0.0, [record("a"), record("b")])
    core.on_heartbeat(0.0, heartbeat(0.0, {"a": 0, "b": 0}, InstanceRole.COLOCATED))
    (first,) = assigns(core.on_request(0.0, request("r0", 0.0, tokens=100, output_tokens=2)))
    core.on_prefill_done(60.0, first.instance_id, "r0")
    core.on_request_outcome(70.0, "r0", "m", 2, 2)
    (second,) = assigns(core.on_request(100.0, request("r1", 100.0, tokens=100, output_tokens=2)))
    assert second.instance_id == first.instance_id, "r0 finished: both instances are free again, the tie by id"
    path = tmp_path / "outcome.jsonl"
    recorder.write(path)
    header, lines = read(path)
    assert "on_request_outcome" in {line["call"] for line in lines}
    report = replay(header, lines, prefill_time=ThroughputPrefillModel(2000.0))
    assert report.is_identical, report.mismatches
    without = [line for line in lines if line["call"] != "on_request_outcome"]
    assert not replay(header, without, prefill_time=ThroughputPrefillModel(2000.0)).is_identical



@needs_traces
def test_a_wake_between_ticks_is_recorded_and_replayed(tmp_path):
    """With the wake on (and no keep-alive, so that models park and come back within seconds), the simulated Janus
    starts a parked model's first instance from its load listener between ticks (`ElasticScaler.wake`), as the
    scaler service does; the replay makes the same wakes."""
    from dispatcher.core import DispatchPolicy
    from planner.core import ElasticPolicy, PlannerPolicy, PoolPolicy

    trace = servegen_trace(num_apps=20, num_requests=100, duration_s=60, seed=1)  # sparse: 5 requests an app
    policy = PlannerPolicy(elastic=ElasticPolicy(is_woken_at_once=True, keepalive_s=0.0),
                           pool=PoolPolicy(large_need_enter=1e-6, large_need_exit=1e-6))  # every model elastic
    control = JanusControl(planner_policy=policy, dispatch=DispatchPolicy(is_wake_published_at_once=True,
                                                                           window_s=1.0))  # gaps of seconds park
    run = SystemRun(build_scenario(trace, num_devices=64), control, record=True)
    run.run()
    woken = [p for p in control.plans if p.reason.startswith("woken at once")]
    assert woken, "some model parked and woke"
    path = tmp_path / "janus.jsonl"
    run.recorder.write(path)
    header, lines = read(path)
    assert any(line["call"] == "wake" and line["decision"] for line in lines)
    report = replay(header, lines)
    assert report.is_identical, report.mismatches[:5]

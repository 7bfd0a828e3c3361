"""Device-hours taken apart by kind of instance (sim.device_ledger): shares of a shared device, tensor-parallel
groups, the trace's span, and a system's reserve; the kinds add up to the headline's device-hours."""
import json

import numpy as np
import pytest

from oracle.roofline import RooflineModel
from oracle.specs import device, model_shape
from sim.costmodel import StepCost
from sim.device_ledger import RESERVED, DeviceLedger
from sim.event_loop import Sim
from sim.metrics import device_hours_by_kind, integrate_steps
from sim.report import compare_runs, device_hours_by, headline_rows, kinds_table
from sim.requests import RequestTable
from sim.runner import SystemResult
from sim.scenario import build_scenario
from sim.systems.baselines import PrismLike
from sim.systems.base import SystemRun
from sim.systems.static import StaticPartition
from sim.trace import Trace

DEV = device("nvidia-h200")
SMALL = StepCost(RooflineModel(DEV, model_shape("qwen2-0.5b"), 1))
TP2 = StepCost(RooflineModel(DEV, model_shape("qwen2-7b"), 2))


def _sim(horizon_s: float) -> Sim:
    trace = Trace.build([0.0], [0], [10], [2], ("a", "b"))
    return Sim(RequestTable(trace, [1.0, 1.0], [0.1, 0.1]), 4, DEV.hbm_bytes * 0.9, DEV.d2d_bytes_per_s,
               horizon_s=horizon_s)


def test_a_shared_device_is_split_among_its_instances_and_a_group_charges_each_device():
    sim = _sim(horizon_s=100.0)
    sim.launch(0, "colocated", "steady", (0,), SMALL, 0.0, now_s=0.0)
    b = sim.launch(1, "colocated", "steady", (0,), SMALL, 0.0, now_s=10.0)  # shares device 0 from 10 s
    sim.launch(0, "decode", "elastic", (2, 3), TP2, 0.0, now_s=20.0)  # two devices from 20 s
    sim.drain(b, now_s=40.0)  # idle: leaves at once, device 0 is app 0's alone again
    seconds = sim.ledger.seconds_by_kind(150.0)  # the books close at the horizon, not past it
    assert seconds == pytest.approx({(0, "colocated", "steady"): 10 + 30 / 2 + 60, (1, "colocated", "steady"): 15,
                                     (0, "decode", "elastic"): 2 * 80})
    log = sim.devices_log
    assert sum(seconds.values()) == pytest.approx(integrate_steps(log.time_s, log.count, 0.0, 100.0))


def test_an_emptied_group_stops_charging_and_a_new_one_on_its_devices_starts_afresh():
    sim = _sim(horizon_s=1e9)
    first = sim.launch(0, "prefill", "elastic", (2, 3), TP2, 0.0, now_s=0.0)
    sim.drain(first, now_s=5.0)
    sim.launch(1, "prefill", "elastic", (2, 3), TP2, 0.0, now_s=50.0)  # the same devices, idle for 45 s between
    assert sim.ledger.seconds_by_kind(60.0) == pytest.approx({(0, "prefill", "elastic"): 10.0,
                                                               (1, "prefill", "elastic"): 20.0})


def test_the_ledger_refuses_a_horizon_that_charges_nothing():
    with pytest.raises(ValueError, match="horizon_s"):
        DeviceLedger(0.0)


def _scenario(num_devices: int):
    arrivals = np.arange(0, 20, 2.0)
    n = len(arrivals)
    trace = Trace.build(arrivals, [0] * n, [500] * n, [50] * n, ("solo",))
    return build_scenario(trace, device_name="nvidia-h200", num_devices=num_devices, tiers=((1.0, ("qwen2-7b",)),))


@pytest.mark.parametrize("control", [StaticPartition, PrismLike])
def test_a_runs_kinds_add_up_to_its_device_hours_with_a_reserve_named(control):
    result = SystemRun(_scenario(num_devices=3), control()).run()
    hours = device_hours_by_kind(result.device_seconds_by_kind, ("solo",), ("qwen2-7b tp1",))
    assert sum(k.device_hours for k in hours) == pytest.approx(result.summary.device_hours)
    instances = [k for k in hours if k.role != "reserved"]
    assert instances and all(k.app == "solo" and k.model == "qwen2-7b tp1" for k in instances)
    reserved = result.device_seconds_by_kind.get(RESERVED, 0.0) / 3600
    held = sum(k.device_hours for k in instances)
    # prism-like is charged for the whole fleet whatever it places; what it leaves empty is its reserve
    assert reserved == pytest.approx(result.summary.device_hours - held)
    assert (reserved > 0) == (held < result.summary.device_hours * (1 - 1e-6))


def test_the_kinds_table_sums_apps_per_model_and_role_for_each_system():
    from rich.console import Console

    result = SystemRun(_scenario(num_devices=2), StaticPartition()).run()
    kinds = device_hours_by_kind({(0, "prefill", "elastic"): 3600.0, (1, "prefill", "steady"): 1800.0,
                                  (1, "decode", "elastic"): 7200.0}, ("x", "y"), ("m tp1", "m tp1"))
    assert device_hours_by(kinds) == {("m tp1", "prefill"): 1.5, ("m tp1", "decode"): 2.0}
    assert [k.device_hours for k in kinds] == [2.0, 1.0, 0.5]  # the largest first
    console = Console(width=120, record=True)
    console.print(kinds_table([("s", kinds)]))
    text = console.export_text()
    assert "decode" in text and "2.0" in text and "1.5" in text and "3.5" in text  # the total


def _write_run(out_dir, name, seconds_by_kind, summary, meta=None):
    kinds = device_hours_by_kind(seconds_by_kind, ("x", "y"), ("m tp1", "m tp1"))
    row = SystemResult(name, summary, None, np.zeros(2), 0.0, 0.0, kinds=kinds)
    out_dir.mkdir()
    (out_dir / "summary.json").write_text(json.dumps({"meta": meta or {}, "systems": headline_rows([row])}))


def test_compare_reads_two_runs_and_names_the_app_that_moved(tmp_path):
    from rich.console import Console

    summary = SystemRun(_scenario(num_devices=2), StaticPartition()).run().summary
    _write_run(tmp_path / "a", "janus", {(0, "decode", "elastic"): 7200.0, (1, "prefill", "elastic"): 3600.0},
               summary)
    _write_run(tmp_path / "b", "janus", {(0, "decode", "elastic"): 7200.0, (1, "prefill", "elastic"): 18000.0},
               summary)
    console = Console(width=160, record=True)
    compare_runs([tmp_path / "a", tmp_path / "b"], console)
    text = console.export_text()
    assert "a:janus" in text and "b:janus" in text
    moved = text[text.index("moved most"):].splitlines()
    first_row = next(line for line in moved if "y" in line.split())  # app y's prefill: 1.0 -> 5.0, the most moved
    assert "prefill" in first_row and "+4.0" in first_row


@pytest.mark.parametrize("second, is_warned", [("same", False), ("edited", True), ("older", True)])
def test_compare_says_when_the_runs_ran_other_code(tmp_path, second, is_warned):
    """Each run's summary names its code (sim/provenance.py); a difference between runs of other code may be the
    code's, so the comparison says so, naming each run's commit and changed files."""
    from rich.console import Console

    summary = SystemRun(_scenario(num_devices=2), StaticPartition()).run().summary
    clean = {"source_dir": "tree", "commit": "c" * 40, "changed_files": []}
    other = {"same": clean, "edited": {**clean, "changed_files": ["planner/core/elastic.py"]}, "older": None}[second]
    _write_run(tmp_path / "a", "janus", {(0, "decode", "elastic"): 3600.0}, summary, {"code": clean})
    _write_run(tmp_path / "b", "janus", {(0, "decode", "elastic"): 3600.0}, summary,
               {"code": other} if other else {})
    console = Console(width=160, record=True)
    compare_runs([tmp_path / "a", tmp_path / "b"], console)
    text = console.export_text()
    assert ("may not have run the same code" in text) is is_warned
    if second == "edited":
        assert "b: cccccccccccc (1 file changed: planner/core/elastic.py) in tree" in text
    if second == "older":
        assert "b: not recorded" in text


def test_compare_names_a_folder_without_a_run_and_a_run_without_kinds(tmp_path):
    with pytest.raises(ValueError, match="no summary.json in"):
        compare_runs([tmp_path], None)
    (tmp_path / "summary.json").write_text(json.dumps({"systems": [{"system": "janus"}]}))
    with pytest.raises(ValueError, match="janus has no device_hours_by_kind"):
        compare_runs([tmp_path], None)


def test_janus_sim_compare_reports_a_missing_folder_as_a_usage_error(tmp_path, capsys):
    from sim.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--compare", str(tmp_path / "nowhere")])
    assert exit_info.value.code == 2
    assert "no summary.json in" in capsys.readouterr().err

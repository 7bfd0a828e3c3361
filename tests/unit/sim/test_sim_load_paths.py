"""The lifecycle's load paths on the simulated fleet: which path a launch takes and when the instance is ready."""
import dataclasses

import pytest

from sim.scenario import build_scenario
from sim.systems.base import VERIFY_S, ControlPlane, SystemRun
from sim.trace import Trace


class _Idle(ControlPlane):
    """Places nothing by itself: the test launches instances."""

    name = "idle"

    def install(self, run: SystemRun) -> None:
        self.run = run


def _run(is_warm_at_start: bool, num_devices: int = 4, device_name: str = "ascend-910c-die", **spec) -> SystemRun:
    trace = Trace.build([0.0, 1.0], [0, 1], [100] * 2, [10] * 2, ("a", "b"))
    scenario = build_scenario(trace, device_name=device_name, num_devices=num_devices,
                              tiers=((1.0, ("llama-3-8b",)),))
    scenario.is_warm_at_start = is_warm_at_start
    if spec:
        scenario.device = dataclasses.replace(scenario.device, **spec)
    return SystemRun(scenario, _Idle())


def _via(run: SystemRun, instance_id: str) -> str:
    return next(detail.split()[0] for _, iid, what, detail in run.sim.lifecycle_log
                if iid == instance_id and what == "launch")


def test_a_catalogue_model_comes_up_from_another_hosts_memory_not_from_disk():
    run = _run(is_warm_at_start=True)
    times = run.costs[0].load_times()
    assert times.h2d_s < times.net_s < times.disk_s  # RDMA from a remote host: slower than local, faster than disk
    inst = run.launch(0, "colocated", "elastic", (0,), 10.0)
    assert _via(run, inst.instance_id) == "remote_warm"
    assert inst.ready_at_s == pytest.approx(10.0 + times.net_s + VERIFY_S)


def test_a_model_never_loaded_reads_its_disk_when_nothing_is_warm():
    run = _run(is_warm_at_start=False)
    inst = run.launch(0, "colocated", "elastic", (0,), 0.0)
    assert _via(run, inst.instance_id) == "cold_load"
    assert inst.ready_at_s == pytest.approx(run.costs[0].load_times().disk_s + VERIFY_S)


def test_without_a_network_a_warm_copy_elsewhere_does_not_help():
    run = _run(is_warm_at_start=True, device_name="nvidia-h200", net_bytes_per_s=0.0)
    assert run.costs[0].load_times().net_s == float("inf")
    inst = run.launch(0, "colocated", "elastic", (0,), 0.0)
    assert _via(run, inst.instance_id) == "cold_load"


@pytest.mark.parametrize("is_warm_at_start", [False, True])
def test_a_scale_out_from_zero_loads_one_replica_and_forks_the_rest_from_it(is_warm_at_start):
    run = _run(is_warm_at_start)
    times = run.costs[0].load_times()
    first = run.launch(0, "colocated", "elastic", (0,), 5.0)
    rest = [run.launch(0, "colocated", "elastic", (d,), 5.2) for d in (1, 2, 3)]
    assert _via(run, first.instance_id) == ("remote_warm" if is_warm_at_start else "cold_load")
    # one source host's link carries one pull at a time: the others fork from the first once it is ready
    for inst in rest:
        assert _via(run, inst.instance_id) == "fork"
        assert inst.ready_at_s == pytest.approx(first.ready_at_s + times.d2d_s + VERIFY_S)
    assert run.counters["fork"] == 3


def test_a_retired_replica_leaves_a_warm_copy_on_its_host_and_a_later_launch_there_uses_it():
    run = _run(is_warm_at_start=False)
    inst = run.launch(0, "colocated", "elastic", (2,), 0.0)
    run.sim.run()  # ready; no requests of app 0 reach it (no dispatch round runs before it is retired)
    run.retire(inst, run.sim.now_s)
    run.sim.run()
    assert 2 not in run.sim.executor_of_device  # drained and released
    again = run.launch(0, "colocated", "elastic", (2,), 100.0)
    assert _via(run, again.instance_id) == "warm_copy"
    elsewhere = run.launch(1, "colocated", "elastic", (3,), 100.0)  # app 1 was never loaded: disk
    assert _via(run, elsewhere.instance_id) == "cold_load"

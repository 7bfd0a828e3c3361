"""The baselines' pool manager carrying out plans on the simulated fleet."""
from sim.scenario import build_scenario
from sim.systems.base import ControlPlane, SystemRun
from sim.systems.pools import PoolManager
from sim.trace import Trace


class _Idle(ControlPlane):
    """Places nothing by itself: the test drives the pool manager."""

    name = "idle"

    def install(self, run: SystemRun) -> None:
        self.run = run


def _pools(num_devices: int) -> PoolManager:
    trace = Trace.build([0.0, 0.5, 1.0], [0, 1, 0], [100] * 3, [10] * 3, ("busy", "sparse"))
    scenario = build_scenario(trace, device_name="nvidia-h200", num_devices=num_devices,
                              tiers=((1.0, ("qwen2-7b",)),))
    run = SystemRun(scenario, _Idle())
    run.control.install(run)
    return PoolManager(run)


def _count(pools: PoolManager, app: int) -> int:
    return sum(len(insts) for (a, _), insts in pools.elastic.items() if a == app)


def test_a_model_without_an_instance_gets_a_device_before_a_busier_model_grows():
    pools = _pools(num_devices=3)
    priority = {0: 1000.0, 1: 1.0}  # "busy" carries far more tokens than "sparse"
    pools.apply_elastic({0: (2, 0)}, 0.0, priority, preloaded=True)
    assert _count(pools, 0) == 2
    # one device is left; busy wants two more, sparse its first: sparse must get it, or each of its
    # requests meets "no ready instance" while busy merely runs a little hotter
    pools.apply_elastic({0: (4, 0), 1: (1, 0)}, 1.0, priority)
    assert _count(pools, 1) == 1
    assert _count(pools, 0) == 2
    assert pools.num_blocked == 1


def test_with_devices_enough_every_model_gets_what_it_asked():
    pools = _pools(num_devices=6)
    pools.apply_elastic({0: (4, 0), 1: (1, 0)}, 0.0, {0: 1000.0, 1: 1.0})
    assert (_count(pools, 0), _count(pools, 1), pools.num_blocked) == (4, 1, 0)


def test_in_a_full_fleet_freed_devices_go_to_the_most_starved_model_first():
    pools = _pools(num_devices=5)
    priority = {0: 1000.0, 1: 10.0}  # "busy" carries far more tokens
    pools.apply_elastic({0: (2, 0), 1: (1, 0)}, 0.0, priority, preloaded=True)
    # two devices free; busy has 2 of the 5 it wants now, sparse 1 of 3: sparse is the further behind
    pools.apply_elastic({0: (5, 0), 1: (3, 0)}, 1.0, priority)
    assert (_count(pools, 0), _count(pools, 1)) == (2, 3)


def test_a_model_leaving_the_steady_pool_serves_there_until_its_elastic_replica_is_ready():
    pools = _pools(num_devices=3)
    run = pools.run
    pools.apply_steady({0: [1]}, 0.0, preloaded=True)  # "sparse" shares device 0 in the steady pool
    steady_inst = pools.steady[(0, 1)]
    run.sim.run(until_s=0.001)
    assert steady_inst.is_ready
    pools.apply_steady({}, 0.001)  # it leaves for the elastic pool
    assert steady_inst.is_ready and not steady_inst.is_draining, "nothing else serves it yet"
    pools.apply_elastic({1: (1, 0)}, 0.001, {1: 1.0})
    new = pools.elastic[(1, "colocated")][0]
    assert new.ready_at_s - 0.001 < run.costs[1].load_times().h2d_s, "forked from the steady replica"
    assert new.ready_at_s < 0.5  # before the trace's next arrival
    run.sim.run(until_s=new.ready_at_s + 0.001)
    assert new.is_ready and not steady_inst.is_draining
    pools.apply_elastic({1: (1, 0)}, run.sim.now_s, {1: 1.0})
    assert steady_inst.is_draining, "released once the elastic replica serves"


def test_a_model_leaving_both_pools_is_released_at_once():
    pools = _pools(num_devices=3)
    pools.apply_steady({0: [1]}, 0.0, preloaded=True)
    steady_inst = pools.steady[(0, 1)]
    pools.run.sim.run(until_s=0.001)
    pools.apply_steady({}, 30.0)
    assert not steady_inst.is_draining
    pools.apply_elastic({}, 30.0, {})  # no elastic target either
    assert steady_inst.is_draining

"""The simulated oracle's refits (sim/refitter.py) behave as the live refit thread: one at a time, and a new GP
answers only once its training's wall time has passed on the simulated clock; the planners meanwhile get the old
answers."""
import itertools

import pytest

from contracts import ElasticityItem, ElasticityQuery, LoadFeatures
from oracle.core import ModelProfile, Oracle, OraclePolicy
from oracle.gp import gp_oracle
from oracle.profile.grid import LengthMix, load_grid
from oracle.profile.synthetic import roofline_training_set
from oracle.roofline import RooflineModel
from oracle.specs import h200, model_shape
from sim.refitter import SimulatedRefitter

POLICY = OraclePolicy(num_train_iters=20, refit_min_new_samples=5, refit_min_interval_s=10.0, max_grid_replicas=8)
FIT_WALL_S = 2.5


@pytest.fixture(scope="module")
def profile_and_samples():
    roofline = RooflineModel(h200(), model_shape("qwen2-7b"))
    grid = load_grid([2, 10, 40], [LengthMix("chat", 400, 0.8, 150), LengthMix("rag", 2000, 0.5, 100)], [1, 2])
    samples = roofline_training_set("qwen", roofline, grid, 300.0, 20.0, attainment_noise=0.02, seed=1)
    return ModelProfile(roofline, 300.0, 20.0), samples


def source(oracle):
    features = LoadFeatures(token_rate_tps=20000.0, input_len_mean=400.0, input_len_var=320.0 ** 2,
                            output_len_mean=150.0)
    query = ElasticityQuery(items=(ElasticityItem(model="qwen", features=features, replicas=(1, 2)),))
    return oracle.elasticity(query).predictions[0].source


class Scheduler:
    def __init__(self):
        self.events = []

    def at(self, time_s, fn):
        self.events.append((time_s, fn))

    def run_next(self):
        time_s, fn = self.events.pop(0)
        fn(time_s)
        return time_s


def test_a_new_gp_answers_only_after_its_training_time_and_refits_run_one_at_a_time(profile_and_samples):
    profile, training_set = profile_and_samples
    oracle = gp_oracle({"qwen": profile}, policy=POLICY)
    oracle.add_samples("qwen", capacity=training_set.capacity, elasticity=training_set.elasticity)
    assert sorted(k for _, k in oracle.due_for_refit(10.0)) == ["capacity", "elasticity"]
    ticks = itertools.count(step=FIT_WALL_S)  # each training "takes" 2.5 s of wall time
    installed = []
    sched = Scheduler()
    refitter = SimulatedRefitter(oracle, sched.at, installed.append, clock=lambda: next(ticks))
    refitter.poke(10.0)
    assert len(sched.events) == 1 and sched.events[0][0] == pytest.approx(10.0 + FIT_WALL_S)
    first = refitter.in_flight
    refitter.poke(11.0)  # the thread is busy: nothing else starts
    assert len(sched.events) == 1 and source(oracle) == "roofline" and installed == []
    assert sched.run_next() == pytest.approx(12.5)
    assert installed == [pytest.approx(12.5)] and refitter.num_refits == 1
    # the second pair due started when the first was installed, from then on
    assert refitter.in_flight not in (None, first) and sched.events[0][0] == pytest.approx(12.5 + FIT_WALL_S)
    sched.run_next()
    assert source(oracle) == "gp" and refitter.num_refits == 2 and refitter.in_flight is None
    assert refitter.fit_walls_s == [pytest.approx(FIT_WALL_S), pytest.approx(FIT_WALL_S)]
    assert oracle.due_for_refit(30.0) == []  # both fits recorded their samples


def test_a_failed_fit_keeps_the_old_model_and_the_next_refit_still_runs(profile_and_samples):
    profile, training_set = profile_and_samples

    def broken_trainer(samples, policy):
        raise RuntimeError("no convergence")

    oracle = Oracle({"qwen": profile}, policy=POLICY, elasticity_trainer=broken_trainer)
    oracle.add_samples("qwen", elasticity=training_set.elasticity)
    sched = Scheduler()
    refitter = SimulatedRefitter(oracle, sched.at, lambda now_s: None)
    refitter.poke(10.0)
    assert refitter.num_failures == 1 and refitter.in_flight is None and sched.events == []
    assert source(oracle) == "roofline"
    refitter.poke(15.0)  # stamped at 10 s: not due again before refit_min_interval_s
    assert refitter.num_failures == 1
    refitter.poke(20.0)
    assert refitter.num_failures == 2


def test_a_fixed_wall_time_installs_every_fit_after_that_time_whatever_the_fit_measured(profile_and_samples):
    profile, training_set = profile_and_samples
    oracle = gp_oracle({"qwen": profile}, policy=POLICY)
    oracle.add_samples("qwen", capacity=training_set.capacity, elasticity=training_set.elasticity)
    ticks = itertools.count(step=FIT_WALL_S)
    sched = Scheduler()
    refitter = SimulatedRefitter(oracle, sched.at, lambda now_s: None, clock=lambda: next(ticks), fixed_wall_s=0.75)
    refitter.poke(10.0)
    assert sched.events[0][0] == pytest.approx(10.75)  # not 10 + the measured 2.5 s
    assert sched.run_next() == pytest.approx(10.75)
    assert sched.events[0][0] == pytest.approx(11.5)
    # the second fit started at the install; both fits' measured times are still reported
    assert refitter.fit_walls_s == [pytest.approx(FIT_WALL_S)] * 2
    with pytest.raises(ValueError, match="fixed wall time"):
        SimulatedRefitter(oracle, sched.at, lambda now_s: None, fixed_wall_s=-1.0)

"""The Oracle: batched answers, roofline fallback, GP answers with versions, monotone bounds, online learning,
background refits that never block predictions."""
import dataclasses
import itertools
import threading
import time

import numpy as np
import pytest

from contracts import (CapacityItem, CapacityQuery, ElasticityItem, ElasticityQuery, LoadFeatures, ModelLoadWindow,
                       NeedVector)
from oracle.core import Oracle, OraclePolicy, UnknownModelError
from oracle.training_files import load_training_set, save_training_set
from oracle.core.dataset import ElasticitySample
from oracle.core.replicas import ReplicaCounts
from oracle.gp import gp_oracle
from oracle.refit import BackgroundRefitter, SharedOracle

FAST = OraclePolicy(num_train_iters=20, refit_min_new_samples=5, refit_min_interval_s=10.0, max_grid_replicas=16)


def feats(rate_tps, input_mean=400.0, output_mean=150.0):
    return LoadFeatures(token_rate_tps=rate_tps, input_len_mean=input_mean, input_len_var=(0.8 * input_mean) ** 2,
                        output_len_mean=output_mean)


@pytest.fixture(scope="module")
def fitted(profile, training_set):
    oracle = gp_oracle({"qwen": profile}, policy=FAST)
    oracle.add_training_set(training_set)
    oracle.refit("qwen", "capacity", now_s=0.0)
    oracle.refit("qwen", "elasticity", now_s=0.0)
    return oracle


def test_roofline_answers_a_model_without_a_profile_of_measurements(profile):
    oracle = Oracle({"qwen": profile})
    reply = oracle.capacity(CapacityQuery(items=(CapacityItem(model="qwen", features=feats(2000.0)),), k_sigma=2.0))
    (pred,) = reply.predictions
    assert pred.source == "roofline" and pred.model_version == profile.version
    truth = profile.roofline.needs(feats(2000.0), profile.tpot_slo_ms)
    assert pred.mean.compute == pytest.approx(truth.compute)
    assert pred.bound.compute == pytest.approx(truth.compute * (1 + 2 * profile.roofline_need_rel_std))
    ela = oracle.elasticity(ElasticityQuery(items=(ElasticityItem(model="qwen", features=feats(40000.0),
                                                                  replicas=(4, 1, 2)),)))
    (p,) = ela.predictions
    assert p.source == "roofline" and p.replicas == (4, 1, 2)
    assert p.attainment_mean[1] <= p.attainment_mean[2] <= p.attainment_mean[0]
    with pytest.raises(UnknownModelError):
        oracle.capacity(CapacityQuery(items=(CapacityItem(model="nope", features=feats(1.0)),)))


def test_gp_answers_in_the_order_asked_with_their_version(fitted):
    items = tuple(CapacityItem(model="qwen", features=feats(r)) for r in (500.0, 20000.0, 3000.0))
    reply = fitted.capacity(CapacityQuery(items=items, k_sigma=1.5))
    assert [p.source for p in reply.predictions] == ["gp"] * 3
    assert len({p.model_version for p in reply.predictions}) == 1
    assert reply.predictions[0].model_version == fitted.versions("qwen")["capacity"]
    computes = [p.mean.compute for p in reply.predictions]
    assert computes[0] < computes[2] < computes[1]  # needs grow with the load
    for p in reply.predictions:
        for mean, std, bound in zip(p.mean.as_tuple(), p.std.as_tuple(), p.bound.as_tuple()):
            assert bound == pytest.approx(mean + 1.5 * std)


def test_a_model_without_load_needs_its_weights_not_what_a_gp_guesses_at_zero(fitted, profile):
    """The steady planner asks about idle models at zero rate and zero lengths, far outside any profile: the
    roofline answers them (weights' memory, no compute), in the order asked, beside GP answers for loaded items."""
    idle = LoadFeatures(token_rate_tps=0.0, input_len_mean=0.0, input_len_var=0.0, output_len_mean=0.0)
    items = (CapacityItem(model="qwen", features=feats(3000.0)), CapacityItem(model="qwen", features=idle),
             CapacityItem(model="qwen", features=feats(500.0)))
    reply = fitted.capacity(CapacityQuery(items=items, k_sigma=1.0))
    assert [p.source for p in reply.predictions] == ["gp", "roofline", "gp"]
    resting = reply.predictions[1]
    truth = profile.roofline.needs(idle, profile.tpot_slo_ms)
    assert resting.mean.hbm == pytest.approx(truth.hbm) and resting.mean.hbm > 0
    assert resting.mean.compute == resting.mean.bandwidth == 0.0
    assert resting.mean.hbm <= reply.predictions[2].mean.hbm  # idle needs no more memory than a light load
    gp_only = Oracle(policy=FAST)  # a GP and no profile: the GP answers, there is nothing else
    gp_only.install("qwen", capacity=fitted._capacity["qwen"])
    assert gp_only.capacity(CapacityQuery(items=items[1:2])).predictions[0].source == "gp"


@pytest.mark.parametrize("rate", [1000.0, 15000.0, 40000.0, 90000.0])
def test_gp_attainment_bound_is_non_decreasing_and_consistent_across_calls(fitted, rate):
    replicas = tuple(range(1, 13))
    (whole,) = fitted.elasticity(ElasticityQuery(
        items=(ElasticityItem(model="qwen", features=feats(rate), replicas=replicas),), k_sigma=1.0)).predictions
    assert whole.source == "gp"
    assert all(b >= a for a, b in zip(whole.attainment_bound, whole.attainment_bound[1:]))
    assert all(b >= a for a, b in zip(whole.attainment_mean, whole.attainment_mean[1:]))
    assert all(b <= m + 1e-12 for b, m in zip(whole.attainment_bound, whole.attainment_mean))
    # the binary search asks one m at a time: it must see the same numbers
    for m in (1, 5, 12):
        (alone,) = fitted.elasticity(ElasticityQuery(
            items=(ElasticityItem(model="qwen", features=feats(rate), replicas=(m,)),), k_sigma=1.0)).predictions
        assert alone.attainment_bound[0] == pytest.approx(whole.attainment_bound[m - 1])


def test_more_k_sigma_is_more_conservative(fitted):
    def bound(k):
        q = ElasticityQuery(items=(ElasticityItem(model="qwen", features=feats(30000.0), replicas=(1, 2, 3)),),
                            k_sigma=k)
        return np.array(fitted.elasticity(q).predictions[0].attainment_bound)
    assert np.all(bound(2.0) <= bound(0.0))
    assert np.any(bound(2.0) < bound(0.0))


def test_bad_replica_counts_are_refused(fitted):
    with pytest.raises(ValueError):
        ElasticityItem(model="qwen", features=feats(1.0), replicas=())
    with pytest.raises(ValueError, match="replica counts"):
        fitted.elasticity(ElasticityQuery(items=(ElasticityItem(model="qwen", features=feats(1.0), replicas=(0,)),)))


_WINDOW_ENDS_MS = itertools.count(0.0, 10_000.0)  # each window a window length after the last: all learnable


def window(model, rate_tps, num_requests=20, ttft_attainment=0.9, end_ms=None, token_attainment=None):
    return ModelLoadWindow(model=model, window_s=10.0, end_unix_ms=next(_WINDOW_ENDS_MS) if end_ms is None else end_ms,
                           num_requests=num_requests, request_rate_rps=num_requests / 10.0, features=feats(rate_tps),
                           ttft_attainment=ttft_attainment, token_attainment=token_attainment,
                           num_tokens_due=100 if token_attainment is not None else 0)


def test_observe_keeps_windows_with_something_to_learn(profile):
    oracle = gp_oracle({"qwen": profile}, policy=FAST)
    assert not oracle.observe(window("qwen", 1000.0, num_requests=0), 2)
    assert not oracle.observe(window("qwen", 1000.0, ttft_attainment=None), 2)
    assert oracle.observe(window("qwen", 1000.0), 2)
    assert oracle.observe(window("qwen", 1000.0, ttft_attainment=None), 2,
                          needs_per_replica=NeedVector(hbm=0.2, compute=0.1, bandwidth=0.1))
    assert oracle.num_samples("qwen") == {"capacity": 1, "elasticity": 1}
    cap = oracle._capacity_samples["qwen"][0]
    assert cap.features.token_rate_tps == pytest.approx(500.0)  # one replica's share


def test_an_oracle_that_does_not_learn_online_keeps_its_profiles_only(profile):
    learning = gp_oracle({"qwen": profile}, policy=FAST)
    frozen = gp_oracle({"qwen": profile}, policy=dataclasses.replace(FAST, learns_online=False))
    for end_ms in (200_000.0, 210_000.0):
        assert learning.observe(window("qwen", 1000.0, end_ms=end_ms), 2,
                                needs_per_replica=NeedVector(hbm=0.2, compute=0.1, bandwidth=0.1))
        assert not frozen.observe(window("qwen", 1000.0, end_ms=end_ms), 2,
                                  needs_per_replica=NeedVector(hbm=0.2, compute=0.1, bandwidth=0.1))
    assert learning.num_samples("qwen") == {"capacity": 2, "elasticity": 2}
    assert frozen.num_samples("qwen") == {"capacity": 0, "elasticity": 0} and frozen.due_for_refit(1e9) == []


def test_telemetry_is_learnt_one_window_length_apart_and_from_enough_requests(profile):
    oracle = gp_oracle({"qwen": profile}, policy=FAST)
    assert not oracle.observe(window("qwen", 1000.0, num_requests=19), 1)  # a label of too few requests
    assert oracle.observe(window("qwen", 1000.0, end_ms=100_000.0), 1)
    # the next publication 0.5 s later shares most of its requests with the window learnt: not a new sample
    assert not oracle.observe(window("qwen", 1000.0, end_ms=100_500.0), 1)
    assert not oracle.observe(window("qwen", 1000.0, end_ms=109_999.0), 1)
    assert oracle.observe(window("qwen", 1000.0, end_ms=110_000.0), 1)
    assert oracle.observe(window("other", 1000.0, end_ms=110_500.0), 1)  # spacing is per model
    assert oracle.num_samples("qwen")["elasticity"] == 2
    every_window = gp_oracle({"qwen": profile}, policy=dataclasses.replace(FAST, telemetry_spacing_windows=0.0))
    assert every_window.observe(window("qwen", 1000.0, end_ms=0.0), 1)
    assert every_window.observe(window("qwen", 1000.0, end_ms=500.0), 1)


def test_a_window_is_learnt_only_once_its_replica_count_has_held_a_window_before_it(profile):
    """Replicas are added because attainment fell: the requests finishing just after still carry the wait from
    before, and learnt against the new count they would teach the GP that replicas do not help."""
    oracle = gp_oracle({"qwen": profile}, policy=FAST)  # 10 s windows, settle one window length
    changed_ms = 100_000.0
    assert not oracle.observe(window("qwen", 1000.0, end_ms=105_000.0), 3, replicas_since_ms=changed_ms)
    # began at the change: the window before it saw the old count
    assert not oracle.observe(window("qwen", 1000.0, end_ms=110_000.0), 3, replicas_since_ms=changed_ms)
    assert not oracle.observe(window("qwen", 1000.0, end_ms=119_999.0), 3, replicas_since_ms=changed_ms)
    assert oracle.observe(window("qwen", 1000.0, end_ms=120_000.0), 3, replicas_since_ms=changed_ms)
    assert oracle.observe(window("qwen", 1000.0, end_ms=130_000.0), 3)  # a count of unknown age: taken as held
    assert oracle.num_samples("qwen")["elasticity"] == 2
    eager = gp_oracle({"qwen": profile}, policy=dataclasses.replace(FAST, telemetry_settle_windows=0.0))
    assert eager.observe(window("qwen", 1000.0, end_ms=110_000.0), 3, replicas_since_ms=changed_ms)
    with pytest.raises(ValueError, match="telemetry_settle_windows"):
        OraclePolicy(telemetry_settle_windows=-1.0)


def test_replica_counts_remember_when_each_count_began():
    counts = ReplicaCounts()
    assert counts.count("qwen") == 0 and counts.since_ms("qwen") is None
    counts.update("qwen", 2, 1_000.0)
    counts.update("qwen", 2, 2_000.0)  # the same count reported again: it has held since the first report
    assert (counts.count("qwen"), counts.since_ms("qwen")) == (2, 1_000.0)
    counts.update("qwen", 3, 3_000.0)
    counts.update("qwen", 0, 4_000.0)
    assert (counts.count("qwen"), counts.since_ms("qwen")) == (0, 4_000.0)
    assert counts.models() == ["qwen"]


def test_a_window_is_labelled_by_its_token_attainment_where_it_has_one(profile):
    oracle = gp_oracle({"qwen": profile}, policy=FAST)
    assert oracle.observe(window("qwen", 1000.0, ttft_attainment=0.9, token_attainment=0.6), 1)
    assert oracle.observe(window("qwen", 1000.0, ttft_attainment=0.8), 1)
    labels = [s.attainment for s in oracle._elasticity_samples["qwen"]]
    assert labels == [0.6, 0.8]
    assert oracle._elasticity_samples["qwen"][0].ttft_attainment == 0.9


def test_shared_models_learn_into_one_pool_and_each_gets_its_refits(profile, training_set):
    oracle = gp_oracle({"a": profile, "b": profile}, policy=FAST)
    oracle.share("a", "kind")
    oracle.share("b", "kind")
    oracle.add_training_set(dataclasses.replace(training_set, model="kind"))
    profiled = oracle.num_samples("a")["elasticity"]
    assert profiled == len(training_set.elasticity) and oracle.num_samples("b")["elasticity"] == profiled
    for model in ("a", "b"):
        assert oracle.observe(window(model, 1000.0), 1)
    assert oracle.num_samples("kind")["elasticity"] == profiled + 2
    assert [key for key in oracle.due_for_refit(0.0) if key[1] == "elasticity"] == [("kind", "elasticity")]
    version = oracle.refit("kind", "elasticity", now_s=0.0)
    assert oracle.versions("a")["elasticity"] == oracle.versions("b")["elasticity"] == version
    assert oracle.versions("kind")["elasticity"] == version


def test_refits_are_due_after_enough_new_samples_and_time(profile):
    oracle = gp_oracle({"qwen": profile}, policy=FAST)
    for i in range(4):
        oracle.observe(window("qwen", 1000.0 * (i + 1)), 1)
    assert oracle.due_for_refit(0.0) == []
    oracle.observe(window("qwen", 9000.0, ttft_attainment=0.5), 1)
    assert oracle.due_for_refit(0.0) == [("qwen", "elasticity")]
    version = oracle.refit("qwen", "elasticity", now_s=0.0)
    assert oracle.versions("qwen")["elasticity"] == version
    for i in range(5):
        oracle.observe(window("qwen", 500.0 * (i + 1)), 2)
    assert oracle.due_for_refit(5.0) == []  # too soon after the last refit
    assert oracle.due_for_refit(10.0) == [("qwen", "elasticity")]


def test_background_refit_swaps_models_without_blocking_predictions(profile, training_set):
    oracle = gp_oracle({"qwen": profile}, policy=FAST)
    clock = {"now": 100.0}
    refitted = threading.Event()
    shared = SharedOracle(oracle)  # samples come in from this thread while the refitter's thread fits
    refitter = BackgroundRefitter(shared, clock=lambda: clock["now"], poll_s=0.05,
                                  on_refit=lambda model, kind, version: refitted.set())
    query = ElasticityQuery(items=(ElasticityItem(model="qwen", features=feats(20000.0), replicas=(1, 2, 4)),))
    refitter.start()
    try:
        assert oracle.elasticity(query).predictions[0].source == "roofline"
        shared.add_samples("qwen", elasticity=training_set.elasticity)
        refitter.wake()
        sources = set()
        deadline = time.monotonic() + 60.0
        while not refitted.is_set() and time.monotonic() < deadline:
            sources.add(oracle.elasticity(query).predictions[0].source)  # answered while the fit runs
            # a caller spinning without a pause starves the fit thread of the GIL (each torch op re-takes it)
            time.sleep(0.002)
        assert refitted.is_set(), "refit did not finish in 60 s"
        assert "roofline" in sources  # predictions kept coming during the fit
        assert oracle.elasticity(query).predictions[0].source == "gp"
        assert refitter.num_refits >= 1 and refitter.num_failures == 0
    finally:
        refitter.stop()


def test_a_shared_refit_trains_outside_its_lock(profile):
    """SharedOracle holds its lock for the snapshot and the bookkeeping, not for the fit: samples sent while a fit
    runs are taken at once (the event loop never waits seconds), and are new samples for the next refit."""
    from types import SimpleNamespace

    training, release = threading.Event(), threading.Event()

    def slow(samples, policy):
        training.set()
        assert release.wait(30)
        return SimpleNamespace(version=f"slow-{len(samples)}")

    oracle = Oracle({"qwen": profile}, policy=FAST, elasticity_trainer=slow)
    shared = SharedOracle(oracle)
    shared.add_samples("qwen", elasticity=[ElasticitySample(feats(100.0 * i), 1, 1.0) for i in range(1, 8)])
    versions = []
    fit = threading.Thread(target=lambda: versions.append(shared.refit("qwen", "elasticity", 0.0)))
    fit.start()
    try:
        assert training.wait(30)
        sender = threading.Thread(target=shared.add_samples, args=("qwen",),
                                  kwargs={"elasticity": [ElasticitySample(feats(900.0), 1, 1.0)]})
        sender.start()
        sender.join(10)
        assert not sender.is_alive(), "add_samples waited for the fit"
        assert oracle.num_samples("qwen")["elasticity"] == 8
    finally:
        release.set()
        fit.join(30)
    assert versions == ["slow-7"] and oracle.versions("qwen")["elasticity"] == "slow-7"  # the snapshot's 7


def test_a_failed_refit_keeps_the_previous_model(profile):
    def broken(samples, policy):
        raise FloatingPointError("diverged")

    oracle = Oracle({"qwen": profile}, policy=FAST, elasticity_trainer=broken)
    oracle.add_samples("qwen", elasticity=[ElasticitySample(feats(100.0 * i), 1, 1.0) for i in range(1, 8)])
    refitter = BackgroundRefitter(oracle, clock=lambda: 0.0)
    assert refitter.run_once() == []
    assert refitter.num_failures == 1
    assert oracle.versions("qwen")["elasticity"] == profile.version


def test_training_set_round_trips_through_json(tmp_path, training_set):
    path = tmp_path / "set.json"
    save_training_set(training_set, path)
    again = load_training_set(path)
    assert again.model == training_set.model and again.ttft_slo_ms == training_set.ttft_slo_ms
    assert again.capacity == training_set.capacity and again.elasticity == training_set.elasticity
    path.write_text('{"format": "something-else"}')
    with pytest.raises(ValueError, match="format"):
        load_training_set(path)

"""Oracle accuracy on held-out profiles and the fast-path tick time, each figure beside a baseline from the same run.

    .venv/bin/python -m ops.profile --model demo-tiny --out artifacts/oracle/demo-tiny.json     # ~10 min
    .venv/bin/python bench/oracle.py --profile artifacts/oracle/demo-tiny.json

Accuracy: K-fold cross-validation over the profile's grid points (a point's replicas stay in one fold, so no
measurement of a held-out point is trained on). Baseline: the roofline model calibrated to the same engine (its
efficiencies are stored in the profile), on the same held-out points. Tick: one elastic-scaler tick, the binary
search of planner.core.replica_search over m = 1..64 for 62 models (one batched oracle call per round), with the
profile's fitted Elasticity GP installed for every model; baseline: the same tick answered by the roofline.
Four GP variants side by side: identity or logit (the default) target x logistic (default) or constant prior mean
(the model before 2026-11-30). The tick also counts implausible answers far from the data: loads at least as heavy as a
profiled point that missed 0.9 with m replicas, answered with m* <= m. Merged profiles' HBM and bandwidth needs are
converted to the first profile's calibrated device (`in_units_of`).
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from contracts import ElasticityItem, ElasticityQuery  # noqa: E402
from oracle.core import ModelProfile, Oracle, OraclePolicy, TrainingSet  # noqa: E402
from oracle.training_files import load_training_set  # noqa: E402
from oracle.core.features import capacity_inputs, elasticity_inputs  # noqa: E402
from oracle.roofline import Efficiency, RooflineModel  # noqa: E402
from oracle.specs import DeviceSpec, ModelShape  # noqa: E402

PAPER = {"att_median": 2.5, "att_p90": 19.0, "compute_p90": 24.0, "bandwidth_p90": 23.0}


def roofline_of(ts: TrainingSet) -> RooflineModel:
    meta = ts.meta
    return RooflineModel(DeviceSpec(**meta["device"]), ModelShape(**meta["shape"]),
                         efficiency=Efficiency(**meta["efficiency"]))


def in_units_of(base: TrainingSet, other: TrainingSet) -> TrainingSet:
    """`other`'s capacity samples with HBM and bandwidth needs as fractions of `base`'s device. Each profile's device
    is calibrated on its own (`calibrate_cpu`, about a second on a shared machine: memcpy from 1.1 to 6.6 GB/s was
    measured across four profiles), so merging needs one unit; compute is a share of time, the same in both."""
    ours, theirs = base.meta.get("device", {}), other.meta.get("device", {})
    hbm = theirs.get("hbm_bytes", 1.0) / ours.get("hbm_bytes", 1.0)
    bandwidth = theirs.get("hbm_bytes_per_s", 1.0) / ours.get("hbm_bytes_per_s", 1.0)
    other.capacity = [replace(s, needs=s.needs.model_copy(update={"hbm": s.needs.hbm * hbm,
                                                                   "bandwidth": s.needs.bandwidth * bandwidth}))
                      for s in other.capacity]
    return other


def folds_of(ts: TrainingSet, num_folds: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Fold of each elasticity sample and of each capacity sample (grouped by grid point). A point run
    prefill/decode-disaggregated (its meta's `num_decode` > 0) has no capacity samples (oracle/profile/harness.py),
    nor has a knee search's pilot run (source "pilot", appended after the grid: oracle/profile/run.py)."""
    num_points = len(ts.elasticity)
    point_fold = np.random.default_rng(seed).permutation(num_points) % num_folds
    infos = ts.meta.get("points", [])
    has_capacity = [s.source != "pilot" and not (infos[i].get("num_decode", 0) if i < len(infos) else 0)
                    for i, s in enumerate(ts.elasticity)]
    replicas = [s.num_replicas if has else 0 for s, has in zip(ts.elasticity, has_capacity)]
    if sum(replicas) != len(ts.capacity):
        raise SystemExit("profile: capacity samples do not line up with grid points (one per replica)")
    return point_fold, np.repeat(point_fold, replicas)


def pct(values: list[float] | np.ndarray, q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def accuracy(ts: TrainingSet, num_folds: int, k: float, seed: int, policy: OraclePolicy) \
        -> dict[str, dict[str, float]]:
    from oracle.gp import fit_capacity, fit_elasticity

    roofline = roofline_of(ts)
    point_fold, cap_fold = folds_of(ts, num_folds, seed)
    att = {"gp": [], "roofline": []}
    att_in_band = {"gp": [], "roofline": []}
    need_rel = {name: {"hbm": [], "compute": [], "bandwidth": []} for name in ("gp", "roofline")}
    need_in_band = {name: [] for name in ("gp", "roofline")}
    rf_att_std, rf_rel_std = 0.1, 0.25  # ModelProfile defaults: what the oracle says the roofline's error is
    for fold in range(num_folds):
        train_e = [s for s, f in zip(ts.elasticity, point_fold) if f != fold]
        test_e = [s for s, f in zip(ts.elasticity, point_fold) if f == fold]
        train_c = [s for s, f in zip(ts.capacity, cap_fold) if f != fold]
        test_c = [s for s, f in zip(ts.capacity, cap_fold) if f == fold]
        if not test_e:
            continue
        ela = fit_elasticity(train_e, policy)
        mean, std = ela.predict(elasticity_inputs([s.features for s in test_e], [s.num_replicas for s in test_e]))
        truth = np.array([s.attainment for s in test_e])
        att["gp"].extend(np.abs(mean - truth) * 100)
        att_in_band["gp"].extend(np.abs(mean - truth) <= k * std)
        rf = np.array([roofline.attainment(s.features, s.num_replicas, ts.ttft_slo_ms, ts.tpot_slo_ms)
                       for s in test_e])
        att["roofline"].extend(np.abs(rf - truth) * 100)
        att_in_band["roofline"].extend(np.abs(rf - truth) <= k * rf_att_std)

        cap = fit_capacity(train_c, policy)
        c_mean, c_std = cap.predict(capacity_inputs([s.features for s in test_c]))
        c_truth = np.array([s.needs.as_tuple() for s in test_c])
        c_rf = np.array([roofline.needs(s.features, ts.tpot_slo_ms).as_tuple() for s in test_c])
        for j, dim in enumerate(("hbm", "compute", "bandwidth")):
            need_rel["gp"][dim].extend(100 * np.abs(c_mean[:, j] - c_truth[:, j]) / c_truth[:, j])
            need_rel["roofline"][dim].extend(100 * np.abs(c_rf[:, j] - c_truth[:, j]) / c_truth[:, j])
        need_in_band["gp"].extend((np.abs(c_mean - c_truth) <= k * c_std)[:, 1:].ravel())
        need_in_band["roofline"].extend((np.abs(c_rf - c_truth) <= k * rf_rel_std * c_rf)[:, 1:].ravel())
    out = {}
    for name in ("gp", "roofline"):
        out[name] = {
            "att_median": pct(att[name], 50), "att_p90": pct(att[name], 90),
            "compute_p90": pct(need_rel[name]["compute"], 90), "bandwidth_p90": pct(need_rel[name]["bandwidth"], 90),
            "hbm_p90": pct(need_rel[name]["hbm"], 90),
            "att_in_band": 100 * float(np.mean(att_in_band[name])),
            "needs_in_band": 100 * float(np.mean(need_in_band[name])),
            "num_points": len(att[name]), "num_capacity": len(need_rel[name]["compute"]),
        }
    return out


def tick_time(ts: TrainingSet, num_models: int, max_replicas: int, num_ticks: int, seed: int) \
        -> dict[str, float]:
    from oracle.gp import fit_elasticity
    from planner.core.replica_search import search_min_replicas

    roofline = roofline_of(ts)
    rng = np.random.default_rng(seed)
    predictor = fit_elasticity(ts.elasticity, OraclePolicy())
    names = [f"app-{i:02d}" for i in range(num_models)]
    profile = ModelProfile(roofline, ts.ttft_slo_ms, ts.tpot_slo_ms)
    gp_oracle = Oracle({n: profile for n in names}, policy=OraclePolicy(max_grid_replicas=max_replicas))
    rf_oracle = Oracle({n: profile for n in names})
    for name in names:
        # one fit, a distinct copy per app: the oracle evaluates each model on its own (no sharing to exploit),
        # so the cost is that of 62 models fitted on as many points
        gp_oracle.install(name, elasticity=copy.deepcopy(predictor))
    samples = [ts.elasticity[i] for i in rng.integers(0, len(ts.elasticity), num_models)]
    scale = np.exp(rng.uniform(np.log(0.5), np.log(8.0), num_models))  # loads spread over the profile and beyond
    features = {n: s.features.model_copy(update={"token_rate_tps": s.features.token_rate_tps * f})
                for n, s, f in zip(names, samples, scale)}

    def implausible(oracle: Oracle) -> tuple[int, int]:
        """Loads at least a profiled point's whose attainment missed the target with m replicas, answered with
        m* <= m (more load cannot need fewer replicas): how many, of how many such loads."""
        result = search_min_replicas(oracle, features, target_attainment=0.9, k_sigma=1.0,
                                     max_num_replicas=max_replicas)
        cases = [n for n, s, f in zip(names, samples, scale) if f >= 1 and s.attainment < 0.9]
        bad = [n for n, s in zip(names, samples) if n in cases and result[n].num_replicas <= s.num_replicas]
        return len(bad), len(cases)

    def timed(oracle: Oracle, ticks: int, mode: str = "bisect", is_hinted: bool = False,
              jitter: float = 0.0) -> tuple[list[float], int]:
        """`ticks` searches; `is_hinted`: each warm-started from the last one's answers (as the scaler does);
        `jitter`: each tick's rates drift by a random factor within +-jitter (a 5 s window's noise is ~10 %)."""
        times, rounds, hints = [], 0, {}
        drift = np.random.default_rng(seed + 1)
        rates = {n: f.token_rate_tps for n, f in features.items()}
        for tick in range(ticks):
            # every tick sees new load windows (as every 0.5 s in production): nothing is cached across ticks
            rates = {n: r * (1 + 1e-6 + drift.uniform(-jitter, jitter)) for n, r in rates.items()}
            now = {n: f.model_copy(update={"token_rate_tps": rates[n]}) for n, f in features.items()}
            started = time.perf_counter()
            result = search_min_replicas(oracle, now, target_attainment=0.9, k_sigma=1.0,
                                         max_num_replicas=max_replicas, mode=mode,
                                         hints=hints if is_hinted else None)
            times.append((time.perf_counter() - started) * 1e3)
            rounds = max(r.num_rounds for r in result.values())
            hints = {n: r.num_replicas for n, r in result.items()}
        return times, rounds

    constant = fit_elasticity(ts.elasticity, OraclePolicy(elasticity_mean="constant"))  # the model before
    constant_oracle = Oracle({n: profile for n in names}, policy=OraclePolicy(max_grid_replicas=max_replicas))
    for name in names:
        constant_oracle.install(name, elasticity=constant)
    timed(gp_oracle, 2)  # warm caches
    gp_times, gp_rounds = timed(gp_oracle, num_ticks)
    # ElasticPolicy.search_mode="grid": one call for every m (the GP corrects its whole m grid per model anyway)
    gp_grid_times, _ = timed(gp_oracle, num_ticks, mode="grid")
    # warm-started from the last tick's answers, loads drifting +-10 % a tick; and cold under the same drift
    gp_cold_drift_times, _ = timed(gp_oracle, num_ticks, jitter=0.1)
    gp_warm_drift_times, gp_warm_rounds = timed(gp_oracle, num_ticks, is_hinted=True, jitter=0.1)
    rf_times, rf_rounds = timed(rf_oracle, max(2, num_ticks // 5))
    grid_query = ElasticityQuery(items=tuple(ElasticityItem(model=n, features=features[n],
                                                            replicas=tuple(range(1, max_replicas + 1)))
                                             for n in names))
    grid_times = []
    for tick in range(num_ticks):
        query = grid_query.model_copy(update={"k_sigma": 1.0 + 1e-6 * tick})  # defeat the per-tick cache
        started = time.perf_counter()
        gp_oracle.elasticity(query)
        grid_times.append((time.perf_counter() - started) * 1e3)
    return {"gp_ms": statistics.median(gp_times), "gp_p90_ms": pct(gp_times, 90), "gp_rounds": gp_rounds,
            "gp_grid_mode_ms": statistics.median(gp_grid_times),
            "gp_cold_drift_ms": statistics.median(gp_cold_drift_times),
            "gp_warm_drift_ms": statistics.median(gp_warm_drift_times), "gp_warm_rounds": gp_warm_rounds,
            "roofline_ms": statistics.median(rf_times), "roofline_rounds": rf_rounds,
            "grid_call_ms": statistics.median(grid_times), "train_points": predictor.posterior.num_train,
            "gp_implausible": implausible(gp_oracle), "roofline_implausible": implausible(rf_oracle),
            "constant_implausible": implausible(constant_oracle)}


def fit_speed(ts: TrainingSet, seed: int) -> list[tuple[str, float, float]]:
    """Elasticity GP on fold 0's training points: L-BFGS (40 iterations, the default) vs Adam (100 steps at lr 0.1,
    the usual gpytorch recipe); fit seconds and held-out MAE in points."""
    from oracle.gp import fit_exact_gp

    point_fold, _ = folds_of(ts, 5, seed)
    train = [s for s, f in zip(ts.elasticity, point_fold) if f != 0]
    test = [s for s, f in zip(ts.elasticity, point_fold) if f == 0]
    x = elasticity_inputs([s.features for s in train], [s.num_replicas for s in train])
    y = np.array([s.attainment for s in train])
    x_test = elasticity_inputs([s.features for s in test], [s.num_replicas for s in test])
    y_test = np.array([s.attainment for s in test])
    fit_exact_gp(x, y, num_iters=5)  # pay torch's first-call costs outside the timing
    rows = []
    for name, kwargs in (("L-BFGS, 40 iterations", {"num_iters": 40, "optimizer": "lbfgs"}),
                         ("Adam, 100 steps", {"num_iters": 100, "optimizer": "adam"})):
        started = time.perf_counter()
        posterior = fit_exact_gp(x, y, **kwargs)
        seconds = time.perf_counter() - started
        mean, _ = posterior.predict(x_test)
        rows.append((name, seconds, 100 * float(np.mean(np.abs(np.clip(mean[:, 0], 0, 1) - y_test)))))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", required=True, nargs="+",
                        help="TrainingSet JSON(s) written by python -m ops.profile (several: merged)")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--k-sigma", type=float, default=2.0, help="calibration band: |error| <= k sigma")
    parser.add_argument("--models", type=int, default=62)
    parser.add_argument("--max-replicas", type=int, default=64)
    parser.add_argument("--ticks", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fit-speed", action="store_true", help="also compare GP optimisers (L-BFGS vs Adam)")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    ts = load_training_set(args.profile[0])
    for path in args.profile[1:]:
        other = load_training_set(path)
        if (other.ttft_slo_ms, other.tpot_slo_ms) != (ts.ttft_slo_ms, ts.tpot_slo_ms):
            raise SystemExit(f"{path}: other SLOs than {args.profile[0]}: profiles of one model, same SLOs only")
        ts.extend(in_units_of(ts, other))
    command = "python bench/oracle.py " + " ".join(sys.argv[1:] if argv is None else argv)
    print(f"# oracle bench: {ts.model}, {len(ts.elasticity)} grid points, {len(ts.capacity)} replica samples, "
          f"SLO TTFT {ts.ttft_slo_ms:g} ms / TPOT {ts.tpot_slo_ms:g} ms\n# command: {command}\n")

    print(f"## Accuracy on held-out profiles ({args.folds}-fold CV by grid point)\n")
    # the oracle's default (OraclePolicy: the logit target since 2026-12-02) is the one the ratio column divides;
    # the constant mean is the model before the logistic
    variants = [("identity", "logistic"), ("logit", "logistic"), ("identity", "constant"), ("logit", "constant")]
    default = (OraclePolicy().attainment_target, OraclePolicy().elasticity_mean)
    print("| figure | paper | " + " | ".join(f"GP ({t}, {m} mean{', default' if (t, m) == default else ''})"
                                            for t, m in variants)
          + " | roofline (calibrated, same points) | GP default / roofline |")
    print("|---|---|" + "---|" * len(variants) + "---|---|")
    results = [accuracy(ts, args.folds, args.k_sigma, args.seed,
                        OraclePolicy(attainment_target=t, elasticity_mean=m)) for t, m in variants]
    chosen = results[variants.index(default)]
    rows = [("attainment abs error, median (points)", "att_median"), ("attainment abs error, P90 (points)", "att_p90"),
            ("compute need rel error, P90 (%)", "compute_p90"), ("bandwidth need rel error, P90 (%)", "bandwidth_p90"),
            ("HBM need rel error, P90 (%)", "hbm_p90"),
            (f"attainment inside +-{args.k_sigma:g} sigma (%)", "att_in_band"),
            (f"compute/bandwidth inside +-{args.k_sigma:g} sigma (%)", "needs_in_band")]
    for label, key in rows:
        paper = PAPER.get(key)
        rf = chosen["roofline"][key]
        gp = chosen["gp"][key]
        ratio = gp / rf if rf else float("nan")
        gps = " | ".join(f"{r['gp'][key]:.1f}" for r in results)
        print(f"| {label} | {paper if paper is not None else '-'} | {gps} | {rf:.1f} | {ratio:.2f} |")
    print(f"\n(held-out: {chosen['gp']['num_points']} grid points, {chosen['gp']['num_capacity']} replica samples; "
          f"the roofline's sigma is the oracle's default for it: 0.1 attainment, 25 % of a need)\n")

    print(f"## Fast-path tick: {args.models} elastic models, binary search over m = 1..{args.max_replicas}\n")
    t = tick_time(ts, args.models, args.max_replicas, args.ticks, args.seed)
    print("| figure | GP oracle | roofline oracle (baseline) | GP / roofline | goal |")
    print("|---|---|---|---|---|")
    print(f"| one tick, median (ms) | {t['gp_ms']:.1f} | {t['roofline_ms']:.1f} | "
          f"{t['gp_ms'] / t['roofline_ms']:.2f} | <= 20 |")
    print(f"| one tick, P90 (ms) | {t['gp_p90_ms']:.1f} | - | - | - |")
    print(f"| batched oracle calls per tick | {t['gp_rounds']} | {t['roofline_rounds']} | - | - |")
    print(f"| one tick, `search_mode=\"grid\"` (one call asking every m), median (ms) | {t['gp_grid_mode_ms']:.1f} "
          f"| - | - | <= 20 |")
    print(f"| one call, every m = 1..{args.max_replicas} for all models (ms) | {t['grid_call_ms']:.1f} | - | - | - |")
    print(f"| one tick, loads drifting +-10 % a tick, cold bisect, median (ms) | {t['gp_cold_drift_ms']:.1f} | - | - "
          f"| <= 20 |")
    print(f"| the same, warm-started from the last tick's m* (as the scaler runs), median (ms) | "
          f"{t['gp_warm_drift_ms']:.1f} | - | {t['gp_warm_drift_ms'] / t['gp_cold_drift_ms']:.2f} of cold | <= 20 |")
    (gp_bad, cases), (rf_bad, _) = t["gp_implausible"], t["roofline_implausible"]
    print(f"| m* <= m for a load >= a profiled point that missed 0.9 with m replicas (of {cases}) | {gp_bad} "
          f"(constant mean: {t['constant_implausible'][0]}) | {rf_bad} | - | 0 |")
    print(f"\n(GP trained on {t['train_points']} points; median of {args.ticks} ticks)")
    if args.fit_speed:
        rows = fit_speed(ts, args.seed)
        print("\n## GP fit: optimisers on the same data (Elasticity GP, fold 0)\n")
        print("| optimiser | fit (s) | held-out MAE (points) | time / Adam | MAE / Adam |")
        print("|---|---|---|---|---|")
        base = rows[-1]
        for name, seconds, mae in rows:
            print(f"| {name} | {seconds:.2f} | {mae:.1f} | {seconds / base[1]:.2f} | {mae / base[2]:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

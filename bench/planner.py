"""The planner benchmark: bin counts against the exact MILP, migrations per consolidation, slow-path and fast-path
time, each beside a baseline measured in the same run.

    .venv/bin/python bench/planner.py                 # the full run (>= 1,000 instances per family; minutes)
    .venv/bin/python bench/planner.py --quick         # a smoke run
    .venv/bin/python bench/planner.py --only exact    # one part: exact | consolidation | slow | fast

Loads of the 62 models are the 62 busiest clients of the ServeGen trace (../shared/traces/servegen_m_large), each
mapped to a model shape; needs and attainment come from the real `oracle.core.oracle.Oracle` (its roofline profiles;
with fitted GPs where `--gp` fits them). The output says which answered.
"""
from __future__ import annotations

import argparse
import gzip
import json
import random
import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench.common import pct, shared_dir, table  # noqa: E402
from contracts import CapacityItem, CapacityQuery, LoadFeatures, ModelLoadWindow  # noqa: E402
from planner.core.consolidation import keep_in_place  # noqa: E402
from planner.core.elastic import ElasticScaler  # noqa: E402
from planner.core.exact import solve_exact  # noqa: E402
from planner.core.greedy import lower_bound, pack_ffd, pack_phi, pack_phi_order  # noqa: E402
from planner.core.packing import counter_ids  # noqa: E402
from planner.core.policy import ElasticPolicy, PoolPolicy, SteadyPolicy  # noqa: E402
from planner.core.steady import SteadyPlanner  # noqa: E402

SHAPES = ["qwen2-0.5b", "qwen2-1.5b", "qwen2-7b", "llama-3-8b", "qwen2.5-14b"]
# The paper's device: one Ascend 910C die (64 GB). On an H200 (141 GB) these shapes are tiny and packing is easy.
DEVICE = "ascend-910c-die"
TTFT_SLO_MS, TPOT_SLO_MS = 2000.0, 100.0
NUM_MODELS, NUM_DEVICES = 62, 768


# --- instances ------------------------------------------------------------------------------------------------

def uniform_instance(rng: random.Random) -> dict[str, tuple[float, float, float]]:
    """Hard random vectors: 5-14 models, each dimension uniform in [0.02, 0.6] on a 0.001 grid."""
    return {f"m{i}": tuple(round(rng.uniform(0.02, 0.6), 3) for _ in range(3)) for i in range(rng.randint(5, 14))}


def roofline_instance(rng: random.Random, rooflines: dict) -> dict[str, tuple[float, float, float]]:
    """Realistic vectors: 8-20 models of the catalogued shapes on DEVICE, load log-uniform 0.05-20 rps, chat or
    long-prompt mix, needs from the roofline; models that pool assignment would send elastic (> 0.5) left out."""
    out: dict[str, tuple[float, float, float]] = {}
    while len(out) < rng.randint(8, 20):
        shape = rng.choice(SHAPES)
        rate = 10 ** rng.uniform(-1.3, 1.3)
        inp, outp = rng.choice([(300.0, 100.0), (2000.0, 300.0), (800.0, 600.0)])
        f = LoadFeatures(token_rate_tps=rate * (inp + outp), input_len_mean=inp, input_len_var=(0.5 * inp) ** 2,
                         output_len_mean=outp)
        need = tuple(round(x, 3) for x in rooflines[shape].needs(f, TPOT_SLO_MS).as_tuple())
        if max(need) <= 0.5:
            out[f"m{len(out)}"] = need
    return out


def servegen_clients(num: int) -> list[dict]:
    """The `num` busiest clients of the ServeGen trace: mean rate and mean prompt/output lengths."""
    path = shared_dir() / "traces" / "servegen_m_large" / "clients.jsonl.gz"
    clients = []
    with gzip.open(path, "rt") as fh:
        for line in fh:
            c = json.loads(line)
            rates = [w[1] for w in c["windows"]]
            mean_rate = sum(rates) / max(1, len(rates))
            inp, outp = 500.0, 150.0
            for _, q_in, q_out in c.get("lengths") or ():
                if q_in and q_out and None not in q_in and None not in q_out:
                    # the mean of a distribution given by its 0, 5, ..., 100 % quantiles (trapezoids)
                    inp = sum((a + b) / 2 for a, b in zip(q_in, q_in[1:])) / 20
                    outp = sum((a + b) / 2 for a, b in zip(q_out, q_out[1:])) / 20
                    break
            clients.append({"client": c["client"], "rate_rps": mean_rate, "peak_rps": max(rates, default=0.0),
                            "input_len_mean": inp, "output_len_mean": outp})
    clients.sort(key=lambda c: -c["rate_rps"])
    return clients[:num]


def load_windows(clients: list[dict], now_ms: float, scale: float = 1.0) -> list[ModelLoadWindow]:
    out = []
    for i, c in enumerate(clients):
        rate = c["rate_rps"] * scale
        f = LoadFeatures(token_rate_tps=rate * (c["input_len_mean"] + c["output_len_mean"]),
                         input_len_mean=c["input_len_mean"], input_len_var=(0.5 * c["input_len_mean"]) ** 2,
                         output_len_mean=c["output_len_mean"])
        out.append(ModelLoadWindow(model=f"app{i:02d}", window_s=10.0, end_unix_ms=now_ms,
                                   num_requests=int(rate * 10), request_rate_rps=rate, features=f))
    return out


def make_oracle(fit_gp: bool):
    """The real Oracle with one roofline profile per app (shape by rank: the busiest apps get the larger models);
    with `fit_gp`, GPs fitted on roofline profiles of each shape are installed (slow: seconds per fit)."""
    from oracle.core.oracle import ModelProfile, Oracle
    from oracle.roofline import RooflineModel
    from oracle.specs import device, model_shape

    rooflines = {s: RooflineModel(device(DEVICE), model_shape(s)) for s in SHAPES}
    shape_of = {f"app{i:02d}": SHAPES[len(SHAPES) - 1 - min(len(SHAPES) - 1, i // 6)] for i in range(NUM_MODELS)}
    oracle = Oracle({m: ModelProfile(rooflines[s], TTFT_SLO_MS, TPOT_SLO_MS) for m, s in shape_of.items()})
    kind = "real Oracle, roofline profiles (no GP fitted)"
    if fit_gp:
        try:
            from oracle.gp.train import fit_capacity, fit_elasticity
            from oracle.profile.grid import LengthMix, load_grid
            from oracle.profile.synthetic import roofline_training_set

            mixes = [LengthMix("chat", 300, 0.5, 100), LengthMix("long", 2000, 0.8, 300)]
            grid = load_grid([0.5, 2.0, 8.0, 32.0, 128.0], mixes, [1, 2, 4, 8, 16, 32])
            for s in SHAPES:
                ts = roofline_training_set(s, rooflines[s], grid, TTFT_SLO_MS, TPOT_SLO_MS, 0.05, 0.02, seed=1)
                cap, ela = fit_capacity(ts.capacity), fit_elasticity(ts.elasticity)
                for m, shape in shape_of.items():
                    if shape == s:
                        oracle.install(m, cap, ela)
            kind = "real Oracle, GPs fitted on noisy roofline profiles"
        except Exception as exc:  # noqa: BLE001 - report and go on with the roofline answers
            kind = f"real Oracle, roofline profiles (GP fit failed: {type(exc).__name__}: {str(exc)[:60]})"
    return oracle, rooflines, kind


# --- parts ----------------------------------------------------------------------------------------------------

def part_exact(n: int, time_limit_s: float, seed: int, rooflines: dict) -> None:
    print(f"\n## Bins against the exact MILP (HiGHS via scipy.optimize.milp, {time_limit_s:g} s limit per instance)\n")
    rows = []
    for family in ("uniform", "roofline"):
        rng = random.Random(seed)
        stats = {k: [] for k in ("phi", "phi1", "ffd")}
        times = {k: [] for k in ("phi", "phi1", "ffd", "exact")}
        num_finished = 0
        for _ in range(n):
            needs = uniform_instance(rng) if family == "uniform" else roofline_instance(rng, rooflines)
            t0 = time.perf_counter(); phi = pack_phi(needs); times["phi"].append(time.perf_counter() - t0)
            t0 = time.perf_counter(); phi1 = pack_phi_order(needs); times["phi1"].append(time.perf_counter() - t0)
            t0 = time.perf_counter(); ffd = pack_ffd(needs); times["ffd"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            exact = solve_exact(needs, time_limit_s=time_limit_s, max_num_bins=phi.num_bins)
            times["exact"].append(time.perf_counter() - t0)
            if not exact.is_optimal:
                continue
            num_finished += 1
            for k, p in (("phi", phi), ("phi1", phi1), ("ffd", ffd)):
                stats[k].append(p.num_bins - exact.num_bins)
        ffd_median = statistics.median(times["ffd"])
        for k, label in (("phi", "Phi, multi-start + elimination (ours)"), ("phi1", "Phi, one order (paper rule)"),
                         ("ffd", "first-fit decreasing (baseline)"), ("exact", "exact MILP (HiGHS)")):
            gaps = stats.get(k, [0] * num_finished)
            equal = sum(1 for g in gaps if g == 0)
            rows.append([family, label, n, f"{num_finished}/{n}", f"{100 * equal / max(1, len(gaps)):.2f} %",
                         max(gaps, default=0), f"{1e3 * statistics.median(times[k]):.2f}",
                         f"{1e3 * pct(times[k], 99):.1f}", f"{statistics.median(times[k]) / ffd_median:.1f}x"])
    print(table(["family", "packer", "instances", "exact finished", "equal to exact", "worst gap (bins)",
                 "median ms", "p99 ms", "median time / FFD"], rows))
    print("\n(exact finished: HiGHS proved optimality within the limit; 'equal' counts only those instances. The "
          "MILP is skipped when first-fit decreasing already meets the lower bound, which proves it optimal.)")


def part_consolidation(num_periods: int, seed: int, rooflines: dict) -> None:
    print("\n## Migrations per consolidation (30 s periods, budget 4 moves; churn: 1 departure + 1 arrival and "
          "+-20 % load drift per period)\n")

    class DriftOracle:
        """Needs from the roofline of each model's shape and current rate (a deterministic real function)."""

        def __init__(self) -> None:
            self.rates: dict[str, tuple[str, float]] = {}

        def capacity(self, query: CapacityQuery):
            from contracts import CapacityPrediction, CapacityReply, NeedVector
            preds = []
            for item in query.items:
                shape, rate = self.rates[item.model]
                f = LoadFeatures(token_rate_tps=rate * 400, input_len_mean=300, input_len_var=150**2,
                                 output_len_mean=100)
                mu = rooflines[shape].needs(f, TPOT_SLO_MS)
                sd = NeedVector(hbm=0.0, compute=0.0, bandwidth=0.0)
                preds.append(CapacityPrediction(model=item.model, mean=mu, std=sd, bound=mu, model_version="drift"))
            return CapacityReply(predictions=tuple(preds))

        def elasticity(self, query):  # not used by the steady planner
            raise NotImplementedError

    rng = random.Random(seed)
    oracle = DriftOracle()
    for i in range(40):
        oracle.rates[f"m{i}"] = (rng.choice(SHAPES[:4]), 10 ** rng.uniform(-1.0, 0.8))
    planner = SteadyPlanner(oracle, SteadyPolicy(max_num_migrations=4), PoolPolicy(large_need_enter=0.9,
                            large_need_exit=0.8), id_prefix="bench")
    workers = [f"w{i:03d}" for i in range(200)]
    ours_moves, ours_bins, fresh_moves, fresh_bins, lbs, churn_moves = [], [], [], [], [], []
    next_id = 40
    for period in range(num_periods):
        now = period * 30_000.0
        if period:
            gone = rng.choice(sorted(oracle.rates))
            del oracle.rates[gone]
            oracle.rates[f"m{next_id}"] = (rng.choice(SHAPES[:4]), 10 ** rng.uniform(-1.0, 0.8))
            next_id += 1
            for m, (s, r) in list(oracle.rates.items()):
                oracle.rates[m] = (s, r * rng.uniform(0.8, 1.2))
        before = planner.packing
        plan = planner.plan(now, sorted(oracle.rates), workers).plan
        if period == 0:
            continue
        moved = [mv for mv in plan.moves if mv.reason.startswith("consolidation")]
        ours_moves.append(len(moved))
        churn_moves.append(sum(1 for mv in plan.moves if mv.from_worker_id and mv.to_worker_id) - len(moved))
        ours_bins.append(len(plan.bins))
        needs = {p.model: p.bound.as_tuple() for p in plan.predictions if p.model in plan.steady_models}
        fresh = pack_phi(needs, seed=period)
        lbs.append(lower_bound(needs))
        kept = before.copy()
        for m in list(kept.models()):
            if m not in needs:
                kept.remove(m)
        kept.close_empty_bins()
        _, moves = keep_in_place(kept, fresh, counter_ids("new"))
        fresh_moves.append(sum(1 for m, src, _ in moves if src is not None))
        fresh_bins.append(fresh.num_bins)
    rows = [
        ["consolidation under budget (ours)", f"{statistics.mean(ours_moves):.2f}", max(ours_moves),
         f"{statistics.mean(ours_bins):.2f}", f"{statistics.mean(b - lb for b, lb in zip(ours_bins, lbs)):.2f}"],
        ["full repack each period, kept in place (baseline)", f"{statistics.mean(fresh_moves):.2f}",
         max(fresh_moves), f"{statistics.mean(fresh_bins):.2f}",
         f"{statistics.mean(b - lb for b, lb in zip(fresh_bins, lbs)):.2f}"],
    ]
    print(table(["policy", "migrations / period", "max", "devices", "devices above lower bound"], rows))
    print(f"\n(ours also moved {statistics.mean(churn_moves):.2f} models per period for departures and needs "
          f"that grew; {len(ours_moves)} periods; ratio of migrations ours / baseline = "
          f"{statistics.mean(ours_moves) / max(1e-9, statistics.mean(fresh_moves)):.2f})")


def part_slow(oracle, oracle_kind: str, repeats: int) -> None:
    print(f"\n## Slow path: {NUM_MODELS} models on {NUM_DEVICES} devices of {DEVICE} ({oracle_kind})\n")
    clients = servegen_clients(NUM_MODELS)
    workers = [f"w{i:03d}" for i in range(NUM_DEVICES)]
    models = [f"app{i:02d}" for i in range(NUM_MODELS)]
    startup, periodic, oracle_only, ffd_t = [], [], [], []
    for r in range(repeats):
        planner = SteadyPlanner(oracle, SteadyPolicy())
        for w in load_windows(clients, 0.0):
            planner.observe(w)
        t0 = time.perf_counter(); d = planner.plan(0.0, models, workers); startup.append(time.perf_counter() - t0)
        for w in load_windows(clients, 30_000.0, scale=1.1):
            planner.observe(w)
        t0 = time.perf_counter(); d2 = planner.plan(30_000.0, models, workers)
        periodic.append(time.perf_counter() - t0)
        items = tuple(CapacityItem(model=w.model, features=w.features) for w in load_windows(clients, 0.0))
        t0 = time.perf_counter(); reply = oracle.capacity(CapacityQuery(items=items))
        oracle_only.append(time.perf_counter() - t0)
        needs = {p.model: p.bound.as_tuple() for p in reply.predictions if p.model in d.plan.steady_models}
        t0 = time.perf_counter(); ffd = pack_ffd(needs); ffd_t.append(time.perf_counter() - t0)
    med = statistics.median
    rows = [["startup plan (oracle + pool + Phi pack)", f"{1e3 * med(startup):.1f}", len(d.plan.bins)],
            ["periodic plan (oracle + incremental + consolidation)", f"{1e3 * med(periodic):.1f}", len(d2.plan.bins)],
            ["baseline: oracle call alone", f"{1e3 * med(oracle_only):.1f}", "-"],
            ["baseline: oracle call + first-fit decreasing", f"{1e3 * (med(oracle_only) + med(ffd_t)):.1f}",
             ffd.num_bins]]
    print(table(["step", "median ms", "steady devices"], rows))
    print(f"\n{len(d.plan.steady_models)} steady, {len(d.plan.elastic_models)} elastic models; goal <= 1000 ms; "
          f"startup / (oracle + FFD) = {med(startup) / (med(oracle_only) + med(ffd_t)):.1f}x; {repeats} repeats")


class MemoOracle:
    """Answers a question it has seen from memory: isolates the planner's own share of a tick."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.memo: dict = {}

    def capacity(self, query):
        return self.inner.capacity(query)

    def elasticity(self, query):
        key = (query.k_sigma, tuple((i.model, i.replicas, i.features) for i in query.items))
        if key not in self.memo:
            self.memo[key] = self.inner.elasticity(query)
        return self.memo[key]


def part_fast(oracle, oracle_kind: str, repeats: int) -> None:
    print(f"\n## Fast path: one elastic tick for {NUM_MODELS} models ({oracle_kind})\n")
    clients = servegen_clients(NUM_MODELS)
    models = [f"app{i:02d}" for i in range(NUM_MODELS)]
    rows = []
    memo = MemoOracle(oracle)
    for label, policy, answerer, is_steady_load in (
            ("bisect: one batched call per round (default)", ElasticPolicy(search_mode="bisect"), oracle, False),
            ("grid: every m in one call, search on the reply", ElasticPolicy(search_mode="grid"), oracle, False),
            ("bisect, oracle answers memoized (planner alone)", ElasticPolicy(search_mode="bisect"), memo, True)):
        scaler = ElasticScaler(answerer, policy)
        ticks = []
        if is_steady_load:  # warm the memo with the very questions the timed ticks ask
            for w in load_windows(clients, 0.0):
                scaler.observe(w)
            scaler.tick(0.0, models, budget_devices=NUM_DEVICES - 20)
        for r in range(repeats):
            scale = 1.0 if is_steady_load else 1.0 + 0.05 * (r % 3)
            for w in load_windows(clients, 0.0 if is_steady_load else r * 500.0, scale=scale):
                scaler.observe(w)
            t0 = time.perf_counter(); d = scaler.tick(r * 500.0, models, budget_devices=NUM_DEVICES - 20)
            ticks.append(time.perf_counter() - t0)
        num_rounds = max(s.num_rounds for s in d.searches.values())
        rows.append([label, f"{1e3 * pct(ticks, 50):.1f}", f"{1e3 * pct(ticks, 90):.1f}", num_rounds,
                     d.plan.num_devices_used])
    print(table(["search", "median ms", "p90 ms", "oracle calls", "devices used"], rows))
    base = float(rows[1][1])
    print(f"\ngoal <= 20 ms; bisect / grid = {float(rows[0][1]) / max(1e-9, base):.2f}x; {repeats} ticks each")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", choices=["exact", "consolidation", "slow", "fast"])
    ap.add_argument("--num-instances", type=int, default=1000)
    ap.add_argument("--time-limit-s", type=float, default=5.0)
    ap.add_argument("--gp", action="store_true", help="fit GPs for the oracle (slow) instead of roofline answers")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    n = 60 if args.quick else args.num_instances
    print("command: .venv/bin/python bench/planner.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    oracle, rooflines, kind = make_oracle(args.gp)
    if args.only in (None, "exact"):
        part_exact(n, args.time_limit_s, args.seed, rooflines)
    if args.only in (None, "consolidation"):
        part_consolidation(10 if args.quick else 100, args.seed, rooflines)
    if args.only in (None, "slow"):
        part_slow(oracle, kind, 2 if args.quick else 5)
    if args.only in (None, "fast"):
        part_fast(oracle, kind, 3 if args.quick else 20)
    return 0


if __name__ == "__main__":
    sys.exit(main())

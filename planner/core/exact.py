"""The exact steady packing: a MILP solved by HiGHS (through scipy.optimize.milp), for small instances.

Used as the comparison in bench/planner.py and as the steady planner's optional exact mode. Variables x[i, j] (model
i in bin j) and y[j] (bin j open); minimise the number of open bins subject to every model placed once and each bin's
load <= y[j] in every dimension. Symmetry is broken the usual way (models sorted largest first, model i only in bins
0..i, bins opened in order), which is what lets HiGHS prove optimality on tens of models in milliseconds."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from .greedy import lower_bound, pack_ffd, sorted_models
from .packing import Packing, Vec, as_needs


@dataclass(frozen=True)
class ExactResult:
    """`is_optimal` only when HiGHS proved it; otherwise `packing` is the best it found (or the upper bound's)."""

    packing: Packing
    is_optimal: bool
    status: str

    @property
    def num_bins(self) -> int:
        return self.packing.num_bins


def solve_exact(
    needs: Mapping[str, Vec], time_limit_s: float = 2.0, max_num_bins: int | None = None
) -> ExactResult:
    """Minimum-bin packing of `needs`. `max_num_bins` (e.g. a heuristic's count) shrinks the model; without it the
    first-fit-decreasing count is used, which is always feasible."""
    needs = as_needs(needs)
    if not needs:
        return ExactResult(Packing(), True, "empty")
    models = sorted_models(needs, "max")
    n = len(models)
    upper = pack_ffd(needs)
    lb = lower_bound(needs)
    if upper.num_bins <= lb:
        return ExactResult(upper, True, "first-fit decreasing meets the lower bound")
    num_bins_max = max(lb, min(upper.num_bins, max_num_bins)) if max_num_bins else upper.num_bins

    # Variable layout: x[i, j] for j <= min(i, B-1), then y[0..B-1].
    pairs = [(i, j) for i in range(n) for j in range(min(i, num_bins_max - 1) + 1)]
    x_index = {p: k for k, p in enumerate(pairs)}
    num_x = len(pairs)
    y0 = num_x
    num_vars = num_x + num_bins_max
    vec = np.array([needs[m] for m in models])

    rows, cols, vals, lo, hi = [], [], [], [], []
    r = 0

    def row(entries: list[tuple[int, float]], lower: float, upper_: float) -> None:
        nonlocal r
        for c, v in entries:
            rows.append(r)
            cols.append(c)
            vals.append(v)
        lo.append(lower)
        hi.append(upper_)
        r += 1

    for i in range(n):  # each model exactly once
        row([(x_index[(i, j)], 1.0) for j in range(min(i, num_bins_max - 1) + 1)], 1.0, 1.0)
    for j in range(num_bins_max):
        members = [i for i in range(j, n)]
        for d in range(3):  # capacity, switched on by y[j]
            row([(x_index[(i, j)], float(vec[i, d])) for i in members] + [(y0 + j, -1.0)], -np.inf, 0.0)
        for i in members:  # x <= y tightens the LP relaxation a lot
            row([(x_index[(i, j)], 1.0), (y0 + j, -1.0)], -np.inf, 0.0)
        if j + 1 < num_bins_max:  # bins open in order
            row([(y0 + j, 1.0), (y0 + j + 1, -1.0)], 0.0, np.inf)
    row([(y0 + j, 1.0) for j in range(num_bins_max)], float(lb), np.inf)

    a = coo_matrix((vals, (rows, cols)), shape=(r, num_vars)).tocsr()
    c = np.zeros(num_vars)
    c[y0:] = 1.0
    res = milp(
        c,
        constraints=LinearConstraint(a, np.array(lo), np.array(hi)),
        integrality=np.ones(num_vars),
        bounds=Bounds(0, 1),
        options={"time_limit": float(time_limit_s), "disp": False, "mip_rel_gap": 0.0},
    )
    if res.x is None:
        return ExactResult(upper, False, f"no solution ({res.message})")
    packing = Packing()
    for (i, j), k in x_index.items():
        if res.x[k] > 0.5:
            bid = f"b{j}"
            if bid not in {b.bin_id for b in packing}:
                packing.open_bin(bid)
            packing.put(models[i], needs[models[i]], bid)
    return ExactResult(_relabel(packing), res.status == 0, str(res.message))


def _relabel(packing: Packing) -> Packing:
    """Bins renamed b0, b1, ... in order."""
    out = Packing()
    for k, b in enumerate(packing):
        out.open_bin(f"b{k}")
        for model, need in b.needs.items():
            out.put(model, need, f"b{k}")
    return out

"""Benchmark: national-scale hierarchies (issue 14), a histogram at every unit of a US-shaped tree.

Synthetic geography: 1 nation, 51 states, about 3,100 counties and 85,000 tracts (counties per
state and tracts per county drawn from Dirichlet-multinomials, so sizes are uneven as in the
real ones); tract populations from a heavy-tailed (gamma) model spread over a 64-cell
histogram (a Dirichlet mix per tract, so many cells are empty).  Each level is measured with
the Gaussian mechanism under zCDP: the 64 cells and an 8-group marginal of them (a PL-94-like
query pair), ``rho`` split equally over the four levels, ``sigma_level = sqrt(2 / (2 rho_level))``
(each record adds one to one cell and one group: L2 sensitivity squared 2).

Printed in one run, as each finishes:

* exact GLS of the whole tree with per-cell and per-query variances
  (:mod:`cvxdp.solvers.tree.gls`): time, peak memory;
* non-negative GLS to a certified ``--eps`` gap (:mod:`cvxdp.solvers.tree.nonneg`), again with the
  nation's and the states' totals invariant (the Census's invariants), and the
  non-negative L1 estimate on the same answers (:mod:`cvxdp.solvers.tree.l1`);
* consistent integer rounding of the non-negative solution (``cvxdp.round_consistent``);
* the Census-style top-down estimate (``cvxdp.topdown``, non-negative), in this process and on a
  Dask LocalCluster with 1 and 2 workers (per-level times, the same bits or not);
* accuracy per level: mean absolute error of the cells and of the group queries, for the noisy
  answers, GLS, non-negative GLS and the integers;
* the 2,016-cell PL-94 histogram at the nation and the 51 states (every cell and eight
  marginals per unit): GLS with variances, non-negative GLS, integers, accuracy, and the same
  cvxpy model by ``cvxdp.ADMM`` and by Clarabel (``--only pl94`` runs just this);
* the same problems written in cvxpy on states' subtrees (``--ref-state``; by default the state
  with about 1,500 units and the largest) solved by ``cvxdp.ADMM`` and by Clarabel (the L1
  estimate by HiGHS's LP solver), and the
  rounding of the first against HiGHS's MIP: times, ratios, objective differences (each side
  timed as the fastest of ``--repeats`` solves, each of a new ``cp.Problem``).

``--fast`` shrinks the tree (5 states, 150 counties, 3,000 tracts) for a smoke run.

Usage: ``python benchmarks/national.py [--fast] [--rho 1.0] [--eps 1e-4] [--seed 0] [--skip-ref]
[--only all|pl94|ref] [--repeats 3]``
"""
from __future__ import annotations

import argparse
import math
import resource
import time

import numpy as np
import scipy.sparse as sp
import cvxpy as cp

import cvxdp
from cvxdp.solvers.tree.gls import Block, Invariant, TreeGLS
from cvxdp.solvers.tree.l1 import solve_l1
from cvxdp.solvers.tree.nonneg import NonnegSettings, objective, solve_nonneg

K = 64
GROUPS = 8
LEVELS = ("nation", "state", "county", "tract")


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def us_geography(rng, states: int, counties: int, tracts: int) -> np.ndarray:
    """Parent array: nation, states, counties, tracts (each at least one child)."""
    c_per_s = rng.multinomial(counties - states, rng.dirichlet(np.full(states, 2.0))) + 1
    t_per_c = rng.multinomial(tracts - counties, rng.dirichlet(np.full(counties, 1.0))) + 1
    parent = [-1] + [0] * states
    first_county = len(parent)
    for s, c in enumerate(c_per_s):
        parent += [1 + s] * int(c)
    for c, t in enumerate(t_per_c):
        parent += [first_county + c] * int(t)
    return np.array(parent, dtype=np.int64)


def population(rng, n_leaves: int) -> np.ndarray:
    """Tract histograms: heavy-tailed totals spread over the cells by a sparse Dirichlet."""
    totals = rng.gamma(0.6, 2500.0, n_leaves)
    shares = rng.dirichlet(np.full(K, 0.15), n_leaves)
    return rng.poisson(totals[:, None] * shares).astype(float)


def measure(rng, geo, truth, rho: float):
    Qg = np.kron(np.eye(GROUPS), np.ones((1, K // GROUPS)))
    sigma = math.sqrt(2.0 / (2.0 * rho / len(LEVELS)))
    blocks = []
    for units in geo.levels:
        blocks.append(Block(units, np.eye(K), 1 / sigma ** 2, truth[units] + rng.normal(0, sigma, (units.size, K))))
        g = truth[units] @ Qg.T
        blocks.append(Block(units, Qg, 1 / sigma ** 2, g + rng.normal(0, sigma, g.shape)))
    return blocks, Qg, sigma


def accuracy(geo, truth, est, Qg) -> list[str]:
    out = []
    for name, units in zip(LEVELS, geo.levels):
        cells = np.abs(est[units] - truth[units]).mean()
        groups = np.abs((est[units] - truth[units]) @ Qg.T).mean()
        out.append(f"{name} {cells:7.3f} / {groups:7.3f}")
    return out


def timed_gls(geo, k: int, blocks):
    """The exact GLS and its per-cell variances: ``(x, variances, solve s, variances s)``."""
    t = time.perf_counter()
    g = TreeGLS(geo.forest, k, blocks)
    x = g.solve()
    t_gls = time.perf_counter() - t
    t = time.perf_counter()
    cells_var, _ = g.variances()
    return x, cells_var, t_gls, time.perf_counter() - t


def subtree(geo, root: int) -> np.ndarray:
    """Units below ``root`` (itself first), breadth first."""
    out, frontier = [root], [root]
    while frontier:
        frontier = [int(c) for u in frontier for c in geo.children(u)]
        out += frontier
    return np.array(out)


def reference(geo, truth, blocks, Qg, root: int, eps: float, emit, repeats: int = 1) -> None:
    """cvxdp.ADMM and Clarabel on the same cvxpy model of one subtree (each timed as the
    fastest of ``repeats`` solves)."""
    units = subtree(geo, root)
    local = {int(u): i for i, u in enumerate(units)}
    parent = np.array([-1] + [local[int(geo.parent[u])] for u in units[1:]])
    sub = cvxdp.workloads.geography(parent)
    X = cp.Variable((units.size, K))
    loss = sum(cp.sum_squares(r) * (b.w[0] / 2) for b, r in subtree_residuals(X, blocks, units, local))
    for nonneg in (False, True):
        cons = [cvxdp.HierarchicalHistogram(sub, X)] + ([X >= 0] if nonneg else [])
        t_ours, f_ours, _ = best_of(repeats, loss, cons, dict(method="cvxdp", solver=cvxdp.ADMM, eps_rel=eps))
        try:
            t_ref, f_ref, st = best_of(repeats, loss, cons, dict(solver=cp.CLARABEL))
        except cp.error.SolverError as exc:
            t_ref, f_ref, st = math.nan, math.nan, f"error {exc}"
        emit(f"  subtree of unit {root} ({units.size} units, {units.size * K:,} unknowns), "
             f"{'x >= 0' if nonneg else 'GLS   '}: cvxdp {t_ours:7.2f} s | Clarabel {t_ref:7.2f} s ({st}) "
             f"-> {t_ref / t_ours:5.1f}x; objective rel diff {(f_ours - f_ref) / abs(f_ref):+.1e}"
             + (f" (fastest of {repeats} solves each)" if repeats > 1 else ""))
    l1_reference(sub, units, local, blocks, root, eps, emit)


def subtree_residuals(X, blocks, units, local):
    """``(block, X[rows] @ Q.T - y)`` for each block's rows inside the subtree ``units``
    (``local``: unit -> row of ``X``)."""
    for b in blocks:
        pos = np.flatnonzero(np.isin(b.nodes, units))
        if pos.size:
            rows = np.array([local[int(u)] for u in b.nodes[pos]])
            yield b, X[rows] @ b.Q.T - b.y[pos]


def l1_reference(sub, units, local, blocks, root: int, eps: float, emit) -> None:
    """The Laplace MLE on the same answers (weights 1/sigma) with ``X >= 0``: cvxdp.ADMM
    (certified to ``eps``) against HiGHS's LP solver, one solve each."""
    X = cp.Variable((units.size, K))
    loss = sum(cp.sum(cp.abs(r)) * math.sqrt(b.w[0]) for b, r in subtree_residuals(X, blocks, units, local))
    cons = [cvxdp.HierarchicalHistogram(sub, X), X >= 0]
    prob = cp.Problem(cp.Minimize(loss), cons)
    t = time.perf_counter()
    prob.solve(method="cvxdp", solver=cvxdp.ADMM, eps_rel=eps)
    t_ours, f_ours, stats = time.perf_counter() - t, prob.value, prob.solver_stats.extra_stats
    ours = (f"{prob.status}, gap {stats['gap']:.1e}, duals "
            f"{'written' if stats.get('duals_certified') else 'not written'}")
    prob = cp.Problem(cp.Minimize(loss), cons)
    t = time.perf_counter()
    prob.solve(solver=cp.HIGHS, time_limit=900)
    t_ref = time.perf_counter() - t
    emit(f"  subtree of unit {root} ({units.size} units, {units.size * K:,} unknowns), "
         f"L1 >= 0: cvxdp {t_ours:7.2f} s ({ours}) | HiGHS {t_ref:7.2f} s ({prob.status}) -> "
         f"{t_ref / t_ours:5.1f}x; objective rel diff {(f_ours - prob.value) / abs(prob.value):+.1e}")


def best_of(repeats: int, loss, cons, options: dict) -> tuple[float, float, str]:
    """The least wall time of ``repeats`` solves of ``minimize loss s.t. cons``, each a new
    ``cp.Problem`` (cvxpy caches a problem's compiled form, and cvxdp a method's state, on
    the problem object: a re-solve would time neither), and its objective and status."""
    times, prob = [], None
    for _ in range(repeats):
        prob = cp.Problem(cp.Minimize(loss), cons)
        t = time.perf_counter()
        prob.solve(**options)
        times.append(time.perf_counter() - t)
    return min(times), prob.value, prob.status


def rounding_reference(geo, x, root: int, emit) -> None:
    units = subtree(geo, root)
    local = {int(u): i for i, u in enumerate(units)}
    parent = np.array([-1] + [local[int(geo.parent[u])] for u in units[1:]])
    xs = x[units]
    t = time.perf_counter()
    ours = cvxdp.round_consistent(parent, xs)
    t_ours = time.perf_counter() - t
    Z = cp.Variable(xs.shape, integer=True)
    cons = [Z >= np.floor(xs), Z <= np.ceil(xs)]
    for v in range(units.size):
        kids = np.flatnonzero(parent == v)
        if kids.size:
            cons.append(Z[v] == cp.sum(Z[kids], axis=0))
    prob = cp.Problem(cp.Minimize(cp.sum(cp.abs(Z - xs))), cons)
    t = time.perf_counter()
    prob.solve(solver=cp.HIGHS, time_limit=600)
    t_ref = time.perf_counter() - t
    emit(f"  rounding, subtree of unit {root} ({units.size} units): cvxdp {t_ours:.3f} s, L1 "
         f"{np.abs(ours - xs).sum():.6f} | HiGHS MIP {t_ref:.2f} s ({prob.status}), L1 {prob.value:.6f} "
         f"-> {t_ref / max(t_ours, 1e-9):.0f}x")


#: the PL-94 histogram: household/group quarters type, voting age, Hispanic origin, race
PL94 = {"hhgq": 8, "votingage": 2, "hispanic": 2, "cenrace": 63}
#: its query sets (as in the Census's PL-94 strategy): every cell, then marginals
PL94_SETS = [("hhgq", "votingage", "hispanic", "cenrace"), (), ("hhgq",),
             ("votingage", "hispanic", "cenrace"), ("votingage", "hispanic"),
             ("hispanic", "cenrace"), ("cenrace",), ("votingage",), ("hispanic",)]


def pl94_queries():
    """The stacked query matrix (sparse, 2,016 columns) and the rows of each set."""
    mats = [cvxdp.workloads.marginal(PL94, list(a)) for a in PL94_SETS]
    return sp.vstack(mats, format="csr"), np.cumsum([0] + [m.shape[0] for m in mats])


def pl94_section(rng, rho: float, eps: float, emit) -> None:
    """The 2,016-cell PL-94 histogram at the nation and the 51 states: every cell and eight
    marginals measured per unit (zCDP, ``rho`` split over the two levels, one record adds
    one to one entry of each of the 9 sets: L2 sensitivity squared 9).  GLS with variances,
    non-negative GLS, integers; the same cvxpy model by cvxdp.ADMM and by Clarabel."""
    k = 2016
    Q, starts = pl94_queries()
    parent = np.r_[-1, np.zeros(51, dtype=np.int64)]
    geo = cvxdp.workloads.geography(parent)
    pops = np.sort(rng.gamma(0.9, 6.5e6 / 0.9, 51))[::-1]          # state populations
    mix = rng.dirichlet(np.full(k, 0.05))
    truth = np.zeros((52, k))
    for s in range(51):
        truth[1 + s] = rng.multinomial(int(pops[s]), rng.dirichlet(2000 * mix + 1e-3))
    truth[0] = truth[1:].sum(axis=0)
    sigma = math.sqrt(len(PL94_SETS) / (2 * rho / 2))
    Qd = Q.toarray()
    blocks = [Block(units, Qd, np.full(Q.shape[0], 1 / sigma ** 2),
                    truth[units] @ Qd.T + rng.normal(0, sigma, (units.size, Q.shape[0])))
              for units in geo.levels]
    emit(f"PL-94 histogram ({k:,} cells) at the nation and 51 states: {52 * k:,} unknowns, "
         f"{Q.shape[0]:,} queries per unit ({len(PL94_SETS)} sets), sigma {sigma:.3f}")
    x_gls, cells_var, t_gls, t_var = timed_gls(geo, k, blocks)
    emit(f"  exact GLS {t_gls:.2f} s, variances {t_var:.2f} s; peak RSS "
         f"{rss_mb():.0f} MB; per-cell std nation {np.sqrt(cells_var[0]).mean():.3f}, states "
         f"{np.sqrt(cells_var[1:]).mean():.3f}")
    t = time.perf_counter()
    res = solve_nonneg(geo.forest, k, blocks, NonnegSettings(eps_rel=eps))
    emit(f"  non-negative GLS (ADMM): {time.perf_counter() - t:.2f} s, {res.iterations} "
         f"iterations, {res.status}, certified gap {res.gap:.1e}")
    t = time.perf_counter()
    x_int = cvxdp.round_consistent(geo, res.x)
    emit(f"  integer rounding: {time.perf_counter() - t:.3f} s")
    for name, est in (("noisy", None), ("GLS", x_gls), ("GLS >= 0", res.x), ("integers", x_int)):
        parts = []
        for lv, units in zip(("nation", "state"), geo.levels):
            err = (blocks[0 if lv == "nation" else 1].y - truth[units] @ Qd.T) if est is None \
                else (est[units] - truth[units]) @ Qd.T
            cells = np.abs(err[:, :k]).mean()
            marg = np.abs(err[:, k:]).mean()
            parts.append(f"{lv} {cells:7.3f} / {marg:7.3f}")
        emit(f"  {name:9s} " + " | ".join(parts) + "   (mean abs error: cells / marginals)")
    X = cp.Variable((52, k))
    loss = sum(cp.sum_squares(X[b.nodes] @ Q.T - b.y) * (b.w[0] / 2) for b in blocks)
    for nonneg in (False, True):
        prob = cp.Problem(cp.Minimize(loss), [cvxdp.HierarchicalHistogram(geo, X)]
                          + ([X >= 0] if nonneg else []))
        t = time.perf_counter()
        prob.solve(method="cvxdp", solver=cvxdp.ADMM, eps_rel=eps)
        t_ours, f_ours = time.perf_counter() - t, prob.value
        cvxdp_gap = prob.solver_stats.extra_stats["gap"]
        t = time.perf_counter()
        try:
            prob.solve(solver=cp.CLARABEL, time_limit=600)
            t_ref, f_ref, st = time.perf_counter() - t, prob.value, prob.status
        except cp.error.SolverError as exc:
            t_ref, f_ref, st = time.perf_counter() - t, math.nan, f"error {exc}"
        head = (f"  cvxpy model, {'x >= 0' if nonneg else 'GLS   '}: cvxdp.ADMM {t_ours:7.2f} s | "
                f"Clarabel {t_ref:7.2f} s ({st})")
        if st == cp.OPTIMAL:
            emit(f"{head} -> {t_ref / t_ours:5.1f}x; objective rel diff {(f_ours - f_ref) / abs(f_ref):+.1e}")
        else:       # X = 0 is feasible: a status of infeasible is Clarabel's numerical failure
            emit(f"{head}: no reference (X = 0 is feasible; counts up to "
                 f"{truth.max():,.0f} defeat its scaling); cvxdp's certified gap {cvxdp_gap:.1e}")


def topdown_section(geo, truth, blocks, args, emit):
    """The Census-style top-down estimate (non-negative), in this process and on a Dask
    LocalCluster with 1 and 2 workers: time per level, and whether the bits agree."""
    ms = [cvxdp.HistogramMeasurement(b.nodes, b.Q, b.y, 1.0 / np.sqrt(b.w)) for b in blocks]
    runs = {}
    for label, kw in (("in-process", dict(backend="local")), ("Dask, 1 worker", dict(workers=1)),
                      ("Dask, 2 workers", dict(workers=2))):
        try:
            t = time.perf_counter()
            r = cvxdp.topdown(geo, ms, eps_rel=args.eps, **kw)
        except ImportError as exc:
            emit(f"top-down {label}: skipped ({exc})")
            continue
        runs[label] = r
        emit(f"top-down {label}: {time.perf_counter() - t:.2f} s in all (cluster start included); per "
             f"level " + ", ".join(f"{lv['seconds']:.2f} s ({lv['chunks']} chunks)" for lv in r.levels)
             + f"; worst gap {max(lv['gap'] for lv in r.levels):.1e}")
    base = runs.get("in-process")
    for label, r in runs.items():
        if base is not None and r is not base:
            emit(f"  {label}: the same bits as in-process: {np.array_equal(r.x, base.x)}")
    if "Dask, 1 worker" in runs and "Dask, 2 workers" in runs:
        one, two = runs["Dask, 1 worker"].levels[-1]["seconds"], runs["Dask, 2 workers"].levels[-1]["seconds"]
        emit(f"  tract level: 1 worker {one:.2f} s, 2 workers {two:.2f} s -> {one / two:.2f}x")
    return base.x if base is not None else np.full_like(truth, np.nan)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fast", action="store_true")
    ap.add_argument("--rho", type=float, default=1.0)
    ap.add_argument("--eps", type=float, default=1e-4)
    ap.add_argument("--l1-iters", type=int, default=1000)
    ap.add_argument("--eps-l1", type=float, default=1e-4, help="certified gap of the L1 estimate")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-ref", action="store_true")
    ap.add_argument("--only", choices=("all", "pl94", "ref"), default="all",
                    help="run one section: the PL-94 histogram, or the cvxpy reference solves")
    ap.add_argument("--ref-state", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=3,
                    help="time each cvxpy reference solve (cvxdp and Clarabel alike) as the fastest of this many")
    ap.add_argument("--ref-units", type=int, nargs="+", default=[1500, 10 ** 9],
                    help="without --ref-state: the states whose subtree sizes are closest to these "
                         "(the default: about 1,500 units, and the largest state)")
    args = ap.parse_args()

    def emit(line):
        print(line, flush=True)

    rng = np.random.default_rng(args.seed)
    if args.only == "pl94":
        pl94_section(rng, args.rho, args.eps, emit)
        return
    sizes = (5, 150, 3000) if args.fast else (51, 3100, 85000)
    geo = cvxdp.workloads.geography(us_geography(rng, *sizes))
    truth = geo.aggregate(population(rng, geo.leaves.size))
    blocks, Qg, sigma = measure(rng, geo, truth, args.rho)
    emit(f"US-shaped geography: {' / '.join(str(lv.size) for lv in geo.levels)} units "
         f"({geo.n_nodes:,}), {K} cells each: {geo.n_nodes * K:,} unknowns; population "
         f"{truth[0].sum():,.0f}; zCDP rho {args.rho} -> sigma {sigma:.3f} per level")
    if args.only == "ref":
        res = solve_nonneg(geo.forest, K, blocks, NonnegSettings(eps_rel=args.eps))
        reference_sections(geo, truth, blocks, Qg, res.x, args, emit)
        return
    x_gls, cells_var, t_gls, t_var = timed_gls(geo, K, blocks)
    emit(f"exact GLS: {t_gls:.2f} s (solve), variances {t_var:.2f} s; peak RSS {rss_mb():.0f} MB; "
         f"per-cell std by level: " + ", ".join(f"{np.sqrt(cells_var[u]).mean():.3f}" for u in geo.levels))
    t = time.perf_counter()
    res = solve_nonneg(geo.forest, K, blocks, NonnegSettings(eps_rel=args.eps))
    t_nn = time.perf_counter() - t
    emit(f"non-negative GLS (ADMM): {t_nn:.2f} s, {res.iterations} iterations, {res.status}, "
         f"certified gap {res.gap:.1e}; peak RSS {rss_mb():.0f} MB")
    t = time.perf_counter()
    units = np.r_[0, geo.levels[1]]
    inv = Invariant(units, np.ones((1, K)), truth[units].sum(axis=1, keepdims=True))
    res_inv = solve_nonneg(geo.forest, K, blocks, NonnegSettings(eps_rel=args.eps), invariants=[inv])
    emit(f"non-negative GLS with the nation's and states' totals invariant: {time.perf_counter() - t:.2f} s, "
         f"{res_inv.iterations} iterations, {res_inv.status}, certified gap {res_inv.gap:.1e}; largest "
         f"invariant error {np.abs(res_inv.x[units].sum(axis=1) - inv.e[:, 0]).max():.1e}")
    t = time.perf_counter()
    l1 = solve_l1(geo.forest, K, [Block(b.nodes, b.Q, np.sqrt(b.w), b.y) for b in blocks],
                  NonnegSettings(eps_rel=args.eps_l1, max_iters=args.l1_iters))
    emit(f"non-negative L1 (ADMM, weights 1/sigma, on the same answers, to {args.eps_l1:g}): "
         f"{time.perf_counter() - t:.2f} s, "
         f"{l1.iterations} iterations, {l1.status}, certified gap {l1.gap:.1e}; peak RSS {rss_mb():.0f} MB")
    t = time.perf_counter()
    x_int = cvxdp.round_consistent(geo, res.x)
    t_int = time.perf_counter() - t
    emit(f"integer rounding: {t_int:.2f} s; L1 move {np.abs(x_int - res.x).sum():,.1f} over "
         f"{res.x.size:,} entries; loss {objective(blocks, res.x):.6e} -> {objective(blocks, x_int):.6e}")
    x_td = topdown_section(geo, truth, blocks, args, emit)
    emit("accuracy, mean absolute error of cells / of the 8 group queries, by level:")
    noisy = np.zeros_like(truth)
    for b in blocks[::2]:
        noisy[b.nodes] = b.y
    for name, est in (("noisy", noisy), ("GLS", x_gls), ("GLS >= 0", res.x), ("L1 >= 0", l1.x),
                      ("integers", x_int), ("top-down", x_td)):
        emit(f"  {name:9s} " + " | ".join(accuracy(geo, truth, est, Qg)))
    if not args.skip_ref:
        reference_sections(geo, truth, blocks, Qg, res.x, args, emit)
    pl94_section(rng, args.rho, args.eps, emit)


def reference_sections(geo, truth, blocks, Qg, x_nn, args, emit) -> None:
    """The cvxpy models of states' subtrees (cvxdp.ADMM vs Clarabel) and the rounding of the
    first against HiGHS's MIP."""
    states = geo.levels[1]
    sizes_ = np.array([subtree(geo, int(s)).size for s in states])
    roots = [args.ref_state] if args.ref_state is not None else \
        list(dict.fromkeys(int(states[np.argmin(np.abs(sizes_ - r))]) for r in args.ref_units))
    for root in roots:
        reference(geo, truth, blocks, Qg, root, args.eps, emit, args.repeats)
    rounding_reference(geo, x_nn, roots[0], emit)


if __name__ == "__main__":
    main()

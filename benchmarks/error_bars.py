"""Benchmark: coverage of ``cvxdp.error_bars``' nominal 90% intervals, and what they cost (issue 27).

On synthetic truths (and on the Adult data's true tables), each trial draws a fresh release,
solves the estimator, asks ``cvxdp.error_bars`` for its intervals and checks which of them
contain the true answer.  Printed, one row per estimator and interval as each finishes:

* coverage: the fraction of true answers inside their interval, pooled over the queries and
  the trials, with its binomial standard error ``sqrt(p (1 - p) / n)`` (the queries of one
  trial share one release, so this understates the trial-to-trial spread a little); an
  interval contains the truth within ``TOL = 1e-6`` (a cell at the bound ``x >= 0`` comes back
  from the solvers as about 1e-10, not 0, and so do its bootstrap re-estimates); the same
  split into queries whose true answer is zero and those where it is not (non-negativity
  biases estimates near zero upwards); mean interval width, also split;
* for the bootstrap, every interval kind (``percentile``, ``basic``, ``bc``, ``normal``) is
  read off the same draws (``ErrorBars.samples``), so the kinds differ only in construction.

Sections:

A. Binary hierarchies (``--leaves-exp``: 2^8 leaves, 90% empty cells with Pareto counts as in
   tutorial 1), queries the leaf cells: GLS (Gaussian noise; exact, and the bootstrap for
   comparison), non-negative GLS (``x >= 0``; bootstrap), L1 + ``x >= 0`` with Laplace noise
   of the same variance (``cvxdp.ADMM``; bootstrap).
B. Adult contingency table workclass x race x relationship (270 cells, 67 empty), every cell
   with Gaussian noise, the three one-way marginals known exactly: GLS with the equalities
   (exact) and the same with ``z >= 0`` (bootstrap).
C. The local polytope on Adult two-way marginals (5 attributes, all 10 pairs, Gaussian noise
   calibrated to (1, 1e-6)-DP, ``cvxdp.LocalPolytope(..., total=N)``): bootstrap.
D. A state's subtree of the national benchmark's geography (``benchmarks/national.py``: 64
   cells and 8 group queries per unit, zCDP rho 1): ``cvxdp.histograms.gls`` and
   ``cvxdp.error_bars(gls_result)``, exact coverage of every unit's cells.
E. Timing: exact standard errors of a 2^16-leaf hierarchy's GLS (``cvxdp.error_bars(prob)``)
   against the solve itself; the full national tree's ``histograms.gls(..., variances=True)``
   against ``variances=False``; 200 bootstrap draws of a 2^14-leaf non-negative L1
   hierarchy (Laplace, ``solver=cvxdp.ADMM``) in this process, with ``workers=2`` and
   ``workers=1`` (the LocalCluster's start included), and with ``client=`` of a LocalCluster
   started beforehand as ``docs/guide/many.md`` advises; the machine's load average is printed
   with each timing.

``--fast`` shrinks everything for a smoke run (under a minute).  Results of a full run are
also written to ``benchmarks/results/error_bars.txt`` (of a run of some sections only, to
``error_bars_<sections>.txt``).

Usage: ``python benchmarks/error_bars.py [--fast] [--trials 10] [--draws 200] [--seed 0]
[--only A,B,C,D,E] [--leaves-exp 8]``
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time
from pathlib import Path

import cvxpy as cp
import numpy as np
import scipy.sparse as sp

import cvxdp
from cvxdp.estimates.error_bars import _interval   # the library's own interval constructions

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from national import GROUPS, K, us_geography, population, subtree  # noqa: E402

ADULT = Path(os.environ.get("CVXDP_ADULT_DIR", HERE.parent.parent / "shared" / "data" / "adult"))
LEVEL = 0.9
#: an interval "contains" the truth within this absolute tolerance: solvers return a cell at an
#: active bound ``x >= 0`` as 1e-10 rather than 0, and so do the bootstrap's re-solves
TOL = 1e-6
KINDS = ("percentile", "basic", "bc", "normal")
Z90 = 1.6448536269514722


def remedies(samples, est, gls=None) -> dict:
    """Intervals this benchmark builds from the same draws (not offered by ``error_bars``):
    the percentile interval shifted by twice the bootstrap's bias estimate
    ``mean(samples) - estimate`` (Efron and Tibshirani 1993, sec. 10.6), the normal interval
    around the bias-corrected estimate, and (where the same release has a GLS estimate) the
    exact GLS interval (for a squared loss, ``error_bars(..., method="relaxed")``; the row
    "relaxed"), and a hybrid: the percentile interval where the GLS interval lies above zero,
    the GLS interval elsewhere; each cut at zero, where the truth cannot be."""
    a = (1.0 - LEVEL) / 2.0
    bias = samples.mean(axis=0) - est
    q_lo, q_hi = np.quantile(samples, a, axis=0), np.quantile(samples, 1.0 - a, axis=0)
    se = samples.std(axis=0, ddof=1)
    out = {"shifted pct": (q_lo - 2 * bias, q_hi - 2 * bias),
           "bias-c norm": (est - bias - Z90 * se, est - bias + Z90 * se)}
    if gls is not None:
        g_lo, g_hi = np.ravel(gls.lower), np.ravel(gls.upper)
        out["relaxed"] = (g_lo, g_hi)
        # the percentile interval where the GLS interval is clear of zero, GLS's elsewhere
        away = g_lo > 0
        out["hybrid"] = (np.where(away, q_lo, g_lo), np.where(away, q_hi, g_hi))
    return {k: (np.maximum(lo, 0.0), np.maximum(hi, 0.0)) for k, (lo, hi) in out.items()}


def load() -> str:
    return "load %.1f / %.1f / %.1f" % os.getloadavg()


class Tally:
    """Hits and widths of one (estimator, interval) pooled over trials, split by truth == 0."""

    def __init__(self):
        self.hit, self.width, self.zero = [], [], []

    def add(self, lower, upper, truth) -> None:
        lo, hi, t = (np.ravel(np.asarray(a, dtype=float)) for a in (lower, upper, truth))
        self.hit.append((lo - TOL <= t) & (t <= hi + TOL))
        self.width.append(hi - lo)
        self.zero.append(t == 0)

    def row(self) -> str:
        hit, width, zero = (np.concatenate(a) for a in (self.hit, self.width, self.zero))
        out = []
        for mask in (np.ones_like(zero), zero, ~zero):
            n = int(mask.sum())
            if n == 0:
                out.append(f"{'-':>14s}")
                continue
            p = hit[mask].mean()
            out.append(f"{p:6.3f} ± {math.sqrt(p * (1 - p) / n):5.3f}")
        widths = [f"{width[m].mean():8.2f}" if m.any() else f"{'-':>8s}" for m in (np.ones_like(zero), zero, ~zero)]
        return " | ".join(out) + " | " + " ".join(widths) + f" | {hit.size:7d}"


HEADER = (f"{'case':34s} {'interval':11s} | {'coverage, all':14s} | {'true zero':14s} | "
          f"{'true > 0':14s} | {'width: all':>8s} {'zero':>8s} {'> 0':>8s} | {'n':>7s}")


class Case:
    """The tallies of one estimator: ``exact`` (normal) and/or each bootstrap kind."""

    def __init__(self, name: str):
        self.name, self.tallies, self.failed, self.draws, self.seconds = name, {}, 0, 0, 0.0

    def add_exact(self, eb, truth) -> None:
        self.tallies.setdefault("exact", Tally()).add(eb.lower, eb.upper, truth)
        self.seconds += eb.wall_time

    def add_bootstrap(self, eb, truth, nonneg: bool = False, gls=None) -> None:
        """Every interval kind from ``eb.samples``; with ``nonneg`` also :func:`remedies`
        (``gls``: the same release's exact GLS error bars)."""
        est = np.ravel(eb.estimate)
        se = np.ravel(eb.std_err)
        for kind in KINDS:
            lo, hi = _interval(eb.samples, est, se, LEVEL, kind)
            self.tallies.setdefault(kind, Tally()).add(lo, hi, truth)
        if nonneg:
            for kind, (lo, hi) in remedies(eb.samples, est, gls).items():
                self.tallies.setdefault(kind, Tally()).add(lo, hi, truth)
        self.failed += eb.failed
        self.draws += eb.draws + eb.failed
        self.seconds += eb.wall_time

    def emit(self, emit) -> None:
        for kind, t in self.tallies.items():
            emit(f"{self.name:34s} {kind:11s} | {t.row()}")
        extra = f", {self.failed} of {self.draws} re-solves failed" if self.draws else ""
        emit(f"{'':34s} ({self.seconds:.1f} s in error_bars{extra})")


def streams(seed: int, trial: int):
    data_ss, noise_ss = np.random.SeedSequence([seed, trial]).spawn(2)
    return np.random.default_rng(data_ss), np.random.default_rng(noise_ss)


def sparse_histogram(n: int, rng, zero_frac: float = 0.9) -> np.ndarray:
    counts = np.zeros(n)
    nonzero = rng.random(n) >= zero_frac
    counts[nonzero] = np.floor(10 * rng.pareto(1.5, nonzero.sum())) + 1
    return counts


def leaf_selector(tree) -> sp.csr_matrix:
    leaves = np.arange(tree.n_nodes)[tree.leaves]
    return sp.csr_matrix((np.ones(leaves.size), (np.arange(leaves.size), leaves)),
                         shape=(leaves.size, tree.n_nodes))


# -- A. hierarchies ------------------------------------------------------------------------------
def section_hierarchy(args, emit) -> None:
    h = args.leaves_exp
    n = 2 ** h
    tree = cvxdp.workloads.hierarchy(n, 2)
    sel = leaf_selector(tree)
    b = tree.sensitivity / args.epsilon              # Laplace scale at epsilon
    sigma = b * math.sqrt(2.0)                       # Gaussian noise of the same variance
    emit(f"A. binary hierarchy, 2^{h} = {n} leaves ({tree.n_nodes} nodes), 90% empty cells; "
         f"Laplace b = {b:g} (epsilon {args.epsilon:g}), Gaussian sigma = {sigma:.2f} (same variance); "
         f"queries: the {n} leaf cells; {args.trials} trials x {args.draws} draws")
    cases = {k: Case(k) for k in ("GLS (Gaussian)", "GLS (Gaussian), bootstrap",
                                  "GLS + x>=0 (Gaussian)", "L1 + x>=0 (Laplace)")}
    x = cp.Variable(tree.n_nodes)
    for trial in range(args.trials):
        data_rng, noise_rng = streams(args.seed, trial)
        counts = sparse_histogram(n, data_rng)
        mg = cvxdp.mechanisms.gaussian(tree.queries, counts, sigma=sigma, rng=noise_rng)
        ml = cvxdp.mechanisms.laplace(tree.queries, counts, epsilon=args.epsilon, rng=noise_rng)
        boot = dict(draws=args.draws, rng=noise_rng)
        gls = cp.Problem(cp.Minimize(cvxdp.nll(mg, x)), [cvxdp.consistent(tree, x)])
        gls.solve(method="cvxdp")
        eb_gls = cvxdp.error_bars(gls, sel, method="exact")
        cases["GLS (Gaussian)"].add_exact(eb_gls, counts)
        cases["GLS (Gaussian), bootstrap"].add_bootstrap(
            cvxdp.error_bars(gls, sel, method="bootstrap", **boot), counts)
        nn = cp.Problem(cp.Minimize(cvxdp.nll(mg, x)), [cvxdp.consistent(tree, x), x >= 0])
        nn.solve(method="cvxdp")
        # method="relaxed": the library's GLS-of-the-same-release interval, clipped at 0
        cases["GLS + x>=0 (Gaussian)"].add_bootstrap(
            cvxdp.error_bars(nn, sel, **boot), counts, nonneg=True,
            gls=cvxdp.error_bars(nn, sel, method="relaxed"))
        # the GLS of the Laplace release (a plain spelling: its noise named), exact variances
        # (the normal interval is then approximate)
        gls_l = cp.Problem(cp.Minimize(cp.sum_squares(x - ml.answers)), [cvxdp.consistent(tree, x)])
        gls_l.solve(method="cvxdp")
        eb_gls_l = cvxdp.error_bars(gls_l, sel, method="exact", noise=[(ml.answers, ("laplace", b))])
        l1 = cp.Problem(cp.Minimize(cvxdp.nll(ml, x)), [cvxdp.consistent(tree, x), x >= 0])
        l1.solve(method="cvxdp", solver=cvxdp.ADMM)
        cases["L1 + x>=0 (Laplace)"].add_bootstrap(
            cvxdp.error_bars(l1, sel, solver=cvxdp.ADMM, **boot), counts, nonneg=True, gls=eb_gls_l)
    emit(HEADER)
    for c in cases.values():
        c.emit(emit)


# -- B. Adult contingency table ------------------------------------------------------------------
def adult(attrs):
    names = list(json.loads((ADULT / "adult-domain.json").read_text()))
    sizes = json.loads((ADULT / "adult-domain.json").read_text())
    data = np.loadtxt(ADULT / "adult.csv", delimiter=",", skiprows=1,
                      usecols=[names.index(a) for a in attrs], dtype=np.int64, ndmin=2)
    return cvxdp.Domain({a: sizes[a] for a in attrs}), data


def section_contingency(args, emit) -> None:
    attrs = ("workclass", "race", "relationship")
    dom, data = adult(attrs)
    truth = dom.count(data, attrs).ravel()
    sizes = list(dom.shape(attrs))
    Qm = cvxdp.workloads.marginals(sizes, [(i,) for i in range(len(attrs))])
    known = Qm @ truth
    sigma = args.adult_sigma
    emit(f"B. Adult contingency table {' x '.join(attrs)}: {truth.size} cells ({int((truth == 0).sum())} "
         f"empty), Gaussian sigma {sigma:g} per cell, one-way marginals known; {args.trials} trials "
         f"x {args.draws} draws")
    exact, boot = Case("GLS + marginals (exact)"), Case("GLS + marginals + z>=0")
    z = cp.Variable(truth.size)
    for trial in range(args.trials):
        _, noise_rng = streams(args.seed + 1, trial)
        m = cvxdp.mechanisms.gaussian(sp.identity(truth.size, format="csr"), truth, sigma=sigma,
                                      rng=noise_rng)
        gls = cp.Problem(cp.Minimize(cvxdp.nll(m, z)), [Qm @ z == known])
        gls.solve(method="cvxdp")
        eb_gls = cvxdp.error_bars(gls, method="exact")
        exact.add_exact(eb_gls, truth)
        nn = cp.Problem(cp.Minimize(cvxdp.nll(m, z)), [Qm @ z == known, z >= 0])
        nn.solve(method="cvxdp")
        boot.add_bootstrap(cvxdp.error_bars(nn, draws=args.draws, rng=noise_rng), truth,
                           nonneg=True, gls=cvxdp.error_bars(nn, method="relaxed"))
    emit(HEADER)
    exact.emit(emit)
    boot.emit(emit)


# -- C. local polytope ---------------------------------------------------------------------------
def section_polytope(args, emit) -> None:
    attrs = (("race", "sex", "relationship") if args.fast else
             ("workclass", "race", "relationship", "sex", "income>50K"))
    dom, data = adult(attrs)
    N = data.shape[0]
    pairs = list(itertools.combinations(attrs, 2))
    truth = {c: dom.count(data, c) for c in pairs}
    sigma = cvxdp.privacy.gaussian_sigma(1.0, 1e-6, math.sqrt(len(pairs)))
    n_cells = sum(t.size for t in truth.values())
    n_zero = sum(int((t == 0).sum()) for t in truth.values())
    emit(f"C. local polytope on Adult ({', '.join(attrs)}; N = {N:,}): all {len(pairs)} two-way "
         f"marginals ({n_cells} cells, {n_zero} empty), Gaussian sigma {sigma:.2f} ((1, 1e-6)-DP); "
         f"{args.trials} trials x {args.draws} draws")
    case = Case("LocalPolytope (Gaussian)")
    mus = {c: cp.Variable(dom.shape(c)) for c in pairs}
    for trial in range(args.trials):
        _, noise_rng = streams(args.seed + 2, trial)
        noisy = {c: cvxdp.mechanisms.gaussian(sp.identity(truth[c].size, format="csr"),
                                              truth[c].ravel(), sigma=sigma, rng=noise_rng)
                 for c in pairs}
        con = cvxdp.LocalPolytope(mus, dom, total=N)
        prob = cp.Problem(cp.Minimize(sum(cvxdp.nll(noisy[c], mus[c]) for c in pairs)), [con])
        prob.solve(method="cvxdp")
        by_id = {mus[c].id: truth[c] for c in pairs}
        t = np.concatenate([by_id[v.id].ravel() for v in prob.variables()])
        case.add_bootstrap(cvxdp.error_bars(prob, draws=args.draws, rng=noise_rng), t, nonneg=True)
    emit(HEADER)
    case.emit(emit)


# -- D. national subtree -------------------------------------------------------------------------
def national_tree(rng, fast: bool):
    sizes = (5, 150, 3000) if fast else (51, 3100, 85000)
    geo = cvxdp.workloads.geography(us_geography(rng, *sizes))
    truth = geo.aggregate(population(rng, geo.leaves.size))
    return geo, truth


def histogram_measurements(rng, geo, truth, rho: float, units_by_level):
    Qg = np.kron(np.eye(GROUPS), np.ones((1, K // GROUPS)))
    sigma = math.sqrt(2.0 / (2.0 * rho / len(units_by_level)))
    ms = []
    for units in units_by_level:
        ms.append(cvxdp.HistogramMeasurement(units, np.eye(K), truth[units] + rng.normal(0, sigma, (units.size, K)), sigma))
        g = truth[units] @ Qg.T
        ms.append(cvxdp.HistogramMeasurement(units, Qg, g + rng.normal(0, sigma, g.shape), sigma))
    return ms, sigma


def section_national(args, emit) -> None:
    rng = np.random.default_rng(args.seed)
    geo, truth = national_tree(rng, args.fast)
    states = geo.levels[1]
    sizes = np.array([subtree(geo, int(s)).size for s in states])
    root = int(states[np.argmin(np.abs(sizes - (100 if args.fast else 600)))])
    units = subtree(geo, root)
    local = {int(u): i for i, u in enumerate(units)}
    parent = np.array([-1] + [local[int(geo.parent[u])] for u in units[1:]])
    sub = cvxdp.workloads.geography(parent)
    sub_truth = truth[units]
    trials = max(args.trials, 2)
    emit(f"D. national benchmark's geography, the subtree of state {root}: {units.size} units "
         f"({' / '.join(str(lv.size) for lv in sub.levels)}), {K} cells each ({int((sub_truth == 0).sum()):,} "
         f"of {sub_truth.size:,} empty), cells and {GROUPS} groups measured per unit (zCDP rho 1 over "
         f"the 4 levels); {trials} trials")
    case = Case("histograms.gls (exact)")
    for trial in range(trials):
        _, noise_rng = streams(args.seed + 3, trial)
        ms, sigma = histogram_measurements(noise_rng, sub, sub_truth, 1.0,
                                           [sub.levels[0]] + list(sub.levels))
        res = cvxdp.histograms.gls(sub, ms)
        case.add_exact(cvxdp.error_bars(res), sub_truth)
    emit(HEADER)
    case.emit(emit)


# -- E. timing -----------------------------------------------------------------------------------
def best(repeats: int, f):
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = f()
        times.append(time.perf_counter() - t)
    return min(times), out


def section_timing(args, emit) -> None:
    rng = np.random.default_rng(args.seed)
    h = 12 if args.fast else 16
    tree = cvxdp.workloads.hierarchy(2 ** h, 2)
    counts = sparse_histogram(2 ** h, rng)
    m = cvxdp.mechanisms.gaussian(tree.queries, counts, sigma=5.0, rng=rng)
    x = cp.Variable(tree.n_nodes)

    def solve():
        prob = cp.Problem(cp.Minimize(cvxdp.nll(m, x)), [cvxdp.consistent(tree, x)])
        prob.solve(method="cvxdp")
        return prob

    if args.skip_exact_timing:
        return section_bootstrap_timing(args, emit, rng)
    t_solve, prob = best(2, solve)
    t_eb, eb = best(2, lambda: cvxdp.error_bars(prob))
    emit(f"E. 2^{h}-leaf hierarchy ({tree.n_nodes:,} nodes), GLS: solve {t_solve:.2f} s "
         f"({prob.solver_stats.solver_name}), exact standard errors of every node {t_eb:.2f} s "
         f"({eb.route}) -> {t_eb / t_solve:.2f}x the solve (best of 2 each; {load()})")

    geo, truth = national_tree(rng, args.fast)
    ms, sigma = histogram_measurements(rng, geo, truth, 1.0, list(geo.levels))
    t_plain, _ = best(2, lambda: cvxdp.histograms.gls(geo, ms, variances=False))
    t_var, res = best(2, lambda: cvxdp.histograms.gls(geo, ms, variances=True))
    t_eb, _ = best(2, lambda: cvxdp.error_bars(res))
    emit(f"   national tree ({geo.n_nodes:,} units x {K} cells = {geo.n_nodes * K:,} unknowns): "
         f"histograms.gls variances=False {t_plain:.2f} s, variances=True {t_var:.2f} s -> "
         f"{t_var / t_plain:.2f}x; error_bars(result) {t_eb:.3f} s (best of 2 each; {load()})")

    section_bootstrap_timing(args, emit, rng)


def section_bootstrap_timing(args, emit, rng) -> None:
    h = 10 if args.fast else 14
    draws = 10 if args.fast else 200
    tree = cvxdp.workloads.hierarchy(2 ** h, 2)
    counts = sparse_histogram(2 ** h, rng)
    ml = cvxdp.mechanisms.laplace(tree.queries, counts, epsilon=1.0, rng=rng)
    x = cp.Variable(tree.n_nodes)
    l1 = cp.Problem(cp.Minimize(cvxdp.nll(ml, x)), [cvxdp.consistent(tree, x), x >= 0])
    t = time.perf_counter()
    l1.solve(method="cvxdp", solver=cvxdp.ADMM)
    t_one = time.perf_counter() - t
    emit(f"   bootstrap, 2^{h}-leaf L1 + x>=0 hierarchy (Laplace, cvxdp.ADMM; one solve {t_one:.2f} s), "
         f"{draws} draws, re-solves to eps_rel "
         f"{args.boot_eps if args.boot_eps is not None else 'error_bars default'}:")
    opts = {} if args.boot_eps is None else dict(eps_rel=args.boot_eps)

    def run(label: str, **kw) -> float:
        before = load()
        t = time.perf_counter()
        eb = cvxdp.error_bars(l1, draws=draws, rng=0, solver=cvxdp.ADMM, **opts, **kw)
        took = time.perf_counter() - t
        emit(f"     {label:34s} {took:7.1f} s ({took / draws:.3f} s per draw, {eb.failed} failed; "
             f"before: {before}, after: {load()})")
        return took

    run("in this process")
    started, drawn = {}, {}
    for w in (2, 1):
        started[w] = run(f"workers={w} (LocalCluster start incl.)", workers=w)
    for w in (2, 1):
        t = time.perf_counter()
        cluster, client = local_cluster(w)
        emit(f"     a {w}-worker LocalCluster started in {time.perf_counter() - t:.1f} s")
        try:
            drawn[w] = run("client= of that cluster", client=client)
        finally:
            client.close()
            cluster.close()
    emit(f"     2 workers vs 1: {started[1] / started[2]:.2f}x with the cluster's start, "
         f"{drawn[1] / drawn[2]:.2f}x on running clusters (target >= 1.6x); 2 workers "
         f"{'under' if max(started[2], drawn[2]) < 30 else 'over'} the 30 s target")


def local_cluster(workers: int):
    """A LocalCluster as ``docs/guide/many.md`` advises starting one: single-threaded worker
    processes, glibc's mmap threshold raised before they start (Dask's MALLOC_TRIM_THRESHOLD_
    otherwise made every large array a fresh mapping: 1.9x slower solves)."""
    import dask
    import distributed
    key = "distributed.nanny.pre-spawn-environ"
    env = {**dask.config.get(key), "MALLOC_MMAP_THRESHOLD_": str(32 * 1024 * 1024)}
    with dask.config.set({key: env}):
        cluster = distributed.LocalCluster(n_workers=workers, threads_per_worker=1,
                                           dashboard_address=None)
    return cluster, distributed.Client(cluster)


SECTIONS = {"A": section_hierarchy, "B": section_contingency, "C": section_polytope,
            "D": section_national, "E": section_timing}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fast", action="store_true")
    ap.add_argument("--trials", type=int, default=None, help="releases per estimator (default 10; --fast 2)")
    ap.add_argument("--draws", type=int, default=None, help="bootstrap draws (default 200; --fast 30)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default="A,B,C,D,E", help="comma-separated sections")
    ap.add_argument("--leaves-exp", type=int, default=None, help="section A: 2^this leaves (default 8; --fast 5)")
    ap.add_argument("--epsilon", type=float, default=1.0, help="section A's Laplace epsilon")
    ap.add_argument("--adult-sigma", type=float, default=5.0, help="section B's Gaussian sigma")
    ap.add_argument("--boot-eps", type=float, default=None,
                    help="section E: the bootstrap re-solves' eps_rel (default: error_bars')")
    ap.add_argument("--skip-exact-timing", action="store_true", help="section E: the bootstrap only")
    args = ap.parse_args()
    args.trials = args.trials or (2 if args.fast else 10)
    args.draws = args.draws or (30 if args.fast else 200)
    args.leaves_exp = args.leaves_exp or (5 if args.fast else 8)
    out = None
    if not args.fast:
        # a run of some sections only keeps the full run's file
        keys = "".join(k.strip().upper() for k in args.only.split(","))
        name = "error_bars.txt" if keys == "ABCDE" else f"error_bars_{keys}.txt"
        (HERE / "results").mkdir(exist_ok=True)
        out = open(HERE / "results" / name, "w")

    def emit(line: str) -> None:
        print(line, flush=True)
        if out is not None:
            out.write(line + "\n")
            out.flush()

    emit(f"cvxdp {cvxdp.__version__}, cvxpy {cp.__version__}, numpy {np.__version__}; "
         f"{os.cpu_count()} cores, shared ({load()}); nominal level {LEVEL:.0%}; "
         f"{'FAST' if args.fast else 'full'} run, seed {args.seed}")
    emit("coverage: fraction of true answers inside the interval ± binomial standard error; "
         "width: mean upper - lower")
    t_all = time.perf_counter()
    for key in args.only.split(","):
        key = key.strip().upper()
        emit("")
        t = time.perf_counter()
        SECTIONS[key](args, emit)
        emit(f"  (section {key}: {time.perf_counter() - t:.1f} s; {load()})")
    emit(f"\ntotal {time.perf_counter() - t_all:.1f} s")
    if out is not None:
        out.close()


if __name__ == "__main__":
    main()

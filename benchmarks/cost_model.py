"""Calibration of ``solver=None``'s cost model: each family's cvxdp method against Clarabel by size.

For every family the cost model distinguishes (``cvxdp/cost_model.py``), seeded instances at
a range of sizes are solved through ``prob.solve`` with the cvxdp method and with Clarabel (the
standard solver ``solver=None`` would hand them to), whole calls timed, best of ``--repeat``.
Per family it prints the measured times and fits ``log t = a + b log size`` to each solver;
the crossover (the size above which the cvxdp method is faster) is what the cost model uses.
Paste the printed ``FITS`` into ``cvxdp/cost_model.py`` after a change of methods or machine.

``--standards`` instead compares Clarabel with HiGHS (L1 losses) and OSQP (L2, polished at
1e-7) at the small sizes where a standard solver is chosen.

Usage: ``python benchmarks/cost_model.py [--repeat 3] [--families admm_tree,...] [--standards]``
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import scipy.sparse as sp
import cvxpy as cp

import cvxdp
from cvxdp.cost_model import size_of

TIGHT = dict(tol_gap_abs=1e-8, tol_gap_rel=1e-8, tol_feas=1e-8)


def sparse_counts(n, rng):
    x = np.zeros(n)
    nz = rng.random(n) > 0.9
    x[nz] = np.floor(rng.pareto(1.5, nz.sum()) * 10) + 1
    return x


def _loss(loss, y, x):
    """The three loss kinds the model tells apart: Laplace MLE, squared, elastic net."""
    if loss == "l1":
        return cvxdp.nll(y, x)
    if loss == "l2":
        return cp.sum_squares(x - y.answers) / (2 * float(np.max(y.scale)) ** 2)
    return cvxdp.elastic_net(y, x, alpha=0.9)


def admm_tree(n_leaves, loss):
    rng = np.random.default_rng(0)
    tree = cvxdp.workloads.hierarchy(n_leaves, 2)
    y = cvxdp.mechanisms.laplace(tree.queries, sparse_counts(n_leaves, rng), epsilon=1.0, rng=1)
    x = cp.Variable(tree.n_nodes)
    return cp.Problem(cp.Minimize(_loss(loss, y, x)), [cvxdp.consistent(tree, x), x >= 0])


def admm_general(cells, loss):
    rng = np.random.default_rng(1)
    a = int(round(cells ** 0.5))
    sizes = (a, max(cells // a, 1))
    counts = sparse_counts(sizes[0] * sizes[1], rng) * 20
    Q = cvxdp.workloads.marginals(sizes, [(0,), (1,)])
    y = cvxdp.mechanisms.laplace(sp.identity(counts.size, format="csr"), counts, epsilon=0.5, rng=2)
    z = cp.Variable(counts.size)
    return cp.Problem(cp.Minimize(_loss(loss, y, z)), [Q @ z == Q @ counts, z >= 0])


def admm_general_inside(cells, loss):
    """:func:`admm_general`'s tables with 30 % empty cells (not 90 %): few noisy answers
    below zero, the ADMM's easier kind (``cvxdp.methods.consistency._pushed_share``)."""
    rng = np.random.default_rng(1)
    a = int(round(cells ** 0.5))
    sizes = (a, max(cells // a, 1))
    counts = np.floor(rng.pareto(1.5, sizes[0] * sizes[1]) * 10) + 1
    counts[rng.random(counts.size) < 0.3] = 0.0
    Q = cvxdp.workloads.marginals(sizes, [(0,), (1,)])
    y = cvxdp.mechanisms.laplace(sp.identity(counts.size, format="csr"), counts, epsilon=0.5, rng=2)
    z = cp.Variable(counts.size)
    return cp.Problem(cp.Minimize(_loss(loss, y, z)), [Q @ z == Q @ counts, z >= 0])


def admm_order(n, loss):
    """A degree sequence: non-increasing counts (one order chain), ``0 <= x <= n``."""
    rng = np.random.default_rng(5)
    deg = np.sort(np.floor(rng.pareto(1.2, n) * 3))[::-1]
    y = cvxdp.mechanisms.laplace(sp.identity(n, format="csr"), deg, epsilon=0.5, rng=6)
    x = cp.Variable(n)
    return cp.Problem(cp.Minimize(_loss(loss, y, x)), [x[1:] <= x[:-1], x >= 0, x <= n])


def general_exact(n, loss):
    """Any loss matrix (identity on sparse random 0/1 rows), random equality rows, ``x >= 0``:
    the LP / interior-point route (``benchmarks/general_path.py``'s instances)."""
    from general_path import instance

    return instance(n, {"mixed": "en"}.get(loss, loss), "nonneg")


def histogram_tree(units, loss):
    rng = np.random.default_rng(2)
    k = 16
    parent = np.r_[-1, np.zeros(max(units // 20, 1), int)]
    parent = np.r_[parent, rng.integers(1, parent.size, max(units - parent.size, 1))]
    geo = cvxdp.workloads.geography(parent)
    truth = geo.aggregate(rng.poisson(2.0, (geo.leaves.size, k)).astype(float))
    Y = truth + rng.normal(0, 2, truth.shape)
    X = cp.Variable((geo.n_nodes, k))
    obj = cp.sum(cp.abs(X - Y)) / 2 if loss == "l1" else cp.sum_squares(X - Y) / 8
    return cp.Problem(cp.Minimize(obj), [cvxdp.HierarchicalHistogram(geo, X), X >= 0])


def _clique_problem(constraint, dom, cliques, loss, rng):
    data = np.column_stack([rng.integers(0, n, 2000) for n in dom.sizes])
    noisy = {c: dom.count(data, c) + rng.normal(0, 10, dom.shape(c)) for c in cliques}
    mus = {c: cp.Variable(dom.shape(c)) for c in cliques}
    if loss == "l1":
        obj = sum(cp.norm1(mus[c] - noisy[c]) for c in cliques) / 10
    else:
        obj = sum(cp.sum_squares(mus[c] - noisy[c]) for c in cliques) / 200
    return cp.Problem(cp.Minimize(obj), [constraint(mus, dom, total=2000.0)])


def marginal_polytope(cells, loss):
    rng = np.random.default_rng(3)
    s = max(int(round(cells ** (1 / 3))), 2)
    dom = cvxdp.Domain({"a": s, "b": s, "c": s, "d": 3})
    cliques = [("a", "b"), ("b", "c"), ("c", "d"), ("a", "d")]
    return _clique_problem(cvxdp.MarginalPolytope, dom, cliques, loss, rng)


def local_polytope(cells, loss):
    rng = np.random.default_rng(4)
    s = max(int(round(cells ** 0.5 / 2)), 2)
    dom = cvxdp.Domain({"a": s, "b": s, "c": s, "d": s})
    cliques = [("a", "b"), ("b", "c"), ("c", "d"), ("a", "d")]
    return _clique_problem(cvxdp.LocalPolytope, dom, cliques, loss, rng)


def newton_cg(d, loss):
    W = cvxdp.workloads.prefix(d)
    return cvxdp.fitness_problem(W, np.linspace(1.0, 2.0, d)).problem


# family -> (builder, sizes (the builder's argument), method, losses)
FAMILIES = {
    "admm_tree": (admm_tree, [2 ** 6, 2 ** 8, 2 ** 10, 2 ** 12, 2 ** 14], cvxdp.ADMM,
                  ("l1", "l2", "mixed")),
    "admm_general": (admm_general, [64, 256, 1024, 4096, 16384, 32768], cvxdp.ADMM, ("l1", "l2", "mixed")),
    "admm_general_inside": (admm_general_inside, [64, 256, 1024, 4096, 16384, 32768], cvxdp.ADMM,
                            ("l2",)),
    "admm_order": (admm_order, [100, 400, 1600, 6400, 25600], cvxdp.ADMM, ("l2", "mixed")),
    "general_exact": (general_exact, [100, 300, 1000, 3000], cvxdp.ADMM, ("l1", "l2", "mixed")),
    "histogram_tree": (histogram_tree, [50, 200, 1000, 4000], cvxdp.ADMM, ("l1", "l2")),
    "marginal_polytope": (marginal_polytope, [125, 1000, 8000, 27000, 125000], cvxdp.MIRROR_DESCENT,
                          ("l1", "l2")),
    "local_polytope": (local_polytope, [100, 400, 1600, 6400], cvxdp.ADMM, ("l1", "l2")),
    "newton_cg": (newton_cg, [3, 4, 6, 8, 12, 16], cvxdp.NEWTON_CG, (None,)),
}


#: families whose times are not a line in log-log: the cost model keeps the measured points
POINTS = ("general_exact",)


def timed(build, **solve):
    prob = build()
    t = time.perf_counter()
    prob.solve(**solve)
    return time.perf_counter() - t, prob


def calibrate(name: str, repeat: int) -> dict[str, tuple]:
    """Measured points and the fitted ``(a, b, c, d)`` of every loss of one family."""
    make, sizes, method, losses = FAMILIES[name]
    fits = {}
    for loss in losses:
        pts, key = [], name
        try:            # the first solve of a family pays imports and first-call costs
            timed(lambda: make(sizes[0], loss), method="cvxdp", solver=method)
            timed(lambda: make(sizes[0], loss), solver=cp.CLARABEL, **TIGHT)
        except cvxdp.NotRecognised:
            pass
        for s in sizes:
            build = lambda s=s, loss=loss: make(s, loss)         # noqa: E731
            try:
                key, size = size_of(method, build())
            except cvxdp.NotRecognised:
                print(f"{name}/{loss}: not recognised by {method}; skipped", flush=True)
                break
            tc = min(timed(build, method="cvxdp", solver=method)[0] for _ in range(repeat))
            ts = min(timed(build, solver=cp.CLARABEL, **TIGHT)[0] for _ in range(repeat))
            pts.append((size, tc, ts))
            print(f"{key:26s} size {size:>9,d}  cvxdp {tc:8.4f} s  Clarabel {ts:8.4f} s  "
                  f"ratio {ts / tc:6.2f}x", flush=True)
        if len(pts) >= 2 and name in POINTS:
            fits[key] = tuple((int(n), round(tc, 4), round(ts, 4)) for n, tc, ts in pts)
        elif len(pts) >= 2:
            logs = np.log(np.array(pts, dtype=float))
            fc = np.polyfit(logs[:, 0], logs[:, 1], 1)
            fs = np.polyfit(logs[:, 0], logs[:, 2], 1)
            fits[key] = (round(float(fc[1]), 3), round(float(fc[0]), 3),
                         round(float(fs[1]), 3), round(float(fs[0]), 3))
    return fits


#: the other standard solvers, with the settings that make them as accurate as the cvxdp
#: methods' 1e-6 certificate: HiGHS for the L1 (linear-program) losses, OSQP (polished) for L2
OTHERS = {"l1": (cp.HIGHS, {}),
          "l2": (cp.OSQP, dict(eps_abs=1e-7, eps_rel=1e-7, polish=True, max_iter=100_000))}


def standards(repeat: int) -> None:
    """Why Clarabel is ``solver=None``'s standard solver: it against HiGHS (L1) and OSQP (L2)
    at the sizes where the standard solver is chosen (the first three of each family)."""
    for name, (make, sizes, _, losses) in FAMILIES.items():
        for loss in losses:
            if loss not in OTHERS:
                continue
            other, opts = OTHERS[loss]
            for s in sizes[:3]:
                build = lambda s=s, loss=loss: make(s, loss)         # noqa: E731
                tc, pc = min((timed(build, solver=cp.CLARABEL) for _ in range(repeat)),
                             key=lambda r: r[0])
                to, po = min((timed(build, solver=other, **opts) for _ in range(repeat)),
                             key=lambda r: r[0])
                diff = abs(pc.value - po.value) / max(1.0, abs(pc.value))
                print(f"{name + '/' + loss:26s} arg {s:>6d}  Clarabel {tc:8.4f} s  {other} "
                      f"{to:8.4f} s ({po.status}, objective {diff:.1e} apart)  "
                      f"Clarabel / {other} {tc / to:5.2f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--standards", action="store_true",
                    help="only compare Clarabel with HiGHS (L1) and OSQP (L2) at small sizes")
    args = ap.parse_args()
    if args.standards:
        standards(args.repeat)
        return
    fits = {}
    for name in args.families.split(","):
        fits.update(calibrate(name, args.repeat))
    print("\nFITS = {  # family/loss: (a, b) of log t = a + b log size for cvxdp, then for Clarabel")
    for name, f in fits.items():
        print(f"    {name!r}: {f},")
    print("}")


if __name__ == "__main__":
    main()

"""``python -m cvxdp tour``: every implemented family, custom method vs standard solver.

Each row builds a seeded problem, solves it with ``prob.solve(method="cvxdp")``
(``solver=None``: the cvxdp method or Clarabel, whichever the cost model expects to be
faster -- the method column says which) and with a standard solver at tight tolerances
through the same cvxpy model, and reports the objective, the relative objective gap to the
standard solver, the wall time of each ``prob.solve`` call and the speed-up.  Real data (Adult) is used when
``../shared/data/adult`` (or ``$CVXDP_ADULT_DIR``) is present.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import scipy.sparse as sp
import cvxpy as cp

from .modelling import mechanisms, workloads
from .modelling.constraints import consistent
from .modelling.domain import Domain
from .modelling.atoms import privacy_cost, query_variance
from .modelling.fitness import fitness_problem
from .modelling.losses import elastic_net, nll
from .modelling.marginal_polytope import MarginalPolytope
from .names import ADMM, MIRROR_DESCENT, NEWTON_CG

__all__ = ["run_tour", "TourRow", "adult_dir", "format_header", "format_row", "format_rows"]

# The reference solver runs with tight tolerances so that the gap column measures
# cvxdp's accuracy, not Clarabel's (its defaults stop ~1e-6 off on these problems).
_TIGHT = dict(tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)


@dataclass
class TourRow:
    problem: str
    size: str
    method: str
    objective: float
    gap: float
    time: float
    reference: str
    reference_time: float

    @property
    def speedup(self) -> float:
        return self.reference_time / self.time if self.time > 0 else float("nan")


def adult_dir() -> Path | None:
    """The Adult data directory if present (``$CVXDP_ADULT_DIR`` or ``../shared/data/adult``)."""
    env = os.environ.get("CVXDP_ADULT_DIR")
    cands = [Path(env)] if env else []
    here = Path(__file__).resolve()
    cands += [here.parents[2] / "shared" / "data" / "adult", Path.cwd().parent / "shared" / "data" / "adult"]
    for c in cands:
        if (c / "adult.csv").exists():
            return c
    return None


def _sparse_counts(n: int, rng: np.random.Generator) -> np.ndarray:
    x = np.zeros(n)
    nz = rng.random(n) > 0.9
    x[nz] = np.floor(rng.pareto(1.5, nz.sum()) * 10) + 1
    return x


def _compare(name: str, size: str, build: Callable[[], cp.Problem], method: str, reference: str,
             ref_opts: dict, method_opts: dict) -> TourRow:
    prob = build()
    t0 = time.perf_counter()
    prob.solve(method="cvxdp", solver=reference, **ref_opts)
    t_ref = time.perf_counter() - t0
    ref_val = prob.value
    prob = build()
    t0 = time.perf_counter()
    prob.solve(method="cvxdp", **method_opts)          # solver=None: chosen by cost
    t_m = time.perf_counter() - t0
    chosen = prob.solver_stats.solver_name
    if chosen not in (method, reference):
        raise RuntimeError(f"tour row {name!r}: solver=None chose {chosen}, expected {method} "
                           f"or {reference}")
    gap = (prob.value - ref_val) / max(1.0, abs(ref_val))
    return TourRow(name, size, chosen.removeprefix("CVXDP_"), prob.value, gap, t_m, reference,
                   t_ref)


def _hierarchy_rows(n_leaves: int, eps: float) -> list[TourRow]:
    rng = np.random.default_rng(0)
    tree = workloads.hierarchy(n_leaves, 2)
    y = mechanisms.laplace(tree.queries, _sparse_counts(n_leaves, rng), epsilon=eps, rng=1)

    def build(loss):
        def make():
            x = cp.Variable(tree.n_nodes)
            obj = nll(y, x) if loss == "l1" else elastic_net(y, x, alpha=0.9)
            return cp.Problem(cp.Minimize(obj), [consistent(tree, x), x >= 0])
        return make

    size = f"2^{int(np.log2(n_leaves))} leaves"
    opts = dict(eps_rel=1e-6)
    return [
        _compare("hierarchy L1 (Laplace MLE)", size, build("l1"), ADMM, cp.CLARABEL, _TIGHT, opts),
        _compare("hierarchy elastic net", size, build("en"), ADMM, cp.CLARABEL, _TIGHT, opts),
    ]


def _table_rows(fast: bool = False) -> list[TourRow]:
    d = adult_dir()
    attrs = ["workclass", "race", "sex", "relationship", "income>50K"][: 3 if fast else 5]
    if d is not None:
        import json
        domain = json.loads((d / "adult-domain.json").read_text())
        sizes = tuple(domain[a] for a in attrs)
        cols = _read_columns(d / "adult.csv", attrs)
        counts = np.bincount(np.ravel_multi_index(cols.T, sizes), minlength=int(np.prod(sizes)))
        label = "Adult table"
    else:
        sizes = (9, 5, 2, 6, 2)[: len(attrs)]
        counts = _sparse_counts(int(np.prod(sizes)), np.random.default_rng(3)) * 20
        label = "synthetic table"
    counts = counts.astype(float)
    Q = workloads.marginals(sizes, [(i,) for i in range(len(sizes))])
    known = Q @ counts
    y = mechanisms.laplace(sp.identity(counts.size, format="csr"), counts, epsilon=0.5, rng=2)

    def make():
        z = cp.Variable(counts.size)
        return cp.Problem(cp.Minimize(nll(y, z)), [Q @ z == known, z >= 0])

    return [_compare(f"{label} L1 + 1-way marginals", f"{counts.size} cells", make, ADMM,
                     cp.CLARABEL, _TIGHT, dict(eps_rel=1e-6))]


def _read_columns(path: Path, attrs: list[str]) -> np.ndarray:
    with open(path) as fh:
        header = fh.readline().strip().split(",")
    idx = [header.index(a) for a in attrs]
    return np.loadtxt(path, delimiter=",", skiprows=1, usecols=idx, dtype=np.int64)


def _sorted_rows(fast: bool = False) -> list[TourRow]:
    rng = np.random.default_rng(4)
    degrees = np.sort(np.floor(rng.pareto(1.2, 300 if fast else 2000) * 3))
    noisy = degrees + rng.laplace(scale=2.0, size=degrees.size)

    def make():
        x = cp.Variable(degrees.size)
        return cp.Problem(cp.Minimize(cp.norm1(x - noisy) / 2.0), [x[:-1] <= x[1:], x >= 0])

    return [_compare("sorted degree sequence L1", f"{degrees.size} values", make, ADMM,
                     cp.CLARABEL, _TIGHT, dict(eps_rel=1e-6))]


def _fitness_rows(d: int) -> list[TourRow]:
    """Fitness for use (Xiao et al. 2021): per-query variance targets on the prefix workload."""

    W = np.tril(np.ones((d, d)))
    c = np.linspace(1.0, 2.0, d)

    def make():
        return fitness_problem(W, c).problem

    return [_compare("fitness for use, prefix targets", f"d = {d}", make, NEWTON_CG, cp.CLARABEL,
                     _TIGHT, dict(eps_rel=1e-7))]


def _design_rows(k: int) -> list[TourRow]:
    """Noise design for a marginal workload in the residual basis (ResidualPlanner, NeurIPS
    2023): all three-way marginals of ``k`` attributes, per-marginal variance targets."""
    import itertools
    rng = np.random.default_rng(6)
    sizes = rng.integers(2, 21, k).tolist()
    W = workloads.marginal_workload(sizes, list(itertools.combinations(range(k), 3)))
    c = rng.uniform(0.5, 2.0, W.n_marginals)

    def make():
        s = cp.Variable(W.n_residuals, pos=True)
        return cp.Problem(cp.Minimize(privacy_cost(W, s)), [query_variance(W, s) <= c])

    return [_compare("marginal workload design (residual)", f"{W.n_marginals:,} marginals", make,
                     NEWTON_CG, cp.CLARABEL, _TIGHT, dict(eps_rel=1e-8))]


def _marginal_rows(fast: bool) -> list[TourRow]:
    """Marginal polytope (McKenna et al. 2019): noisy Adult marginals (or synthetic) -> one
    consistent distribution; MIRROR_DESCENT vs Clarabel on the junction tree's local polytope."""

    d = adult_dir()
    attrs = ["workclass", "race", "sex", "relationship", "income>50K"]
    rng = np.random.default_rng(5)
    if d is not None:
        dom = Domain.from_json(d / "adult-domain.json").project(attrs)
        data = _read_columns(d / "adult.csv", attrs)
        label = "Adult marginals"
    else:
        dom = Domain({"workclass": 9, "race": 5, "sex": 2, "relationship": 6, "income>50K": 2})
        data = np.column_stack([rng.integers(0, s, 5000) for s in dom.sizes])
        label = "synthetic marginals"
    cliques = [("workclass", "race"), ("race", "sex"), ("sex", "relationship"),
               ("relationship", "workclass"), ("relationship", "income>50K")]
    if fast:
        cliques = cliques[:3]
    sigma = 10.0
    noisy = {c: dom.count(data, c) + rng.normal(0, sigma, dom.shape(c)) for c in cliques}

    def make():
        mus = {c: cp.Variable(dom.shape(c)) for c in cliques}
        obj = sum(cp.sum_squares(mus[c] - noisy[c]) for c in cliques) / (2 * sigma ** 2)
        return cp.Problem(cp.Minimize(obj), [MarginalPolytope(mus, dom, total=float(len(data)))])

    return [_compare(f"{label} L2, MarginalPolytope", f"{len(cliques)} cliques", make,
                     MIRROR_DESCENT, cp.CLARABEL, _TIGHT, dict(eps_rel=1e-6, time_limit=30))]


def run_tour(fast: bool = False, on_row: Callable[[TourRow], None] | None = None) -> list[TourRow]:
    """Build and solve every row; ``fast`` shrinks every size (for tests and a quick look);
    ``on_row`` is called with each row as soon as it is solved."""
    groups = [lambda: _hierarchy_rows(2 ** (8 if fast else 14), 1.0),
              lambda: _table_rows(fast),
              lambda: _sorted_rows(fast),
              lambda: _fitness_rows(8 if fast else 16),
              lambda: _design_rows(8 if fast else 30),
              lambda: _marginal_rows(fast)]
    rows = []
    for group in groups:
        for row in group():
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows


# column widths: wide enough for every method and reference name
_W_METHOD = max(len(m) for m in ("ADMM", "MIRROR_DESCENT", "NEWTON_CG", cp.CLARABEL))
_W_REF = max(len(r) for r in (cp.CLARABEL, cp.HIGHS, cp.OSQP, cp.SCS))


def format_header() -> str:
    head = (f"{'problem':<40s} {'size':>16s} {'method':>{_W_METHOD}s} {'objective':>16s} {'gap':>9s} "
            f"{'time [s]':>9s} {'reference':>{max(_W_REF, 9)}s} {'ref [s]':>8s} {'speed-up':>8s}")
    return head + "\n" + "-" * len(head)


def format_row(r: TourRow) -> str:
    return (f"{r.problem:<40s} {r.size:>16s} {r.method:>{_W_METHOD}s} {r.objective:>16.8g} "
            f"{r.gap:>9.1e} {r.time:>9.3f} {r.reference:>{max(_W_REF, 9)}s} {r.reference_time:>8.3f} "
            f"{r.speedup:>7.1f}x")


def format_rows(rows: list[TourRow]) -> str:
    return "\n".join([format_header()] + [format_row(r) for r in rows])

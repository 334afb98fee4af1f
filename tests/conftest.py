"""Shared instance builders and reference solves for the test suite."""
from __future__ import annotations

import numpy as np
import pytest
import cvxpy as cp

import cvxdp

# Tolerances of reference solves: Clarabel tightened so it is the yardstick.
CLARABEL_TIGHT = dict(tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10, max_iter=500)


def random_parent(rng: np.random.Generator, n: int, root_prob: float = 0.0) -> np.ndarray:
    """A random forest on ``n`` nodes as a parent array with shuffled labels: node ``v``
    hangs under an earlier node, or (with probability ``root_prob``) is another root."""
    parent = np.full(n, -1)
    for v in range(1, n):
        new_root = root_prob > 0 and rng.random() < root_prob
        parent[v] = -1 if new_root else rng.integers(0, v)
    perm = rng.permutation(n)
    out = np.full(n, -1)
    for v in range(n):
        if parent[v] >= 0:
            out[perm[v]] = perm[parent[v]]
    return out


def sparse_counts(n: int, rng: np.random.Generator, zero_frac: float = 0.7) -> np.ndarray:
    """Heavy-tailed sparse counts, like the histograms of the papers' data sets."""
    x = np.zeros(n)
    nz = rng.random(n) > zero_frac
    x[nz] = np.floor(rng.pareto(1.5, nz.sum()) * 10) + 1
    return x


def reference(problem: cp.Problem, solver: str = cp.CLARABEL, **opts):
    """Solve ``problem`` with a standard solver; return (value, {var: value}, {con: dual})."""
    if solver == cp.CLARABEL and not opts:
        opts = CLARABEL_TIGHT
    problem.solve(solver=solver, **opts)
    assert problem.status == cp.OPTIMAL, problem.status
    vals = {v.id: np.array(v.value, dtype=float, copy=True) for v in problem.variables()}
    duals = {c.id: None if c.dual_value is None else np.array(c.dual_value, dtype=float, copy=True)
             for c in problem.constraints}
    return problem.value, vals, duals


def solve_admm(problem: cp.Problem, **opts):
    opts.setdefault("eps_rel", 1e-9)
    opts.setdefault("warm_start", False)
    problem.solve(method="cvxdp", solver=cvxdp.ADMM, **opts)
    vals = {v.id: np.array(v.value, dtype=float, copy=True) for v in problem.variables()}
    duals = {c.id: None if c.dual_value is None else np.array(c.dual_value, dtype=float, copy=True)
             for c in problem.constraints}
    return problem.value, vals, duals


def max_violation(problem: cp.Problem) -> float:
    worst = 0.0
    for c in problem.constraints:
        worst = max(worst, float(np.max(np.atleast_1d(c.violation()))))
    for v in problem.variables():
        if v.attributes.get("nonneg"):
            worst = max(worst, float(np.max(-np.minimum(v.value, 0))))
    return worst


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


def random_forest(n, rng, p_root=0.1):
    """A random forest on ``n`` nodes as a parent array (a new root with probability
    ``p_root``), relabelled so the order is not breadth first."""
    parent = np.full(n, -1)
    for v in range(1, n):
        if rng.random() > p_root:
            parent[v] = rng.integers(0, v)
    perm = rng.permutation(n)            # relabel so the order is not breadth first
    inv = np.argsort(perm)
    return np.where(parent[inv] >= 0, perm[np.maximum(parent[inv], 0)], -1)


def complete_parent(k, h):
    """The parent array of the complete ``k``-ary tree of height ``h``, breadth first."""
    n = (k ** (h + 1) - 1) // (k - 1)
    parent = np.r_[-1, (np.arange(1, n) - 1) // k]
    return parent


@pytest.fixture(scope="session")
def client():
    """One real 2-worker ``distributed.LocalCluster`` for every Dask test of the session
    (topdown, solve_many, error_bars): starting one costs seconds."""
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=None)
    c = distributed.Client(cluster)
    yield c
    c.close()
    cluster.close()

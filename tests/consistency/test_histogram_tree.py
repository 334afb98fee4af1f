"""A histogram at every unit of a geography, written in cvxpy and solved by ``cvxdp.ADMM``.

``cvxdp.HierarchicalHistogram(geo, X)`` and the plain ``geo.consistency @ X == 0`` are read
as a tree of histograms (:mod:`cvxdp.solvers.consistency.histogram_tree`): the exact GLS, with exact
invariants, and the non-negative ADMM, against Clarabel on the same model (objective,
solution, the consistency constraint's duals); models outside the structure still solve by
the general ADMM.
"""
from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest
import cvxpy as cp

import cvxdp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
import stress  # noqa: E402

TIGHT = dict(tol_gap_abs=1e-11, tol_gap_rel=1e-11, tol_feas=1e-11)


def instance(seed, k=3):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 30))
    parent = np.full(n, -1)
    for v in range(1, n):
        parent[v] = rng.integers(0, v)
    geo = cvxdp.workloads.geography(parent)
    truth = geo.aggregate(rng.poisson(0.6, (geo.leaves.size, k)).astype(float))
    Y = truth + rng.normal(0, 1.5, truth.shape)
    Q = rng.integers(0, 2, (2, k)).astype(float)
    Q[0, 0] = 1.0
    Ym = truth[geo.internal] @ Q.T + rng.normal(0, 0.5, (geo.internal.size, 2))
    return geo, k, truth, Y, Q, Ym


def model(geo, k, Y, Q, Ym, nonneg, spelling, invariant=None):
    X = cp.Variable((geo.n_nodes, k))
    obj = cp.sum_squares(X - Y) / (2 * 1.5 ** 2) + cp.sum_squares(X[geo.internal] @ Q.T - Ym) / (2 * 0.5 ** 2)
    cons = [cvxdp.HierarchicalHistogram(geo, X) if spelling == "class" else geo.consistency @ X == 0]
    if nonneg:
        cons.append(X >= 0)
    if invariant is not None:
        units, totals = invariant
        cons.append(cp.sum(X[units], axis=1) == totals)
    return cp.Problem(cp.Minimize(obj), cons), X


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("nonneg", [False, True])
def test_against_clarabel(seed, nonneg):
    geo, k, truth, Y, Q, Ym = instance(seed)
    prob, X = model(geo, k, Y, Q, Ym, nonneg, "class" if seed % 2 else "plain")
    prob.solve(method="cvxdp", solver=cvxdp.ADMM, eps_rel=1e-9)
    assert prob.status == "optimal"
    assert prob.solver_stats.extra_stats["info"]["route"].startswith("tree ")
    ours, x_ours, dual = prob.value, X.value, prob.constraints[0].dual_value
    lam_ours = prob.constraints[1].dual_value if nonneg else None
    assert dual is not None
    prob.solve(solver=cp.CLARABEL, **TIGHT)
    assert ours == pytest.approx(prob.value, rel=1e-8, abs=1e-8)
    np.testing.assert_allclose(x_ours, X.value, atol=1e-3 if nonneg else 1e-6)
    np.testing.assert_allclose(geo.consistency @ x_ours, 0, atol=1e-9)
    if nonneg:
        # the duals are not unique (inner units at zero): check that ours certify
        assert np.all(x_ours >= 0)
        assert_duals_certify(geo, k, Y, Q, Ym, x_ours, dual, lam_ours)
    else:
        np.testing.assert_allclose(dual, prob.constraints[0].dual_value, atol=1e-7)


def assert_duals_certify(geo, k, Y, Q, Ym, x, nu, lam):
    """The written duals certify ``x``: ``lam >= 0`` (the dual of ``X >= 0``) and the minimum
    of the Lagrangian ``f(z) + nu^T C z - lam^T z`` -- a lower bound on the optimum -- is
    within rounding of ``f(x)``."""
    sig, sm = 1.5, 0.5
    n = geo.n_nodes
    H = np.array([np.eye(k) / sig ** 2 for _ in range(n)])
    H[geo.internal] += Q.T @ Q / sm ** 2
    lin = Y / sig ** 2
    lin[geo.internal] += Ym @ Q / sm ** 2

    def f(z):
        return 0.5 * np.sum((z - Y) ** 2) / sig ** 2 + 0.5 * np.sum((z[geo.internal] @ Q.T - Ym) ** 2) / sm ** 2
    assert lam.min() >= 0
    cnu = geo.consistency.T @ nu
    z = np.array([np.linalg.solve(H[v], lin[v] - cnu[v] + lam[v]) for v in range(n)])
    bound = f(z) + float(np.sum(cnu * z)) - float(np.sum(lam * z))
    assert f(x) - 1e-8 * max(1.0, f(x)) <= bound <= f(x) + 1e-9 * max(1.0, f(x))


@pytest.mark.parametrize("seed", range(5))
def test_exact_invariants(seed):
    geo, k, truth, Y, Q, Ym = instance(seed)
    units = np.r_[np.flatnonzero(geo.parent < 0), geo.children(int(np.flatnonzero(geo.parent < 0)[0]))]
    totals = truth[units].sum(axis=1)
    prob, X = model(geo, k, Y, Q, Ym, False, "class", (units, totals))
    prob.solve(method="cvxdp", solver=cvxdp.ADMM, eps_rel=1e-9)
    assert prob.status == "optimal"
    assert prob.solver_stats.extra_stats["info"]["route"] == "tree GLS (exact)"
    ours, x_ours = prob.value, X.value
    np.testing.assert_allclose(x_ours[units].sum(axis=1), totals, atol=1e-9)
    prob.solve(solver=cp.CLARABEL, **TIGHT)
    assert ours == pytest.approx(prob.value, rel=1e-8)
    np.testing.assert_allclose(x_ours, X.value, atol=1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_nonnegative_with_total_invariants(seed):
    """The Census case: exact totals at the root and its children, X >= 0.  The tree route
    reads no multipliers of the invariants; the exact route finishes with certified ones,
    checked by the Lagrangian (stress's closed check against Clarabel's optimum)."""
    geo, k, truth, Y, Q, Ym = instance(seed)
    root = int(np.flatnonzero(geo.parent < 0)[0])
    units = np.r_[root, geo.children(root)]
    totals = truth[units].sum(axis=1)
    ref_prob, _ = model(geo, k, Y, Q, Ym, True, "class", (units, totals))
    ref_prob.solve(solver=cp.CLARABEL, **TIGHT)
    prob, X = model(geo, k, Y, Q, Ym, True, "class", (units, totals))
    prob.solve(method="cvxdp", solver=cvxdp.ADMM, eps_rel=1e-8)
    assert prob.status == "optimal"
    assert prob.solver_stats.extra_stats["info"]["route"].startswith("tree ADMM (non-negative GLS)")
    ours, x_ours = prob.value, X.value
    assert stress.dual_check(prob, ref_prob.value) == ("ok", "")     # (it re-solves over X)
    assert np.all(x_ours >= 0)
    np.testing.assert_allclose(x_ours[units].sum(axis=1), totals, atol=1e-9)
    np.testing.assert_allclose(geo.consistency @ x_ours, 0, atol=1e-9)
    prob.solve(solver=cp.CLARABEL, **TIGHT)
    assert ours == pytest.approx(prob.value, rel=1e-7)


def test_noise_free_histograms_are_reproduced():
    geo, k, truth, Y, Q, Ym = instance(11)
    prob, X = model(geo, k, truth, Q, truth[geo.internal] @ Q.T, False, "class")
    prob.solve(method="cvxdp", solver=cvxdp.ADMM)
    np.testing.assert_allclose(X.value, truth, atol=1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_l1_with_nonnegativity_takes_the_tree_path(seed):
    """Laplace maximum likelihood: absolute losses per unit with X >= 0, against HiGHS's LP."""
    geo, k, truth, Y, Q, Ym = instance(seed)
    X = cp.Variable((geo.n_nodes, k))
    obj = cp.sum(cp.abs(X - Y)) / 1.5 + cp.sum(cp.abs(X[geo.internal] @ Q.T - Ym)) / 0.5
    prob = cp.Problem(cp.Minimize(obj), [cvxdp.HierarchicalHistogram(geo, X), X >= 0])
    prob.solve(method="cvxdp", solver=cvxdp.ADMM, eps_rel=1e-7)
    assert prob.status == "optimal"
    assert prob.solver_stats.extra_stats["info"]["route"] == "tree ADMM (non-negative L1)"
    ours, x_ours = prob.value, X.value
    nu, lam = prob.constraints[0].dual_value, prob.constraints[1].dual_value
    assert np.all(x_ours >= 0)
    np.testing.assert_allclose(geo.consistency @ x_ours, 0, atol=1e-9)
    assert prob.solver_stats.extra_stats["duals_certified"]
    assert_l1_duals_certify(geo, Y, Q, Ym, x_ours, nu, lam)
    prob.solve(solver=cp.HIGHS)
    assert ours == pytest.approx(prob.value, rel=2e-7)


def assert_l1_duals_certify(geo, Y, Q, Ym, x, nu, lam):
    """``lam >= 0`` and the Lagrangian's minimum over all ``Z`` (an LP, solved by HiGHS),
    ``min f(Z) + nu^T C Z - lam^T Z``, is a lower bound within the certified gap of ``f(x)``."""
    def f(z):
        return cp.sum(cp.abs(z - Y)) / 1.5 + cp.sum(cp.abs(z[geo.internal] @ Q.T - Ym)) / 0.5
    assert lam.min() >= 0
    Z = cp.Variable(x.shape)
    lagr = cp.Problem(cp.Minimize(f(Z) + cp.sum(cp.multiply(geo.consistency.T @ nu, Z))
                                  - cp.sum(cp.multiply(lam, Z))))
    lagr.solve(solver=cp.HIGHS)
    assert lagr.status == cp.OPTIMAL          # bounded: the duals are dual feasible
    fx = f(x).value
    assert fx * (1 - 2e-7) - 1e-9 <= lagr.value <= fx + 1e-9 * max(1.0, fx)


def test_outside_the_structure_the_general_admm_runs():
    """Mixed L1 and squared losses are not the tree path: the general ADMM solves them."""
    geo, k, truth, Y, Q, Ym = instance(2)
    X = cp.Variable((geo.n_nodes, k), nonneg=True)
    prob = cp.Problem(cp.Minimize(cp.sum(cp.abs(X - Y)) + cp.sum_squares(X[geo.internal] @ Q.T - Ym)),
                      [cvxdp.HierarchicalHistogram(geo, X)])
    prob.solve(method="cvxdp", solver=cvxdp.ADMM, eps_rel=1e-6)
    assert prob.status == "optimal"
    assert not str(prob.solver_stats.extra_stats["info"]["route"]).startswith("tree ")
    ours = prob.value
    prob.solve(solver=cp.CLARABEL)
    assert ours == pytest.approx(prob.value, rel=1e-5)


def test_constraint_refusals():
    geo = cvxdp.workloads.geography(np.array([-1, 0, 0]))
    with pytest.raises(ValueError, match="one row per unit"):
        cvxdp.HierarchicalHistogram(geo, cp.Variable((4, 2)))
    con = cvxdp.HierarchicalHistogram(geo, cp.Variable((3, 2)))
    assert con.geography is geo and "HierarchicalHistogram" in repr(con)


@pytest.mark.parametrize("shape", [(1, 3), (7, 1), (500, 2), (400, 5), (300, 64)])
def test_row_ids_group_exactly_the_equal_rows(shape):
    from cvxdp.solvers.consistency.histogram_tree import _row_ids
    rng = np.random.default_rng(shape[0] + shape[1])
    base = rng.integers(0, 3, (max(shape[0] // 5, 1), shape[1])).astype(float) * 0.37
    T = base[rng.integers(0, base.shape[0], shape[0])]
    ids = _row_ids(T)
    assert ids.shape == (shape[0],) and ids.min() == 0
    same = np.all(T[:, None, :] == T[None, :, :], axis=2)
    np.testing.assert_array_equal(same, ids[:, None] == ids[None, :])
    assert ids.max() + 1 == np.unique(T, axis=0).shape[0]


def _per_unit(blocks, n, k):
    """Each unit's information ``sum Q^T diag(w) Q`` and linear term ``sum Q^T diag(w) y``."""
    H, g = np.zeros((n, k, k)), np.zeros((n, k))
    for b in blocks:
        H[b.nodes] += b.info
        g[b.nodes] += (b.y * b.w) @ b.Q
    return H, g


@pytest.mark.parametrize("seed", range(4))
def test_loss_terms_read_whole_match_the_row_grouping(seed):
    """Blocks read off whole ``X[units] @ Q.T - Y`` terms carry the same information and
    linear terms per unit as the row-by-row grouping; terms whose rows are not alike across
    units (per-unit weights, a unit selected twice) fall back to the grouping."""
    from cvxdp.recognise.consistency import recognise
    from cvxdp.solvers.consistency.histogram_tree import _row_groups
    from cvxdp.solvers.tree.gls import Block
    geo, k, truth, Y, Q, Ym = instance(seed, k=4)
    rng = np.random.default_rng(seed)
    X = cp.Variable((geo.n_nodes, k))
    twice = np.r_[geo.internal, geo.internal[:1]]
    W = rng.uniform(0.5, 2.0, Y.shape)
    obj = (cp.sum_squares(X[geo.internal] @ Q.T - Ym) + cp.sum_squares(cp.multiply(W, X - Y))
           + 3 * cp.sum_squares(X[twice] @ Q.T - np.r_[Ym, Ym[:1]]) + cp.sum_squares(X[geo.leaves] - Y[geo.leaves]))
    data = recognise(cp.Problem(cp.Minimize(obj), [geo.consistency @ X == 0])).data
    assert data.loss_starts.size == 4
    n = geo.n_nodes
    fast = _row_groups(data.M, data.y, n, k, Block, data.w2, starts=data.loss_starts)
    slow = _row_groups(data.M, data.y, n, k, Block, data.w2)
    for a, b in zip(_per_unit(fast, n, k), _per_unit(slow, n, k)):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-12)
    # two of the four terms are read whole (a block each); the other rows are grouped per unit
    whole = [b for b in fast if b.nodes.size in (geo.internal.size, geo.leaves.size) and b.Q.shape[0] in (2, k)]
    assert len(whole) >= 2


def test_terms_outside_the_kronecker_layout_still_solve():
    geo, k, truth, Y, Q, Ym = instance(5)
    rng = np.random.default_rng(5)
    X = cp.Variable((geo.n_nodes, k))
    W = rng.uniform(0.5, 2.0, Y.shape)
    twice = np.r_[geo.internal, geo.internal[:1]]
    obj = cp.sum_squares(cp.multiply(W, X - Y)) + cp.sum_squares(X[twice] @ Q.T - np.r_[Ym, Ym[:1]])
    prob = cp.Problem(cp.Minimize(obj), [cvxdp.HierarchicalHistogram(geo, X), X >= 0])
    prob.solve(method="cvxdp", solver=cvxdp.ADMM, eps_rel=1e-9)
    assert prob.status == "optimal"
    assert prob.solver_stats.extra_stats["info"]["route"].startswith("tree ")
    ours = prob.value
    prob.solve(solver=cp.CLARABEL, **TIGHT)
    assert ours == pytest.approx(prob.value, rel=1e-7)

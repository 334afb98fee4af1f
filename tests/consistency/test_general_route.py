"""The consistency family's general route (issue 26, item 5): loss rows that are not
separable, equalities that are no tree.  Pure L1 is solved as an LP by HiGHS, squared and
elastic-net rows by the interior point of ``cvxdp.solvers.consistency.ipm`` with its
active-set polish; both go through the family's certificate.  Checked against Clarabel:
status, objective, feasibility, the route, and the duals on every constraint by the
Lagrangian (stationarity, signs, complementarity and the dual value)."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import cvxpy as cp

import cvxdp
from cvxdp.solvers.consistency.newton_assembly import NewtonAssembly

# pure L1: HiGHS's dual simplex on small LPs, its interior point on larger ones
ROUTES = {"l1": ("LP (HiGHS dual simplex)", "LP (HiGHS interior point)"),
          "en": ("QP (interior point)",), "l2": ("QP (interior point)",)}
TIGHT = dict(tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)


def instance(n, loss, bounds, seed, dup=False, free=False):
    """``M`` = identity on a sparse random 0/1 block, ``E x = E x_true`` (random sparse rows,
    ``dup``: the first row twice), ``x >= 0`` / ``0 <= x <= u`` (``free``: no bounds)."""
    rng = np.random.default_rng(seed)
    x_true = np.floor(rng.pareto(1.5, n) * 5) * (rng.random(n) < 0.5)
    R = sp.csr_matrix((np.ones(3 * n), (rng.integers(0, n, 3 * n), rng.integers(0, n, 3 * n))), shape=(n, n))
    R.data[:] = 1.0
    M = sp.vstack([sp.identity(n), R]).tocsr()
    y = M @ x_true + rng.laplace(scale=2.0, size=M.shape[0])
    E = sp.random(max(n // 10, 2), n, density=0.2, random_state=seed, format="csr")
    E.data[:] = 1.0
    if dup:
        E = sp.vstack([E, E[0]]).tocsr()
    x = cp.Variable(n)
    r = M @ x - y
    obj = loss_expr(loss, r)
    cons = [E @ x == E @ x_true]
    if not free:
        cons.append(x >= 0)
    if bounds == "box":
        cons.append(x <= x_true + 1.0)
    return cp.Problem(cp.Minimize(obj), cons), x, M, y


def loss_expr(loss, r):
    return {"l1": cp.norm1(r), "en": 0.9 * cp.norm1(r) + 0.1 * cp.sum_squares(r),
            "l2": cp.sum_squares(r)}[loss]


def lagrangian_check(prob, x, M, y, loss):
    """The duals cvxpy reports certify the point: inequality duals nonnegative and
    complementary, and the Lagrangian dual value ``q(lam) = min_x phi(M x - y) + sum_c
    lam_c^T (lhs_c - rhs_c)(x)`` closes the gap.  ``q`` is computed by Clarabel over a box
    around the optimum (a valid lower bound still: the box holds the optimum, where the
    constraint terms are ``<= 0``)."""
    xv = x.value
    g = np.zeros(x.size)
    const_term = 0.0
    for con in prob.constraints:
        lam = np.atleast_1d(np.asarray(con.dual_value, dtype=float)).ravel()
        assert np.all(np.isfinite(lam))
        expr = con.expr                                    # lhs - rhs (== 0 or <= 0), affine
        coef = _affine_matrix(expr, x)
        g += coef.T @ lam
        const_term += float(lam @ (np.atleast_1d(expr.value).ravel() - coef @ xv))
        if isinstance(con, cp.constraints.Inequality):
            assert lam.min() >= -1e-9
            slack = -np.atleast_1d(expr.value).ravel()
            assert float(np.max(np.abs(lam * slack), initial=0.0)) <= 1e-6 * max(1.0, lam.max(initial=0.0))
    z = cp.Variable(x.size)
    big = 10.0 * (1.0 + float(np.abs(xv).max()))
    q = cp.Problem(cp.Minimize(loss_expr(loss, M @ z - y) + g @ z + const_term),
                   [cp.abs(z) <= big]).solve(solver=cp.CLARABEL, **TIGHT)
    f = prob.value
    assert q <= f + 1e-6 * max(1.0, abs(f))
    assert f - q <= 1e-6 * max(1.0, abs(f)), (f, q)


def _affine_matrix(expr, x):
    """The matrix of an affine expression in ``x`` (by its values at the unit vectors)."""
    saved = x.value
    n = x.size
    x.value = np.zeros(n)
    base = np.atleast_1d(expr.value).ravel().copy()
    cols = []
    for j in range(n):
        e = np.zeros(n)
        e[j] = 1.0
        x.value = e
        cols.append(np.atleast_1d(expr.value).ravel() - base)
    x.value = saved
    return np.column_stack(cols)


@pytest.mark.parametrize("loss", ["l1", "en", "l2"])
@pytest.mark.parametrize("bounds,seed", [("nonneg", 0), ("box", 1)])
def test_general_route_matches_clarabel_with_certified_duals(loss, bounds, seed):
    prob, x, M, y = instance(40, loss, bounds, seed)
    ref = prob.solve(solver=cp.CLARABEL, **TIGHT)
    val = prob.solve(method="cvxdp", solver=cvxdp.ADMM, warm_start=False)
    es = prob.solver_stats.extra_stats
    assert prob.status == cp.OPTIMAL
    assert es["info"]["route"] in ROUTES[loss]
    assert abs(val - ref) <= 1e-6 * max(1.0, abs(ref))
    assert es["gap"] <= 1e-6 and es["duals_certified"]
    for con in prob.constraints:
        assert float(np.max(np.atleast_1d(con.violation()))) <= 1e-6
    lagrangian_check(prob, x, M, y, loss)


@pytest.mark.parametrize("loss", ["l1", "en"])
def test_duplicate_equality_rows(loss):
    prob, x, M, y = instance(30, loss, "nonneg", 2, dup=True)
    ref = prob.solve(solver=cp.CLARABEL, **TIGHT)
    val = prob.solve(method="cvxdp", solver=cvxdp.ADMM, warm_start=False)
    assert prob.status == cp.OPTIMAL and prob.solver_stats.extra_stats["info"]["route"] in ROUTES[loss]
    assert abs(val - ref) <= 1e-6 * max(1.0, abs(ref))
    lagrangian_check(prob, x, M, y, loss)


def test_no_bounds_squared_rows():
    prob, x, M, y = instance(30, "l2", "nonneg", 3, free=True)
    ref = prob.solve(solver=cp.CLARABEL, **TIGHT)
    val = prob.solve(method="cvxdp", solver=cvxdp.ADMM, warm_start=False)
    assert prob.status == cp.OPTIMAL and prob.solver_stats.extra_stats["info"]["route"] in ROUTES["l2"]
    assert abs(val - ref) <= 1e-6 * max(1.0, abs(ref))
    lagrangian_check(prob, x, M, y, "l2")


@pytest.mark.parametrize("loss", ["l1", "en"])
def test_infeasible_constraints(loss):
    prob, x, M, y = instance(20, loss, "nonneg", 4)
    bad = cp.Problem(prob.objective, prob.constraints + [cp.sum(x) == -1.0])
    bad.solve(method="cvxdp", solver=cvxdp.ADMM, warm_start=False)
    assert bad.status == cp.INFEASIBLE


def test_the_admm_route_stays_available():
    prob, x, M, y = instance(20, "en", "nonneg", 5)
    ref = prob.solve(solver=cp.CLARABEL, **TIGHT)
    val = prob.solve(method="cvxdp", solver=cvxdp.ADMM, warm_start=False, general_route="admm")
    assert prob.status == cp.OPTIMAL and prob.solver_stats.extra_stats["info"]["route"] == "ADMM general"
    assert abs(val - ref) <= 1e-6 * max(1.0, abs(ref))


def test_what_does_not_certify_falls_to_the_admm(monkeypatch):
    """A route result that fails the certificate is never reported: the ADMM takes over,
    started from the route's point."""
    from cvxdp.solvers.consistency import general_exact

    prob, x, M, y = instance(20, "en", "nonneg", 6)
    ref = prob.solve(solver=cp.CLARABEL, **TIGHT)
    monkeypatch.setattr(general_exact, "_certified", lambda *a, **k: None)
    val = prob.solve(method="cvxdp", solver=cvxdp.ADMM, warm_start=False)
    assert prob.status == cp.OPTIMAL and prob.solver_stats.extra_stats["info"]["route"] == "ADMM general"
    assert abs(val - ref) <= 1e-6 * max(1.0, abs(ref))


def test_dense_query_rows_assemble_by_the_sparse_product():
    """A dense query matrix (every row reads every column): the row pairs would outnumber the
    Newton matrix's entries n-fold, so H is assembled by the sparse product; same optimum,
    certified duals."""
    rng = np.random.default_rng(8)
    n = 70
    W = rng.standard_normal((n, n))
    xt = rng.poisson(3, n).astype(float)
    y = W @ xt + rng.normal(0, 2, n)
    x = cp.Variable(n)
    prob = cp.Problem(cp.Minimize(cp.sum_squares(W @ x - y)), [x >= 0, cp.sum(x) == xt.sum()])
    asm = NewtonAssembly(sp.csr_matrix(W), sp.csr_matrix(np.ones((1, n))))
    assert asm.T is None
    phi, Hx = rng.uniform(0.5, 2.0, n), rng.uniform(0.0, 1.0, n)
    H = asm.h_matrix(asm.h_values(phi, Hx)).toarray()
    np.testing.assert_allclose(H, W.T @ np.diag(phi) @ W + np.diag(Hx), rtol=1e-12, atol=1e-12)
    ref = prob.solve(solver=cp.CLARABEL, **TIGHT)
    val = prob.solve(method="cvxdp", solver=cvxdp.ADMM, warm_start=False)
    es = prob.solver_stats.extra_stats
    assert prob.status == cp.OPTIMAL and es["info"]["route"] in ROUTES["l2"]
    assert abs(val - ref) <= 1e-6 * max(1.0, abs(ref)) and es["duals_certified"]
    lagrangian_check(prob, x, sp.csr_matrix(W), y, "l2")


def test_row_pair_assembly_equals_the_product():
    rng = np.random.default_rng(9)
    R = sp.random(40, 25, density=0.15, random_state=3, format="csr")
    R = sp.vstack([R, sp.csr_matrix((np.r_[1.0, -1.0, 0.0], ([0, 0, 0], [1, 2, 3])), shape=(1, 25))]).tocsr()
    A = sp.random(3, 25, density=0.3, random_state=4, format="csr")
    asm = NewtonAssembly(R, A)
    assert asm.T is not None
    phi, Hx = rng.uniform(0.5, 2.0, R.shape[0]), rng.uniform(0.0, 1.0, 25)
    H = asm.h_matrix(asm.h_values(phi, Hx)).toarray()
    want = (R.T @ sp.diags(phi) @ R).toarray() + np.diag(Hx)
    np.testing.assert_allclose(H, want, rtol=1e-12, atol=1e-12)
    K = asm.kkt(asm.h_values(phi, Hx), 0.5).toarray()
    np.testing.assert_allclose(K, sp.bmat([[-sp.csc_matrix(want), A.T], [A, 0.5 * sp.identity(3)]]).toarray(),
                               atol=1e-12)
    np.testing.assert_allclose(np.triu(K), asm.kkt(asm.h_values(phi, Hx), 0.5, upper=True).toarray(),
                               atol=1e-12)


@pytest.mark.parametrize("p,dup", [(0, False), (4, False), (4, True)])
def test_dense_kkt_solves_the_regularised_system(p, dup):
    """The dense block elimination against numpy's solve of ``[-H A^T; A d I]``; a matrix
    that is not positive definite is refused; the caller's arrays are left as they were."""
    from cvxdp.solvers.consistency.dense_kkt import DenseKKT
    rng = np.random.default_rng(p + dup)
    n = 30
    R = sp.random(50, n, density=0.1, random_state=p, format="csr")
    H = (R.T @ R + sp.identity(n)).tocsc()
    H.sort_indices()
    A = sp.random(p, n, density=0.3, random_state=p + 1, format="csr")
    if dup:
        A = sp.vstack([A, A[0]]).tocsr()
    d = 1e-8
    kkt = DenseKKT(n, A, (H.indptr, H.indices))
    hdata = H.data.copy()
    assert kkt.factor(hdata, d)
    np.testing.assert_array_equal(hdata, H.data)
    fx, fA = rng.standard_normal(n), rng.standard_normal(A.shape[0])
    fx0, fA0 = fx.copy(), fA.copy()
    dx, dy = kkt.solve(fx, fA)
    np.testing.assert_array_equal(fx, fx0)
    np.testing.assert_array_equal(fA, fA0)
    K = np.block([[-H.toarray(), A.T.toarray()], [A.toarray(), d * np.eye(A.shape[0])]])
    want = np.linalg.solve(K, np.r_[fx, fA])
    scale = np.abs(want).max()
    np.testing.assert_allclose(np.r_[dx, dy], want, atol=1e-6 * scale)
    assert not kkt.factor(-hdata, d)


@pytest.mark.parametrize("loss", ["en", "l2"])
@pytest.mark.parametrize("dup", [False, True])
def test_dense_newton_systems_match_clarabel(monkeypatch, loss, dup):
    """The dense LAPACK path (taken by the interior point from 2,000 unknowns on) on small
    instances: same optimum as Clarabel, duals certified and by the Lagrangian."""
    from cvxdp.solvers.consistency import ipm
    monkeypatch.setattr(ipm, "_QDLDL_MAX", 10)
    prob, x, M, y = instance(40, loss, "box", 11, dup=dup)
    ref = prob.solve(solver=cp.CLARABEL, **TIGHT)
    val = prob.solve(method="cvxdp", solver=cvxdp.ADMM, warm_start=False)
    es = prob.solver_stats.extra_stats
    assert prob.status == cp.OPTIMAL and es["info"]["route"] in ROUTES[loss]
    assert abs(val - ref) <= 1e-6 * max(1.0, abs(ref)) and es["duals_certified"]
    lagrangian_check(prob, x, M, y, loss)


@pytest.mark.parametrize("loss", ["en", "l2"])
@pytest.mark.parametrize("n,dup,bounds", [(5, False, "box"), (40, True, "box"), (80, False, "nonneg")])
def test_level_eliminated_newton_systems_match_clarabel(monkeypatch, loss, n, dup, bounds):
    """The dense path with independent sets eliminated first (forced at small sizes): same
    optimum as Clarabel, duals certified and by the Lagrangian; tiny, duplicate-row and
    bound-only-below instances."""
    from cvxdp.solvers import _level_cholesky as level_cholesky
    from cvxdp.solvers.consistency import dense_kkt, ipm
    tails = []

    class Recording(dense_kkt.DenseKKT):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            tails.append((self.tail, self.n))
    monkeypatch.setattr(ipm, "DenseKKT", Recording)
    monkeypatch.setattr(ipm, "_QDLDL_MAX", 2)
    monkeypatch.setattr(ipm, "_DENSE_PRODUCTS", 0)        # not the small problems' path
    monkeypatch.setattr(level_cholesky, "_MIN_SAVED_FLOPS", 0.0)
    monkeypatch.setattr(level_cholesky, "_MAX_DENSITY", 1.0)       # small matrices are dense
    prob, x, M, y = instance(n, loss, bounds, 21 + n, dup=dup)
    ref = prob.solve(solver=cp.CLARABEL, **TIGHT)
    val = prob.solve(method="cvxdp", solver=cvxdp.ADMM, warm_start=False)
    es = prob.solver_stats.extra_stats
    assert prob.status == cp.OPTIMAL and es["info"]["route"] in ROUTES[loss]
    assert abs(val - ref) <= 1e-6 * max(1.0, abs(ref)) and es["duals_certified"]
    assert tails and all(t < m for t, m in tails)          # levels were eliminated
    lagrangian_check(prob, x, M, y, loss)


def test_an_early_iterate_the_caller_accepts_ends_the_interior_point():
    """``accept`` sees the first iterate at each of ``_EARLY_TOLS`` (one iterate may meet
    several: then once); accepted, it is returned."""
    from cvxdp.recognise.consistency import recognise
    from cvxdp.solvers.consistency import ipm
    prob, *_ = instance(60, "en", "nonneg", 12)
    data = recognise(prob).data
    seen = []
    full = ipm.solve_qp(data, accept=lambda out: seen.append(out.accuracy) or False)
    tols = ipm._EARLY_TOLS
    assert 1 <= len(seen) <= len(tols) and seen == sorted(seen, reverse=True)
    assert seen[0] <= tols[0] and (len(seen) == 2 or seen[0] <= tols[1])
    assert ipm._TOL < seen[-1] <= tols[-1]
    assert full.accuracy <= ipm._TOL
    early = ipm.solve_qp(data, accept=lambda out: True)
    assert early.accuracy == seen[0] and early.iterations < full.iterations


@pytest.mark.parametrize("n, bounds, route", [(40, "box", "LP (HiGHS dual simplex)"),
                                              (150, "nonneg", "LP (HiGHS dual simplex)"),
                                              (300, "nonneg", "LP (HiGHS interior point)")])
def test_pure_l1_lps_by_size(n, bounds, route):
    """Small LPs (at most 800 columns: n plus two per loss row) by HiGHS's dual simplex,
    larger ones by its interior point; both certified, duals by the Lagrangian."""
    prob, x, M, y = instance(n, "l1", bounds, 7)
    ref = prob.solve(solver=cp.CLARABEL, **TIGHT)
    val = prob.solve(method="cvxdp", solver=cvxdp.ADMM, warm_start=False)
    es = prob.solver_stats.extra_stats
    assert prob.status == cp.OPTIMAL and es["info"]["route"] == route and es["duals_certified"]
    assert abs(val - ref) <= 1e-6 * max(1.0, abs(ref))
    lagrangian_check(prob, x, M, y, "l1")


def test_a_long_vector_with_few_rows_is_not_a_small_problem():
    """Few loss rows over many unknowns: the dense products would be small, the dense KKT
    matrix ``(n + p)^2`` would not (10,000 unknowns: 800 MB and an LU of 7e11 flops per
    iteration); it takes the sparse path and matches Clarabel."""
    from cvxdp.recognise.consistency import recognise
    from cvxdp.solvers.consistency import ipm
    rng = np.random.default_rng(3)
    n = 1000
    Q = (rng.random((4, n)) < 0.3).astype(float)
    x_true = rng.random(n) * 5
    y = Q @ x_true + rng.normal(0, 1, 4)
    E = sp.random(2, n, density=0.01, random_state=3, format="csr")
    x = cp.Variable(n)
    prob = cp.Problem(cp.Minimize(cp.sum_squares(Q @ x - y) + 0.5 * cp.norm1(Q @ x - y)),
                      [E @ x == E @ x_true, x >= 0, x <= 10])
    data = recognise(prob).data
    assert ipm._Solver(ipm._Problem(data), False).mode != "small"
    ref = prob.solve(solver=cp.CLARABEL, **TIGHT)
    val = prob.solve(method="cvxdp", solver=cvxdp.ADMM, warm_start=False)
    assert prob.status == cp.OPTIMAL and abs(val - ref) <= 1e-6 * max(1.0, abs(ref))

"""NEWTON_CG on degenerate workloads: rank-deficient, repeated, zero and parallel queries, a
single query, d = 1, B not the identity, target scales 1e-4 .. 1e6, warm starts, Problem 2,
and data without an attained optimum.  References: the standard convex program solved by
Clarabel (minimize t s.t. b_j^T X b_j <= t, matrix_frac(l_i, X) <= c_i, X PSD)."""
import numpy as np
import pytest
import cvxpy as cp
import scipy.linalg as la

import cvxdp
from cvxdp.modelling import workloads
from cvxdp.solvers.fitness import reduce as fitness_reduce
from cvxdp.solvers.fitness.newton_cg import (FitnessData, NewtonSettings, dual_bound, solve,
                                     solve_privacy_bound)

TIGHT = dict(tol_gap_abs=1e-8, tol_gap_rel=1e-8, tol_feas=1e-8)   # tighter ends "inaccurate" on singular optima
SETTINGS = dict(eps_rel=1e-8, eps_abs=1e-8)


def reference(B, L, c, rho=None):
    """Problem 1 (or Problem 2 with privacy bound rho) as a standard cvxpy program."""
    k = B.shape[0]
    X = cp.Variable((k, k), PSD=True)
    if rho is None:
        t = cp.Variable()
        cons = [cp.diag(B.T @ X @ B) <= t] + [cp.matrix_frac(L[i], X) <= c[i]
                                               for i in range(L.shape[0])]
    else:
        t = cp.Variable()
        cons = [cp.diag(B.T @ X @ B) <= rho] + [cp.matrix_frac(L[i], X) <= t * c[i]
                                                for i in range(L.shape[0])]
    prob = cp.Problem(cp.Minimize(t), cons)
    prob.solve(solver=cp.CLARABEL, **TIGHT)
    return prob.value, prob.status


def exact_variances(L, X):
    C = np.linalg.cholesky((X + X.T) / 2)
    Y = la.solve_triangular(C, L.T, lower=True)
    return np.einsum("ij,ij->j", Y, Y)


def check_result(res, B, L, c, ref=None, settings=SETTINGS):
    """Status optimal, gap and feasibility within tolerance, objective = the returned X's
    privacy cost, lower bound valid, and (if given) the reference's optimum."""
    assert res.status == "optimal", res.info
    assert res.gap <= settings["eps_rel"]
    assert res.gap == pytest.approx((res.objective - res.lower_bound) / max(1.0, abs(res.objective)))
    X = res.x
    assert X.shape == (B.shape[0], B.shape[0])
    np.linalg.cholesky((X + X.T) / 2)                        # positive definite
    v = exact_variances(L, X)
    viol = float(np.max(np.maximum(v - c, 0.0)))
    assert viol <= settings["eps_abs"]
    assert res.primal_residual == pytest.approx(viol, abs=1e-14 * max(1.0, float(c.max())))
    p = np.einsum("ij,ij->j", B, X @ B)
    assert res.objective == pytest.approx(float(p.max()), rel=1e-12)
    assert res.lower_bound <= res.objective * (1 + 1e-9)
    assert res.iterations >= 0 and isinstance(res.history, list)
    if ref is not None:
        assert res.objective == pytest.approx(ref, rel=1e-4)
        assert res.lower_bound <= ref * (1 + 1e-6)       # certified bound below the optimum


def rank_deficient_ranges(d, seed0=0):
    """Random range workload (2d ranges over d cells) whose rank is below d."""
    for seed in range(seed0, seed0 + 200):
        W = workloads.random_ranges(d, 2 * d, rng=seed).toarray()
        if np.linalg.matrix_rank(W) < d:
            return W
    raise AssertionError("no rank-deficient instance found")


@pytest.mark.parametrize("d, targets", [(6, "unit"), (10, "random"), (16, "unit"), (16, "random")])
def test_rank_deficient_random_ranges(d, targets):
    W = rank_deficient_ranges(d, seed0=d)
    assert np.linalg.matrix_rank(W) < d
    rng = np.random.default_rng(d)
    c = np.ones(2 * d) if targets == "unit" else rng.uniform(0.5, 5.0, 2 * d)
    B = np.eye(d)
    ref, status = reference(B, W, c)
    assert status == cp.OPTIMAL
    res = solve(FitnessData(B, W, c), NewtonSettings(**SETTINGS))
    check_result(res, B, W, c, ref)
    assert res.info["rank"] == np.linalg.matrix_rank(W)
    # the chosen-basis formulation of the same workload has the same optimum
    L2, B2 = cvxdp.fitness.choose_basis(W)
    res2 = solve(FitnessData(B2, L2, c), NewtonSettings(**SETTINGS))
    assert res2.objective == pytest.approx(res.objective, rel=1e-7)


def test_duplicate_zero_and_parallel_rows():
    rng = np.random.default_rng(1)
    k = 7
    base = rng.normal(size=(4, k))                          # rank 4 < k
    L = np.vstack([base, base[1], -2.0 * base[2], np.zeros(k), base[0], np.zeros(k)])
    c = rng.uniform(0.5, 3.0, L.shape[0])
    c[4] = 0.3 * c[1]                                       # the duplicate is the tighter one
    B = np.eye(k)
    ref, status = reference(B, L, c)
    assert status == cp.OPTIMAL
    res = solve(FitnessData(B, L, c), NewtonSettings(**SETTINGS))
    check_result(res, B, L, c, ref)
    assert res.info["distinct_queries"] == 4 and res.info["rank"] == 4
    assert list(res.info["zero_rows"]) == [6, 8]
    lam = res.duals["variance"]
    assert lam[6] == 0 and lam[8] == 0 and np.all(lam >= 0)
    # only the tighter of two identical rows binds; a loose duplicate's multiplier is 0
    assert lam[1] == 0 or c[1] <= c[4]
    # the multipliers certify the bound on the original data
    assert dual_bound(FitnessData(B, L, c), res.duals["cost_weights"], lam) == \
        pytest.approx(res.lower_bound, rel=1e-9)


def test_single_query_and_d_equals_one_closed_form():
    rng = np.random.default_rng(2)
    # one query, B not the identity: rank one, closed form
    B = rng.normal(size=(4, 6))
    L = rng.normal(size=(1, 4))
    c = np.array([0.7])
    ref, _ = reference(B, L, c)
    res = solve(FitnessData(B, L, c), NewtonSettings(**SETTINGS))
    check_result(res, B, L, c, ref)
    assert res.info["closed_form"] and res.iterations == 0
    # d = 1: cost = max_i l_i^2 / c_i * max_j b_j^2
    B1 = np.array([[2.0, -3.0]])
    L1 = np.array([[1.0], [-4.0], [0.0], [2.0]])
    c1 = np.array([1.0, 2.0, 5.0, 0.1])
    res1 = solve(FitnessData(B1, L1, c1), NewtonSettings(**SETTINGS))
    check_result(res1, B1, L1, c1)
    assert res1.objective == pytest.approx(40.0 * 9.0, rel=1e-14)
    assert res1.lower_bound == pytest.approx(360.0, rel=1e-12)
    # a single query given as a 1-D vector
    res_v = solve(FitnessData(np.eye(3), np.array([1.0, 1.0, 0.0]), np.array([2.0])))
    # X = x u u^T (+ padding), u = l / |l|: l^T X^+ l = 2 / x <= 2 gives x = 1, cost max u_j^2
    assert res_v.objective == pytest.approx(0.5, rel=1e-7)


@pytest.mark.parametrize("seed", [0, 1])
def test_basis_not_identity_rank_deficient(seed):
    rng = np.random.default_rng(10 + seed)
    k, n, m, r = 6, 9, 10, 3
    B = rng.normal(size=(k, n))
    L = rng.normal(size=(m, r)) @ rng.normal(size=(r, k))     # rank 3
    c = rng.uniform(0.5, 2.0, m)
    ref, status = reference(B, L, c)
    assert status == cp.OPTIMAL
    res = solve(FitnessData(B, L, c), NewtonSettings(**SETTINGS))
    check_result(res, B, L, c, ref)
    assert res.info["rank"] == r


@pytest.mark.parametrize("scale", [1e-4, 1e-2, 1.0, 1e3, 1e6])
def test_target_scales(scale):
    """Scaling every target by t scales the optimum by 1/t: checked against the reference
    of the unscaled instance, on a rank-deficient workload with random targets."""
    W = rank_deficient_ranges(8, seed0=3)
    c = np.random.default_rng(3).uniform(0.5, 2.0, W.shape[0])
    B = np.eye(8)
    ref, status = reference(B, W, c)
    assert status == cp.OPTIMAL
    res = solve(FitnessData(B, W, scale * c), NewtonSettings(**SETTINGS))
    check_result(res, B, W, scale * c, ref / scale)
    assert res.info["relative_gap"] <= SETTINGS["eps_rel"]


def test_returned_precision_is_positive_definite_and_atoms_evaluate_it():
    """A rank-deficient workload: the returned X is positive definite (the reduction pads
    the unseen directions), and cvxpy's atoms give finite variances within the targets."""
    W = rank_deficient_ranges(10, seed0=1)
    c = np.ones(W.shape[0])
    res = solve(FitnessData(np.eye(10), W, c), NewtonSettings(**SETTINGS))
    assert res.info["rank"] < 10 and res.info["null_padding"] > 0
    X = res.x
    assert np.linalg.eigvalsh(X).min() > 0
    qv = cvxdp.query_variance(W, cp.Constant(X)).value
    assert np.all(np.isfinite(qv)) and np.all(qv <= c + 1e-9)
    np.testing.assert_allclose(qv, exact_variances(W, X), rtol=1e-6)
    for i in (0, 5, 11):
        mf = cp.matrix_frac(W[i], cp.Constant(X)).value
        assert np.isfinite(mf) and mf == pytest.approx(qv[i], rel=1e-6)
    # the padding costs less than the tolerance: privacy terms on the padded directions
    p_pad = res.info["null_padding"] * np.max(
        np.sum((np.eye(10) - np.linalg.pinv(W) @ W) ** 2, axis=0))
    assert p_pad <= 0.05 * SETTINGS["eps_rel"] * res.objective


def test_warm_starts_reproduce_the_cold_answer_and_bad_ones_are_ignored():
    W = rank_deficient_ranges(12, seed0=5)
    c = np.random.default_rng(5).uniform(1.0, 3.0, W.shape[0])
    d = FitnessData(np.eye(12), W, c)
    s = NewtonSettings(**SETTINGS)
    cold = solve(d, s)
    check_result(cold, d.B, W, c)
    # from the previous state: the last stage is resumed and certifies at once
    resumed = solve(d, s, X0=cold.x, state=cold.state)
    check_result(resumed, d.B, W, c)
    assert resumed.info["warm_start"] == "resumed from state"
    assert resumed.objective == pytest.approx(cold.objective, rel=1e-12)
    np.testing.assert_allclose(resumed.x, cold.x, rtol=1e-9, atol=1e-12 * np.abs(cold.x).max())
    assert resumed.iterations <= 3
    # from X0 alone: the cold answer is the first incumbent and is not replaced by rounding
    warm = solve(d, s, X0=cold.x)
    check_result(warm, d.B, W, c)
    assert warm.info["warm_start"] == "X0"
    assert warm.objective == pytest.approx(cold.objective, rel=1e-10)
    np.testing.assert_allclose(warm.x, cold.x, rtol=1e-6, atol=1e-9 * np.abs(cold.x).max())
    # a scaled optimum is the same point after the feasibility rescale
    scaled = solve(d, s, X0=7.0 * cold.x)
    assert scaled.objective == pytest.approx(cold.objective, rel=1e-10)
    # bad warm starts: ignored (cold start), never an exception
    bad = [np.zeros((12, 12)), -np.eye(12), np.eye(5), np.full((12, 12), np.nan),
           np.ones((12, 12)), "not a matrix"]
    for X0 in bad:
        r = solve(d, s, X0=X0)
        assert r.info["warm_start"].startswith("ignored")
        assert r.status == "optimal" and r.objective == pytest.approx(cold.objective, rel=1e-7)
    # state of other data is not reused
    other = FitnessData(np.eye(12), W, 2 * c)
    r = solve(other, s, state=cold.state)
    assert r.info["warm_start"] == "none"
    assert r.objective == pytest.approx(cold.objective / 2, rel=1e-7)


@pytest.mark.parametrize("case", ["ranges", "duplicates", "single"])
def test_problem_two(case):
    rng = np.random.default_rng(7)
    if case == "ranges":
        L = rank_deficient_ranges(8, seed0=11)
        B = np.eye(8)
    elif case == "duplicates":
        base = rng.normal(size=(3, 5))
        L = np.vstack([base, base, np.zeros((1, 5))])
        B = rng.normal(size=(5, 7))
    else:
        L = rng.normal(size=(1, 4))
        B = np.eye(4)
    c = rng.uniform(0.5, 2.0, L.shape[0])
    rho = 2.5
    ref, status = reference(B, L, c, rho=rho)
    assert status == cp.OPTIMAL
    res = solve_privacy_bound(FitnessData(B, L, c), rho, NewtonSettings(**SETTINGS))
    assert res.status == "optimal"
    assert res.objective == pytest.approx(ref, rel=1e-4)
    assert res.gap <= SETTINGS["eps_rel"] and res.lower_bound <= ref * (1 + 1e-6)
    X = res.x
    p = np.einsum("ij,ij->j", B, X @ B)
    v = exact_variances(L, X)
    assert p.max() <= rho + SETTINGS["eps_abs"]
    assert np.max(v - res.objective * c) <= SETTINGS["eps_abs"]
    assert res.primal_residual <= SETTINGS["eps_abs"]
    # KKT of Problem 2: sum lam_i c_i = 1, and lam, nu >= 0
    assert float(res.duals["variance"] @ c) == pytest.approx(1.0, rel=1e-12)
    assert res.duals["privacy"] > 0
    # warm start from its own answer reproduces it
    again = solve_privacy_bound(FitnessData(B, L, c), rho, NewtonSettings(**SETTINGS),
                                X0=res.x, state=res.state)
    assert again.objective == pytest.approx(res.objective, rel=1e-12)
    assert again.iterations == 0


def solved_in_cell_basis(n, seed0, seed_c, high):
    """A rank-deficient range workload given in the cell basis (L = W), solved through
    cvxpy to 1e-8: ``(model, W, c, value)``."""
    W = rank_deficient_ranges(n, seed0=seed0)
    c = np.random.default_rng(seed_c).uniform(1, high, W.shape[0])
    m = cvxdp.fitness_problem(W, c, basis=np.eye(n))
    m.problem.solve(method="cvxdp", solver=cvxdp.NEWTON_CG, eps_rel=1e-8)
    assert m.problem.status == cp.OPTIMAL
    return m, W, c, m.problem.value


def test_through_cvxpy_rank_deficient_identity_basis():
    """The cvxpy path on a workload given in the cell basis (L = W, rank-deficient)."""
    m, W, c, ours = solved_in_cell_basis(10, 2, 4, 4)
    X = m.X.value.copy()
    assert np.all(cvxdp.query_variance(W, cp.Constant(X)).value <= c * (1 + 1e-9))
    m.problem.solve(solver=cp.CLARABEL, **TIGHT)
    assert ours == pytest.approx(m.problem.value, rel=1e-4)
    # Problem 2 through cvxpy, same workload
    m2 = cvxdp.fitness_problem(W, c, basis=np.eye(10), privacy_bound=3.0)
    m2.problem.solve(method="cvxdp", solver=cvxdp.NEWTON_CG, eps_rel=1e-8)
    assert m2.problem.status == cp.OPTIMAL
    assert m2.s.value == pytest.approx(ours / 3.0, rel=1e-6)


def test_data_without_an_attained_optimum_raises_naming_the_argument():
    B = np.eye(3)
    L = np.tril(np.ones((3, 3)))
    c = np.ones(3)
    with pytest.raises(ValueError, match="every query is zero"):
        solve(FitnessData(B, np.zeros((3, 3)), c))
    with pytest.raises(ValueError, match="no rows"):
        solve(FitnessData(B, np.zeros((0, 3)), np.zeros(0)))
    for bad_c in ([1.0, 0.0, 1.0], [1.0, -1.0, 1.0], [1.0, np.inf, 1.0], [1.0, np.nan, 1.0]):
        with pytest.raises(ValueError, match="c \\(the variance targets\\)"):
            solve(FitnessData(B, L, np.array(bad_c)))
    with pytest.raises(ValueError, match="B \\(the basis\\).*independent"):
        solve(FitnessData(np.array([[1.0, 0, 0], [2.0, 0, 0], [0, 0, 1.0]]), L, c))
    for rho in (0.0, -1.0, np.inf, np.nan):
        with pytest.raises(ValueError, match="rho"):
            solve_privacy_bound(FitnessData(B, L, c), rho)
    # the cvxpy side: fitness_problem and the recogniser, before any solve
    with pytest.raises(ValueError, match="every query is zero"):
        cvxdp.fitness_problem(np.zeros((4, 3)), 1.0)
    with pytest.raises(ValueError, match="no queries"):
        cvxdp.fitness_problem(np.zeros((0, 3)), 1.0)
    for rho in (np.inf, np.nan, 0.0, -2.0):
        with pytest.raises(ValueError, match="privacy_bound"):
            cvxdp.fitness_problem(L, 1.0, privacy_bound=rho)
    X = cp.Variable((3, 3), PSD=True)
    s = cp.Variable()
    for rho in (-1.0, 0.0, np.inf):
        prob = cp.Problem(cp.Minimize(s), [cvxdp.query_variance(L, X) <= s * c,
                                           cvxdp.privacy_cost(B, X) <= rho])
        with pytest.raises(ValueError, match="rho|inf"):
            prob.solve(method="cvxdp", solver=cvxdp.NEWTON_CG)
    prob = cp.Problem(cp.Minimize(cvxdp.privacy_cost(B, X)),
                      [cvxdp.query_variance(np.zeros((2, 3)), X) <= 1.0])
    with pytest.raises(ValueError, match="every query is zero"):
        prob.solve(method="cvxdp", solver=cvxdp.NEWTON_CG)


def test_reduction_is_exact():
    """The reduced problem's rows reproduce the original constraints: for any X' and
    X = R^T X' R + delta N^T N, l_i^T X^{-1} l_i -> c-scaled reduced variance as delta grows,
    and the projection (R X^{-1} R^T)^{-1} keeps variances and lowers every privacy term."""
    rng = np.random.default_rng(8)
    k = 6
    L = np.vstack([rng.normal(size=(2, 4)) @ rng.normal(size=(4, k)), np.zeros((1, k))])
    L = np.vstack([L, 3.0 * L[0]])
    c = rng.uniform(1, 2, L.shape[0])
    B = rng.normal(size=(k, 8))
    red = fitness_reduce.reduce(B, L, c)
    assert red.rank == 2 and red.L.shape == (2, 2)
    A = rng.normal(size=(k, k))
    X = A @ A.T + np.eye(k)
    Xr = fitness_reduce.project_precision(red, X)
    v = exact_variances(L, X)
    vr = exact_variances(red.L, Xr)
    # reduced row a is original row rows[a] / norms[a]
    np.testing.assert_allclose(vr * red.norms ** 2, v[red.rows], rtol=1e-10)
    p = np.einsum("ij,ij->j", B, X @ B)
    pr = np.einsum("ij,ij->j", red.B, Xr @ red.B)
    assert np.all(pr <= p * (1 + 1e-12))
    # the tightest of the parallel pair (rows 0 and 3, l_3 = 3 l_0) is kept
    g = [grp for grp in red.groups if 0 in grp][0]
    assert sorted(g) == [0, 3]
    assert red.c[list(red.rows).index(g[0] if c[0] <= c[3] / 9 else 3)] == \
        pytest.approx(min(c[0], c[3] / 9) / np.sum(L[0] ** 2))


def test_nearly_rank_deficient_workload():
    """A singular value 1e-9 of the largest: above the exact rank tolerance, so the exact
    reduction keeps it, but the optimum is nearly singular.  At eps_rel = 1e-6 the solver
    first drops it too (an inexact reduction) and keeps the answer because the certificate
    on the original data meets the tolerance."""
    W = rank_deficient_ranges(12, seed0=5)
    Wp = W + 1e-9 * np.random.default_rng(0).normal(size=W.shape)
    c = np.ones(W.shape[0])
    B = np.eye(12)
    ref, status = reference(B, Wp, c)
    assert status == cp.OPTIMAL
    settings = dict(eps_rel=1e-6, eps_abs=1e-8)
    res = solve(FitnessData(B, Wp, c), NewtonSettings(**settings))
    check_result(res, B, Wp, c, ref, settings=settings)
    assert res.info["rank"] == 12 and res.info["rank_used"] == 11


def test_through_cvxpy_warm_starts_single_query_and_one_cell():
    m, W, c, cold = solved_in_cell_basis(8, 9, 9, 2)
    m.problem.solve(method="cvxdp", solver=cvxdp.NEWTON_CG, eps_rel=1e-8)      # warm: X.value
    assert m.problem.status == cp.OPTIMAL and m.problem.value == pytest.approx(cold, rel=1e-9)
    for bad in (np.zeros((8, 8)), np.full((8, 8), np.nan), -np.eye(8)):
        m.X.value = bad if np.all(np.isfinite(bad)) and np.all(np.linalg.eigvalsh(bad) >= 0) else None
        m.problem.solve(method="cvxdp", solver=cvxdp.NEWTON_CG, eps_rel=1e-8)
        assert m.problem.status == cp.OPTIMAL and m.problem.value == pytest.approx(cold, rel=1e-7)
    # one cell (k = 1) and one query: closed forms through cvxpy
    m1 = cvxdp.fitness_problem(np.array([[1.0], [3.0], [0.0]]), np.array([1.0, 3.0, 1.0]))
    m1.problem.solve(method="cvxdp", solver=cvxdp.NEWTON_CG)
    assert m1.problem.status == cp.OPTIMAL and m1.problem.value == pytest.approx(3.0, rel=1e-12)
    mq = cvxdp.fitness_problem(np.array([[1.0, 1.0, 1.0, 0.0]]), 2.0, basis=np.eye(4))
    mq.problem.solve(method="cvxdp", solver=cvxdp.NEWTON_CG)
    assert mq.problem.status == cp.OPTIMAL
    ours = mq.problem.value
    mq.problem.solve(solver=cp.CLARABEL, **TIGHT)
    assert ours == pytest.approx(mq.problem.value, rel=1e-4)


def test_problem_two_duals_match_clarabel():
    """On the prefix workload (unique multipliers) Problem 2's duals equal Clarabel's."""
    d_ = 5
    L, B, c, rho = np.tril(np.ones((d_, d_))), np.eye(d_), np.linspace(1.0, 2.0, d_), 2.0
    res = solve_privacy_bound(FitnessData(B, L, c), rho, NewtonSettings(eps_rel=1e-10))
    X = cp.Variable((d_, d_), PSD=True)
    s = cp.Variable()
    var = [cp.matrix_frac(L[i], X) <= s * c[i] for i in range(d_)]
    cost = cvxdp.privacy_cost(B, X) <= rho
    prob = cp.Problem(cp.Minimize(s), var + [cost])
    prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    assert res.objective == pytest.approx(prob.value, rel=1e-7)
    np.testing.assert_allclose(res.duals["variance"], [float(con.dual_value) for con in var], atol=1e-5)
    assert res.duals["privacy"] == pytest.approx(float(cost.dual_value), rel=1e-4)

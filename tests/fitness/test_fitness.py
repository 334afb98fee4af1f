"""Fitness-for-use through cvxpy: atoms, the NEWTON_CG method, Problem 2, the mechanism."""
import numpy as np
import pytest
import cvxpy as cp

import cvxdp
from cvxdp.modelling.atoms import PrivacyCost, QueryVariance

TIGHT = dict(tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)


def prefix(d):
    return np.tril(np.ones((d, d)))


@pytest.mark.parametrize("W,c", [
    (prefix(4), 1.0),
    (prefix(6), np.linspace(1.0, 3.0, 6)),
    (np.random.default_rng(0).integers(0, 2, (7, 5)).astype(float), np.random.default_rng(1).uniform(1, 4, 7)),
])
def test_newton_cg_matches_clarabel_and_scs(W, c):
    m = cvxdp.fitness_problem(W, c)
    m.problem.solve(method="cvxdp", solver=cvxdp.NEWTON_CG, eps_rel=1e-9)
    assert m.problem.status == cp.OPTIMAL
    ours = m.problem.value
    X = m.X.value.copy()
    ours_duals = m.problem.constraints[0].dual_value.copy()
    m.problem.solve(solver=cp.CLARABEL, **TIGHT)
    assert ours == pytest.approx(m.problem.value, rel=1e-6)
    np.testing.assert_allclose(ours_duals, m.problem.constraints[0].dual_value, atol=1e-4)
    m.problem.solve(solver=cp.SCS, eps=1e-9, max_iters=200000)
    assert ours == pytest.approx(m.problem.value, rel=1e-5)
    # feasibility of our X: every variance within its target
    v = QueryVariance(cp.Constant(X), m.L).value
    assert np.all(v <= np.broadcast_to(c, v.shape) * (1 + 1e-9))


def test_problem_two_from_problem_one():
    W, rho = prefix(6), 2.0
    p1 = cvxdp.fitness_problem(W, 1.0)
    p1.problem.solve(method="cvxdp", solver=cvxdp.NEWTON_CG, eps_rel=1e-9)
    p2 = cvxdp.fitness_problem(W, 1.0, privacy_bound=rho)
    p2.problem.solve(method="cvxdp", solver=cvxdp.NEWTON_CG, eps_rel=1e-9)
    assert p2.problem.status == cp.OPTIMAL
    assert p2.s.value == pytest.approx(p1.problem.value / rho, rel=1e-9)
    assert PrivacyCost(cp.Constant(p2.X.value), p2.B).value == pytest.approx(rho, rel=1e-9)
    duals = [np.asarray(c.dual_value, dtype=float) for c in p2.problem.constraints]
    p2.problem.solve(solver=cp.CLARABEL, **TIGHT)
    assert p2.problem.value == pytest.approx(p1.problem.value / rho, rel=1e-6)
    for ours, con in zip(duals, p2.problem.constraints):
        np.testing.assert_allclose(ours, con.dual_value, atol=1e-4)


def test_plain_spellings_are_recognised():
    d = 5
    W = prefix(d)
    X = cp.Variable((d, d), symmetric=True)
    B = np.eye(d)
    prob = cp.Problem(cp.Minimize(2.0 * cp.max(cp.diag(B.T @ X @ B))),
                      [cp.matrix_frac(W[i], X) <= 1.0 for i in range(d)] + [X >> 0])
    prob.solve(method="cvxdp")                      # picks NEWTON_CG by itself
    assert prob.solver_stats.solver_name == cvxdp.NEWTON_CG
    ours = prob.value
    prob.solve(solver=cp.CLARABEL, **TIGHT)
    assert ours == pytest.approx(prob.value, rel=1e-6)


def test_mechanism_outputs():
    m = cvxdp.fitness_problem(prefix(6), np.arange(1.0, 7.0))
    m.problem.solve(method="cvxdp", solver=cvxdp.NEWTON_CG)
    mech = m.mechanism()
    np.testing.assert_allclose(mech.covariance @ mech.precision, np.eye(6), atol=1e-9)
    assert np.all(mech.variance_ratios <= 1 + 1e-9)
    assert mech.squared_privacy_cost == pytest.approx(m.problem.value, rel=1e-12)
    eps = mech.epsilon(1e-6)
    assert mech.delta(eps) == pytest.approx(1e-6, rel=1e-6)
    x = np.arange(6.0)
    a1, a2 = mech.release(x, rng=3), mech.release(x, rng=3)
    np.testing.assert_array_equal(a1, a2)
    draws = np.array([mech.release(x, rng=s) for s in range(3000)])
    np.testing.assert_allclose(draws.mean(0), prefix(6) @ x, atol=0.2)
    np.testing.assert_allclose(draws.var(0), mech.variances, rtol=0.1)


def test_atoms_numeric_and_standard_canonicalization():
    rng = np.random.default_rng(2)
    L = rng.normal(size=(4, 3))
    B = rng.normal(size=(3, 5))
    A = rng.normal(size=(3, 3))
    X0 = A @ A.T + np.eye(3)
    qv = cvxdp.query_variance(L, cp.Constant(X0)).value
    np.testing.assert_allclose(qv, np.diag(L @ np.linalg.inv(X0) @ L.T))
    pc = cvxdp.privacy_cost(B, cp.Constant(X0)).value
    assert pc == pytest.approx(np.max(np.diag(B.T @ X0 @ B)))
    assert cvxdp.query_variance(L, cp.Variable((3, 3), PSD=True)).is_convex()
    # outside the domain (a standard solver's inaccurate X): +inf, not LAPACK's error
    bad = X0 - 2 * np.linalg.eigvalsh(X0).max() * np.outer([1, 0, 0], [1, 0, 0])
    assert np.all(np.isinf(cvxdp.query_variance(L, cp.Constant(bad)).value))


def test_bad_input():
    with pytest.raises(ValueError, match="X must have shape"):
        cvxdp.query_variance(np.ones((2, 3)), cp.Variable((4, 4)))
    with pytest.raises(ValueError, match="targets must be positive"):
        cvxdp.fitness_problem(prefix(3), [1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="one target per query"):
        cvxdp.fitness_problem(prefix(3), [1.0, 2.0])
    with pytest.raises(ValueError, match="linearly independent"):
        cvxdp.fitness_problem(prefix(3), 1.0, basis=np.array([[1.0, 0, 0], [2.0, 0, 0]]))
    with pytest.raises(ValueError, match="row space"):
        cvxdp.fitness_problem(prefix(3), 1.0, basis=np.array([[1.0, 0, 0], [0, 1.0, 0]]))
    with pytest.raises(ValueError, match="NaN"):
        cvxdp.query_variance(np.array([[np.nan, 1.0]]), cp.Variable((2, 2)))
    X = cp.Variable((3, 3), PSD=True)
    with pytest.raises(cvxdp.NotRecognised, match="NEWTON_CG"):
        cp.Problem(cp.Minimize(cp.trace(X)), [cvxdp.query_variance(prefix(3), X) <= 1]).solve(
            method="cvxdp", solver=cvxdp.NEWTON_CG)


def test_baselines():
    fit = cvxdp.fitness
    W = prefix(8)
    c = np.ones(8)
    m = cvxdp.fitness_problem(W, c)
    m.problem.solve(method="cvxdp", solver=cvxdp.NEWTON_CG, eps_rel=1e-9)
    cost = m.problem.value
    ip = fit.baseline_variances(W, cost, "IP")
    np.testing.assert_allclose(ip, np.arange(1, 9) / cost)
    hm = fit.baseline_variances(W, cost, "HM", c, branching=2)
    tree = cvxdp.workloads.hierarchy(8, 2)
    sigma = np.sqrt((tree.height + 1) / cost)
    np.testing.assert_allclose(hm, cvxdp.analysis.query_errors(W, tree.queries, noise="gaussian", sigma=sigma))
    # the total-variance optimum for the identity workload is X = I
    ca_id = fit.baseline_variances(np.eye(5), 2.0, "CA", solver=cp.CLARABEL)
    np.testing.assert_allclose(ca_id, 0.5, rtol=1e-6)
    # at SM-II's (optimal) cost no baseline can meet every target
    for meth in ("IP", "HM", "CA", "wCA-I", "wCA-II"):
        v = fit.baseline_variances(W, cost, meth, c, solver=cp.CLARABEL)
        assert np.max(v / c) >= 1 - 1e-5, meth
    with pytest.raises(ValueError, match="method"):
        fit.baseline_variances(W, cost, "XYZ")
    # HM on a given strategy: the k-ary tree's queries give the same as branching=k, and the
    # paper's two-level tree is calibrated to its largest column norm (3 levels)
    np.testing.assert_allclose(fit.baseline_variances(W, cost, "HM", strategy=tree.queries), hm)
    st = cvxdp.workloads.sqrt_tree(8)
    np.testing.assert_allclose(fit.baseline_variances(W, cost, "HM", strategy=st),
                               cvxdp.analysis.query_errors(W, st, noise="gaussian",
                                                           sigma=np.sqrt(3 / cost)))
    with pytest.raises(ValueError, match="strategy must be a query matrix with 8 columns"):
        fit.baseline_variances(W, cost, "HM", strategy=np.eye(7))
    with pytest.raises(ValueError, match="full column rank"):
        fit.baseline_variances(W, cost, "HM", strategy=np.ones((3, 8)))
    with pytest.raises(ValueError, match="not both"):
        fit.baseline_variances(W, cost, "HM", branching=2, strategy=st)
    with pytest.raises(ValueError, match="HM option"):
        fit.baseline_variances(W, cost, "IP", strategy=st)


def _pl94():
    dom = (2, 2, 63)
    wl = cvxdp.workloads
    return np.vstack([wl.marginal(dom, (a,)).toarray() for a in range(3)] + [np.eye(252)])


def _age_pyramid_code():
    """The age-pyramid workload of the paper's published script (``4_age.py``): the ranges
    ``age >= a`` (0..115) for males, females and both."""
    tri = np.triu(np.ones((116, 116)))
    return np.vstack([np.kron(np.eye(2), tri), np.kron(np.ones((1, 2)), tri)])


@pytest.mark.parametrize("W,ip,hm", [(_pl94(), 36.56, 13.93), (_age_pyramid_code(), 32.49, 6.20)],
                         ids=["PL-94 Table 4", "age Table 9"])
def test_paper_hm_ratio(W, ip, hm):
    """Xiao et al. 2021, Tables 4 and 9: IP's max ratio is (widest query) / p, which tells the
    squared cost p' of the paper's baselines; at p', HM on the paper's two-level tree gives
    the paper's HM value to the printed digits."""
    p_paper = W.sum(axis=1).max() / ip
    c = np.ones(W.shape[0])
    assert np.max(cvxdp.fitness.baseline_variances(W, p_paper, "IP")) == pytest.approx(ip)
    v = cvxdp.fitness.baseline_variances(W, p_paper, "HM", c,
                                         strategy=cvxdp.workloads.sqrt_tree(W.shape[1]))
    assert round(float(np.max(v)), 2) == hm

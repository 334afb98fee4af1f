"""Marginal workloads in the residual basis: the closure and coefficients against brute force and
dense matrices (privacy cost = squared sensitivity, variance = the reconstruction's), and the
design (``privacy_cost(W, s)`` s.t. ``query_variance(W, s) <= c``) by ``cvxdp.NEWTON_CG``
against Clarabel and against the dense fitness-for-use model, on random and degenerate
instances: objective gap, targets met, duals by the Lagrange dual bound."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import cvxpy as cp
import scipy.sparse as sp

import cvxdp
from cvxdp.solvers.residual.basis import closure
from cvxdp.solvers.residual.design import DesignSettings, dual_value, solve

CLARABEL = dict(tol_gap_abs=1e-11, tol_gap_rel=1e-11, tol_feas=1e-11, max_iter=500)


# ------------------------------------------------------------------------- dense references
def _sub(n: int) -> np.ndarray:
    """``Sub = [1, -I]`` of shape ``(n - 1, n)``."""
    return np.hstack([np.ones((n - 1, 1)), -np.eye(n - 1)]) if n > 1 else np.zeros((0, 1))


def _kron(mats: list[np.ndarray]) -> np.ndarray:
    out = np.ones((1, 1))
    for m in mats:
        out = np.kron(out, m)
    return out


def _residual_matrix(sizes, A) -> np.ndarray:
    """``R_A`` over the full domain (C order)."""
    return _kron([_sub(n) if i in A else np.ones((1, n)) for i, n in enumerate(sizes)])


def _noise_cov(sizes, A, s_A: float) -> np.ndarray:
    return s_A * _kron([_sub(sizes[i]) @ _sub(sizes[i]).T for i in sorted(A)])


def _reconstruction(sizes, M, A) -> np.ndarray:
    """``K_A`` mapping residual ``A``'s answers to marginal ``M``'s cells (ResidualPlanner's
    reconstruction: ``Sub^+`` on ``A``, ``1 / n`` on ``M \\ A``)."""
    return _kron([np.linalg.pinv(_sub(sizes[i])) if i in A else np.full((sizes[i], 1), 1.0 / sizes[i])
                  for i in sorted(M)])


def _random_instance(rng, max_attrs=4, max_size=4, size_one=True):
    k = int(rng.integers(1, max_attrs + 1))
    sizes = rng.integers(1 if size_one else 2, max_size + 1, k)
    r = int(rng.integers(1, k + 1))
    cl = [c for c in itertools.combinations(range(k), r) if rng.random() < 0.7] or [tuple(range(r))]
    if rng.random() < 0.5:
        cl += [(int(a),) for a in rng.choice(k, size=min(k, 2), replace=False)]
    if rng.random() < 0.3:
        cl.append(cl[0])                     # a marginal with two targets
    return sizes, cl


# ------------------------------------------------------------------------- the basis
@pytest.mark.parametrize("seed", range(12))
def test_closure_against_brute_force(seed):
    rng = np.random.default_rng(seed)
    sizes, cl = _random_instance(rng)
    b = closure(sizes, cl)
    want = sorted({tuple(sorted(sub)) for c in cl for r in range(len(c) + 1)
                   for sub in itertools.combinations(c, r)}, key=lambda t: (len(t), t))
    assert [b.residual(j) for j in range(b.n_residuals)] == want
    for j, A in enumerate(want):
        assert b.p[j] == pytest.approx(math.prod((sizes[i] - 1) / sizes[i] for i in A))
    V = b.V.toarray()
    for m, M in enumerate(cl):
        assert b.residual(b.top[m]) == tuple(sorted(M))
        for j, A in enumerate(want):
            v = (math.prod((sizes[i] - 1) / sizes[i] for i in A)
                 * math.prod(sizes[i] ** -2.0 for i in M if i not in A)) if set(A) <= set(M) else 0.0
            assert V[m, j] == pytest.approx(v, rel=1e-14, abs=0)


@pytest.mark.parametrize("seed", range(6))
def test_cost_is_the_squared_sensitivity_and_variance_the_reconstructions(seed):
    """Dense check of the two formulas on small domains: the Gaussian mechanism that adds
    ``N(0, s_A (x) Sub Sub^T)`` to every ``R_A x`` has squared L2 sensitivity ``sum p_A / s_A``
    (the same for every record), and ResidualPlanner's reconstruction of each marginal is
    unbiased with per-cell variance ``sum_A v_{M,A} s_A``."""
    rng = np.random.default_rng(100 + seed)
    sizes, cl = _random_instance(rng, max_attrs=3, max_size=3, size_one=False)
    b = closure(sizes, cl)
    s = rng.uniform(0.5, 3.0, b.n_residuals)
    R = np.vstack([_residual_matrix(sizes, b.residual(j)) for j in range(b.n_residuals)])
    cov = sp.block_diag([_noise_cov(sizes, b.residual(j), s[j]) for j in range(b.n_residuals)]).toarray()
    sens = np.einsum("ij,ij->j", R, np.linalg.solve(cov, R))
    np.testing.assert_allclose(sens, np.sum(b.p / s), rtol=1e-10)
    var = b.V @ s
    for m, M in enumerate(cl):
        Ms = tuple(sorted(M))
        subsets = [j for j in range(b.n_residuals) if set(b.residual(j)) <= set(Ms)]
        # the residual answers restricted to M's attributes: R_A with 1^T summed over the rest
        Q = cvxdp.workloads.marginal(list(sizes), list(Ms)).toarray()
        K = [_reconstruction(sizes, Ms, b.residual(j)) for j in subsets]
        est = sum(Kj @ _residual_matrix(sizes, b.residual(j)) for Kj, j in zip(K, subsets))
        np.testing.assert_allclose(est, Q, atol=1e-12)                 # unbiased
        C = sum(Kj @ _noise_cov(sizes, b.residual(j), s[j]) @ Kj.T for Kj, j in zip(K, subsets))
        np.testing.assert_allclose(np.diag(C), var[m], rtol=1e-10)


def test_closure_refuses_bad_input():
    with pytest.raises(ValueError, match="outside"):
        closure([2, 3], [(0, 2)])
    with pytest.raises(ValueError, match="repeats"):
        closure([2, 3], [(1, 1)])
    with pytest.raises(ValueError, match="no cliques"):
        closure([2, 3], [])
    with pytest.raises(ValueError, match="sizes"):
        closure([2, 0], [(0,)])


def test_marginal_workload_names_and_errors():
    W = cvxdp.workloads.marginal_workload({"a": 2, "b": 3, "c": 4}, [("c", "a"), "b"])
    assert W.cliques == (("a", "c"), ("b",))
    assert W.residuals == ((), ("a",), ("b",), ("c",), ("a", "c"))
    assert W.n_residuals == 5 and W.n_marginals == 2
    assert W.residual_index(("c", "a")) == 4
    np.testing.assert_array_equal(W.cells(), [8.0, 3.0])
    W2 = cvxdp.workloads.marginal_workload([2, 3], [(0, 1)])
    assert W2.residuals[-1] == ("0", "1")
    with pytest.raises(ValueError, match="no cliques"):
        cvxdp.workloads.marginal_workload([2, 3], [])
    with pytest.raises(KeyError, match="unknown attribute"):
        cvxdp.workloads.marginal_workload([2, 3], [(0, 5)])
    with pytest.raises(ValueError, match="repeats"):
        cvxdp.workloads.marginal_workload([2, 3], [(0, 0)])
    s = cp.Variable(3, pos=True)
    with pytest.raises(ValueError, match="shape"):
        cvxdp.privacy_cost(W, s)
    with pytest.raises(ValueError, match="shape"):
        cvxdp.query_variance(W, s)


# ------------------------------------------------------------------------- the design
def _dense_optimum(sizes, W, c) -> float:
    """``privacy_cost(I, X)`` s.t. ``query_variance(L, X) <= c`` per cell, ``L`` the stacked
    marginals over the full domain, solved by the dense NEWTON_CG."""
    L = cvxdp.workloads.marginals(sizes, [list(m) for m in W.basis.cliques]).toarray()
    per_query = np.concatenate([np.full(int(np.prod([sizes[i] for i in m])), t)
                                for m, t in zip(W.basis.cliques, c)])
    d = L.shape[1]
    X = cp.Variable((d, d), PSD=True)
    dense = cp.Problem(cp.Minimize(cvxdp.privacy_cost(np.eye(d), X)),
                       [cvxdp.query_variance(L, X) <= per_query])
    dense.solve(method="cvxdp", solver=cvxdp.NEWTON_CG, eps_rel=1e-10)
    assert dense.status == cp.OPTIMAL
    return dense.value


def _model(W, c):
    s = cp.Variable(W.n_residuals, pos=True)
    return s, cp.Problem(cp.Minimize(cvxdp.privacy_cost(W, s)), [cvxdp.query_variance(W, s) <= c])


def _check_certified(prob, con, W, c, eps_rel):
    """``optimal``, every target met, and the duals' Lagrange bound within the gap."""
    assert prob.status == cp.OPTIMAL
    stats = prob.solver_stats.extra_stats
    assert stats["duals_certified"]
    lam = np.asarray(con.dual_value)
    assert np.all(lam >= 0)
    s = prob.variables()[0].value
    assert np.all(W.basis.V @ s <= c * (1 + 1e-12) + 1e-300)
    bound = dual_value(W.basis.p, W.basis.V, np.broadcast_to(c, lam.shape).astype(float), lam)
    assert (prob.value - bound) / prob.value <= eps_rel


@pytest.mark.parametrize("seed", range(16))
def test_design_against_clarabel(seed):
    rng = np.random.default_rng(seed)
    sizes, cl = _random_instance(rng)
    W = cvxdp.workloads.marginal_workload(list(sizes), cl)
    c = 10.0 ** rng.uniform(-2, 2, len(cl))
    s, prob = _model(W, c)
    prob.solve(method="cvxdp", solver=cvxdp.NEWTON_CG, eps_rel=1e-9)
    ours = prob.value
    _check_certified(prob, prob.constraints[0], W, c, 1e-9)
    assert prob.solver_stats.extra_stats["info"]["route"] == "residual Newton-CG"
    ref = cp.Problem(prob.objective, prob.constraints)
    ref.solve(solver=cp.CLARABEL, **CLARABEL)
    assert ref.status in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE)
    assert ours == pytest.approx(ref.value, rel=1e-6)


@pytest.mark.parametrize("scale", [1e-6, 1e-2, 1.0, 1e4, 1e9])
def test_design_at_extreme_target_scales(scale):
    """Targets from 1e-6 to 1e9: the optimum scales as ``1 / scale`` exactly (the design is
    homogeneous), certified relative to the cost itself."""
    rng = np.random.default_rng(7)
    W = cvxdp.workloads.marginal_workload([2, 3, 4, 2], [(0, 1), (1, 2), (2, 3), (0, 3), (1,)])
    c = rng.uniform(0.5, 2.0, W.n_marginals)
    _, base = _model(W, c)
    base.solve(method="cvxdp", solver=cvxdp.NEWTON_CG, eps_rel=1e-10)
    s, prob = _model(W, scale * c)
    prob.solve(method="cvxdp", solver=cvxdp.NEWTON_CG, eps_rel=1e-10)
    _check_certified(prob, prob.constraints[0], W, scale * c, 1e-10)
    assert prob.value * scale == pytest.approx(base.value, rel=1e-8)


@pytest.mark.parametrize("seed", range(5))
def test_design_equals_the_dense_fitness_for_use_optimum(seed):
    """On a domain small enough for the dense atoms, ``privacy_cost(I, X)`` subject to
    ``query_variance(L, X) <= c`` (``L`` the stacked marginals, ``c`` each marginal's target
    per cell) has the same optimum as the residual design (1e-6 relative)."""
    rng = np.random.default_rng(50 + seed)
    sizes, cl = _random_instance(rng, max_attrs=3, max_size=3, size_one=False)
    W = cvxdp.workloads.marginal_workload(list(sizes), cl)
    c = rng.uniform(0.5, 3.0, len(cl))
    _, prob = _model(W, c)
    prob.solve(method="cvxdp", solver=cvxdp.NEWTON_CG, eps_rel=1e-10)
    assert prob.value == pytest.approx(_dense_optimum(list(sizes), W, c), rel=1e-6)


def test_degenerate_workloads():
    """One clique; nested cliques; repeated cliques; attributes of size 1 (residuals with no
    queries: their variance is free and left at 1); a single attribute."""
    cases = [([3, 4], [(0, 1)]), ([3, 4, 2], [(0, 1, 2), (0, 1), (0,)]),
             ([3, 4], [(0, 1), (0, 1), (1,)]), ([1, 4, 1], [(0, 1), (1, 2)]), ([5], [(0,)])]
    for sizes, cl in cases:
        W = cvxdp.workloads.marginal_workload(sizes, cl)
        c = np.linspace(0.5, 2.0, len(cl))
        s, prob = _model(W, c)
        prob.solve(method="cvxdp", solver=cvxdp.NEWTON_CG, eps_rel=1e-9)
        _check_certified(prob, prob.constraints[0], W, c, 1e-9)
        np.testing.assert_array_equal(s.value[W.basis.p == 0], 1.0)
        ours = prob.value
        ref = cp.Problem(prob.objective, prob.constraints)
        ref.solve(solver=cp.CLARABEL, **CLARABEL)
        assert ours == pytest.approx(ref.value, rel=1e-6), (sizes, cl)


def test_a_target_of_zero_is_infeasible_and_bad_data_is_refused():
    W = cvxdp.workloads.marginal_workload([2, 3], [(0,), (1,)])
    s, prob = _model(W, np.array([1.0, 0.0]))
    prob.solve(method="cvxdp", solver=cvxdp.NEWTON_CG)
    assert prob.status == cp.INFEASIBLE
    s, prob = _model(W, np.array([1.0, np.nan]))
    with pytest.raises(ValueError):
        prob.solve(method="cvxdp", solver=cvxdp.NEWTON_CG)
    s, prob = _model(W, 1.0)
    with pytest.raises(ValueError, match="strategy"):
        prob.solve(method="cvxdp", solver=cvxdp.NEWTON_CG, strategy=np.eye(2))
    s = cp.Variable(W.n_residuals, pos=True)
    low = cp.Problem(cp.Minimize(cvxdp.privacy_cost(W, s)),
                     [cvxdp.query_variance(W, s) <= 1.0, s >= 0.1])
    with pytest.raises(cvxdp.NotRecognised, match="negative coefficient"):
        low.solve(method="cvxdp", solver=cvxdp.NEWTON_CG)


def test_slices_sums_scaling_and_the_plain_model_for_standard_solvers():
    """Targets on a slice and on a weighted sum, a scaled objective with a constant: the same
    optimum as Clarabel, and the duals of each constraint in cvxpy's convention."""
    W = cvxdp.workloads.marginal_workload([3, 3, 2], [(0, 1), (1, 2), (0, 2)])
    s = cp.Variable(W.n_residuals, pos=True)
    v = cvxdp.query_variance(W, s)
    cons = [v[:2] <= np.array([1.0, 2.0]), cp.sum(cp.multiply([1.0, 2.0, 3.0], v)) <= 9.0]
    prob = cp.Problem(cp.Minimize(3.0 * cvxdp.privacy_cost(W, s) + 1.5), cons)
    prob.solve(method="cvxdp", solver=cvxdp.NEWTON_CG, eps_rel=1e-10)
    assert prob.status == cp.OPTIMAL
    ours = prob.value
    duals = [np.atleast_1d(c.dual_value).copy() for c in cons]
    ref = cp.Problem(prob.objective, prob.constraints)
    ref.solve(solver=cp.CLARABEL, **CLARABEL)
    assert ours == pytest.approx(ref.value, rel=1e-7)
    for d, c in zip(duals, cons):
        np.testing.assert_allclose(d, np.atleast_1d(c.dual_value), rtol=1e-4, atol=1e-6)


def test_solver_none_warm_start_and_verbose(caplog):
    W = cvxdp.workloads.marginal_workload([4, 3, 5, 2], [c for c in itertools.combinations(range(4), 2)])
    s, prob = _model(W, 2.0)
    prob.solve(method="cvxdp")
    assert prob.solver_stats.solver_name == cvxdp.NEWTON_CG and prob.status == cp.OPTIMAL
    first = prob.solver_stats.num_iters
    prob.solve(method="cvxdp", eps_rel=1e-10, verbose=True)
    assert prob.solver_stats.extra_stats["warm_started"]
    assert prob.solver_stats.num_iters < first + 5
    assert "residual design" in caplog.text


def test_numerical_layer_directly():
    """The solver on arrays: a private column in every row gives the closed form in one step;
    a workload with nested marginals needs the primal-dual rows; both certified."""
    b = closure([3, 4], [(0, 1)])
    res = solve(b.p, b.V, np.array([2.0]), DesignSettings(eps_rel=1e-12))
    assert res.status == "optimal" and res.iterations == 1
    w = np.sum(np.sqrt(b.p * b.V.toarray()[0])) ** 2
    assert res.objective == pytest.approx(w / 2.0, rel=1e-12)
    b = closure([3, 4, 2], [(0, 1, 2), (0, 1), (0,)])
    res = solve(b.p, b.V, np.array([1.0, 0.05, 0.01]), DesignSettings(eps_rel=1e-10))
    assert res.status == "optimal" and res.info["interior_rows"] == 2
    assert res.gap <= 1e-10


@pytest.mark.parametrize("budget", [0.5, 2.0, 40.0])
def test_privacy_first_problem_two(budget):
    """SM-II's Problem 2 in the residual basis: ``minimize t`` s.t. ``query_variance(W, s) <=
    t c`` and ``privacy_cost(W, s) <= budget``; the same optimum and duals as Clarabel, and the
    budget met exactly."""
    W = cvxdp.workloads.marginal_workload([2, 3, 4, 3], [(0, 1), (1, 2), (2, 3), (1,)])
    c = np.array([1.0, 2.0, 3.0, 0.3])
    s, t = cp.Variable(W.n_residuals, pos=True), cp.Variable()
    prob = cp.Problem(cp.Minimize(2.0 * t), [cvxdp.query_variance(W, s) <= t * c,
                                             cvxdp.privacy_cost(W, s) <= budget])
    prob.solve(method="cvxdp", solver=cvxdp.NEWTON_CG, eps_rel=1e-10)
    assert prob.status == cp.OPTIMAL and prob.solver_stats.extra_stats["duals_certified"]
    assert cvxdp.privacy_cost(W, s).value == pytest.approx(budget, rel=1e-12)
    ours, duals = prob.value, [np.atleast_1d(con.dual_value).copy() for con in prob.constraints]
    ref = cp.Problem(prob.objective, prob.constraints)
    ref.solve(solver=cp.CLARABEL, **CLARABEL)
    assert ours == pytest.approx(ref.value, rel=1e-7)
    for d, con in zip(duals, ref.constraints):
        np.testing.assert_allclose(d, np.atleast_1d(con.dual_value), rtol=1e-5, atol=1e-7)
    with pytest.raises(cvxdp.NotRecognised, match="constant term"):
        cp.Problem(cp.Minimize(t), [cvxdp.query_variance(W, s) <= t * c + 1.0,
                                    cvxdp.privacy_cost(W, s) <= budget]).solve(
            method="cvxdp", solver=cvxdp.NEWTON_CG)


DEGENERATE = [
    ([1, 3, 2], [(0, 1), (1, 2)], 1.0),            # an attribute of size 1
    ([2, 2, 2], [(0, 1, 2)], 1.0),                 # one clique
    ([3, 2, 4], [(0, 1, 2), (0, 1), (2,)], 1.0),   # nested cliques
    ([3, 3], [(0, 1), (0, 1), (0,), (0,)], 1.0),   # repeated cliques
    ([2, 3, 2], [(0, 1), (1, 2), (0, 2)], 1e-6),   # tiny targets
    ([2, 3, 2], [(0, 1), (1, 2), (0, 2)], 1e9),    # huge targets
]


@pytest.mark.parametrize("sizes, cliques, scale", DEGENERATE)
def test_degenerate_designs_equal_the_dense_optimum(sizes, cliques, scale):
    """The residual design and the dense fitness-for-use model (``privacy_cost(I, X)`` s.t.
    ``query_variance(L, X) <= c`` per cell) agree to 1e-6 on degenerate workloads too."""
    W = cvxdp.workloads.marginal_workload(sizes, cliques)
    c = scale * np.linspace(0.5, 1.5, len(cliques))
    _, prob = _model(W, c)
    prob.solve(method="cvxdp", solver=cvxdp.NEWTON_CG, eps_rel=1e-10)
    assert prob.status == cp.OPTIMAL
    assert prob.value == pytest.approx(_dense_optimum(sizes, W, c), rel=1e-6)

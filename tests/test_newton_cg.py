"""SM-II Newton-CG (solvers/newton_cg.py): derivatives, certificates, known answers."""
import cvxpy as cp
import numpy as np
import pytest

from solvers.newton_cg import (FitnessData, NewtonSettings, _Smoothed, choose_basis, dual_bound,
                               objective_parts, solve)

# Squared privacy costs of the prefix workload with unit targets (issue 4, certified here by
# a duality gap below 1e-8): d = 2, 4, 8, 16, 32, 64.
PREFIX_COSTS = {2: 1.3333333, 4: 1.7586013, 8: 2.2815606, 16: 2.9052529, 32: 3.6307234,
                64: 4.4578692}


def random_instance(seed, k=5, m=7, eta=0.0):
    rng = np.random.default_rng(seed)
    B = rng.normal(size=(k, k + 2))
    L = rng.normal(size=(m, k))
    c = rng.uniform(0.5, 2.0, m)
    A = rng.normal(size=(k, k))
    return FitnessData(B, L, c, eta), A @ A.T + k * np.eye(k)


@pytest.mark.parametrize("eta", [0.0, 0.3])
def test_gradient_and_hessian_vector_product_match_finite_differences(eta):
    d, X = random_instance(0, eta=eta)
    rng = np.random.default_rng(1)
    D = rng.normal(size=X.shape)
    D = (D + D.T) / 2
    h = 1e-6
    F = _Smoothed(d, X, 3.0, 2.0)
    Fp, Fm = _Smoothed(d, X + h * D, 3.0, 2.0), _Smoothed(d, X - h * D, 3.0, 2.0)
    assert (Fp.value - Fm.value) / (2 * h) == pytest.approx(np.sum(F.grad * D), rel=1e-6)
    fd = (Fp.grad - Fm.grad) / (2 * h)
    np.testing.assert_allclose(F.hvp(D), fd, atol=1e-7 * np.abs(fd).max())


@pytest.mark.parametrize("d_", sorted(PREFIX_COSTS))
def test_prefix_workload_known_costs(d_):
    W = np.tril(np.ones((d_, d_)))
    res = solve(FitnessData(np.eye(d_), W, np.ones(d_)), NewtonSettings(eps_rel=1e-7))
    assert res.status == "optimal"
    assert res.objective == pytest.approx(PREFIX_COSTS[d_], abs=5e-7)
    assert res.lower_bound <= res.objective
    assert res.gap <= 1e-7
    # the returned precision meets every target and has that cost
    p, q, _, _ = objective_parts(FitnessData(np.eye(d_), W, np.ones(d_)), res.x)
    assert q.max() <= 1 + 1e-12 and p.max() == pytest.approx(res.objective, rel=1e-12)


def test_dual_bound_is_a_lower_bound_for_any_multipliers():
    d, _ = random_instance(3)
    res = solve(d, NewtonSettings(eps_rel=1e-9))
    rng = np.random.default_rng(4)
    for _ in range(20):
        bound = dual_bound(d, rng.random(d.B.shape[1]), rng.random(d.L.shape[0]))
        assert bound <= res.objective * (1 + 1e-9)


def clarabel_cost(B, L, c):
    k = B.shape[0]
    X = cp.Variable((k, k), PSD=True)
    cons = [cp.matrix_frac(L[i], X) <= c[i] for i in range(L.shape[0])]
    prob = cp.Problem(cp.Minimize(cp.max(cp.diag(B.T @ X @ B))), cons)
    prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    return prob.value


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_against_clarabel_on_random_instances(seed):
    d, _ = random_instance(seed, k=4, m=6)
    res = solve(d, NewtonSettings(eps_rel=1e-8))
    assert res.status == "optimal"
    assert res.objective == pytest.approx(clarabel_cost(d.B, d.L, d.c), rel=1e-6)


@pytest.mark.parametrize("n", [2, 6, 15])
def test_identity_plus_sum_closed_form(n):
    """Sec. 5.1.2 of Xiao et al.: identity + sum workload, all targets 1.  By symmetry the
    optimum is X = a I + b 1 1^T with both variance constraints tight, which gives
    a = b = n / (n + 1) and the squared privacy cost a + b = 2n / (n + 1)."""
    W = np.vstack([np.eye(n), np.ones((1, n))])
    res = solve(FitnessData(np.eye(n), W, np.ones(n + 1)), NewtonSettings(eps_rel=1e-9))
    assert res.objective == pytest.approx(2 * n / (n + 1), rel=1e-8)
    a = n / (n + 1)
    np.testing.assert_allclose(res.x, a * np.eye(n) + a * np.ones((n, n)), atol=1e-5)


def test_basis_invariance():
    """Two bases of the same workload give the same optimal cost (Theorem 2)."""
    rng = np.random.default_rng(5)
    W = rng.integers(0, 2, size=(8, 5)).astype(float)
    L1, B1 = choose_basis(W)
    np.testing.assert_allclose(L1 @ B1, W, atol=1e-10)
    T = rng.normal(size=(B1.shape[0], B1.shape[0])) + 3 * np.eye(B1.shape[0])
    B2, L2 = T @ B1, L1 @ np.linalg.inv(T)
    c = rng.uniform(1, 3, 8)
    r1 = solve(FitnessData(B1, L1, c), NewtonSettings(eps_rel=1e-9))
    r2 = solve(FitnessData(B2, L2, c), NewtonSettings(eps_rel=1e-9))
    assert r1.objective == pytest.approx(r2.objective, rel=1e-7)


def test_hybrid_total_variance_term_trades_cost_for_total_error():
    """eta > 0 adds the total variance to the objective (sec. 6.1): at the same privacy cost
    the total variance must not be larger than without it, and the cost not smaller."""
    d, _ = random_instance(6)
    plain = solve(d, NewtonSettings(eps_rel=1e-8))
    d.eta = 1.0
    hybrid = solve(d, NewtonSettings(eps_rel=1e-8, max_iters=300))
    _, q_plain, _, _ = objective_parts(d, plain.x)
    _, q_hyb, _, _ = objective_parts(d, hybrid.x)
    # compare at equal privacy cost: variances scale inversely with the cost
    total_plain = np.sum(q_plain * d.c) * plain.objective
    total_hyb = np.sum(q_hyb * d.c) * hybrid.objective
    assert hybrid.objective >= plain.objective * (1 - 1e-7)
    assert total_hyb <= total_plain * (1 + 1e-6)

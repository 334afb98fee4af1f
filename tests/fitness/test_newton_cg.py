"""SM-II Newton-CG (solvers/newton_cg.py): derivatives, certificates, known answers."""
import cvxpy as cp
import numpy as np
import pytest

from cvxdp.solvers.fitness.newton_cg import (FitnessData, NewtonSettings, _Smoothed, _cg, choose_basis,
                               dual_bound, objective_parts, solve, uniform_weight_start)

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


@pytest.mark.parametrize("eta, with_priors", [(0.0, False), (0.3, False), (0.0, True)])
def test_gradient_and_hessian_vector_product_match_finite_differences(eta, with_priors):
    d, X = random_instance(0, eta=eta)
    rng = np.random.default_rng(1)
    D = rng.normal(size=X.shape)
    D = (D + D.T) / 2
    h = 1e-6
    # exponential-multiplier priors: log-weights, one per basis column and one per query
    pri = (np.log(rng.dirichlet(np.ones(d.B.shape[1]))), np.log(rng.dirichlet(np.ones(len(d.c))))) \
        if with_priors else (None, None)
    F = _Smoothed(d, X, 3.0, 2.0, priors=pri)
    Fp = _Smoothed(d, X + h * D, 3.0, 2.0, priors=pri)
    Fm = _Smoothed(d, X - h * D, 3.0, 2.0, priors=pri)
    assert (Fp.value - Fm.value) / (2 * h) == pytest.approx(np.sum(F.grad * D), rel=1e-6)
    fd = (Fp.grad - Fm.grad) / (2 * h)
    np.testing.assert_allclose(F.hvp(D), fd, atol=1e-7 * np.abs(fd).max())


def test_soft_max_with_priors_is_a_lower_smoothing_of_the_max():
    """With priors pi in the simplex, max v + log(pi_j*) / t <= smax <= max v; with uniform
    priors it is the plain soft-max shifted by -log(n) / t."""
    d, X = random_instance(3)
    p, q, *_ = objective_parts(d, X)
    n = d.B.shape[1]
    pri = np.log(np.random.default_rng(0).dirichlet(np.ones(n)))
    F = _Smoothed(d, X, 5.0, 5.0, priors=(pri, None))
    G = _Smoothed(d, X, 5.0, 5.0, priors=(np.full(n, -np.log(n)), None))
    H = _Smoothed(d, X, 5.0, 5.0)
    fq = H.value - (np.log(np.sum(np.exp(5.0 * (p - p.max())))) / 5.0 + p.max())
    fp_pri = F.value - fq
    assert p.max() + pri[np.argmax(p)] / 5.0 <= fp_pri <= p.max() + 1e-12
    assert G.value == pytest.approx(H.value - np.log(n) / 5.0, rel=1e-12)
    np.testing.assert_allclose(G.w, H.w, rtol=1e-12)


def test_uniform_weight_start_minimizes_the_averaged_problem():
    """The start is the matrix geometric mean: the gradient P - X^{-1} Q X^{-1} of
    <X, P> + <X^{-1}, Q> (P = B B^T / n, Q = L^T diag(1/c) L / m) vanishes there."""
    d, _ = random_instance(4, k=6, m=9)
    X = uniform_weight_start(d)
    np.linalg.cholesky(X)
    n, m = d.B.shape[1], len(d.c)
    P = d.B @ d.B.T / n
    Q = (d.L.T / (m * d.c)) @ d.L
    Xi = np.linalg.inv(X)
    # Q is regularized by 1e-8 of its mean eigenvalue (a workload without full column rank)
    np.testing.assert_allclose(P - Xi @ Q @ Xi, 0.0, atol=1e-6 * np.abs(P).max())


def test_cg_returns_an_upper_bound_on_the_newton_decrement():
    """g^T K^{-1} g >= g^T H^{-1} g, since H - K is positive semidefinite.  The Hessian is
    formed here in an orthonormal basis of the symmetric matrices."""
    d, X = random_instance(5)
    F = _Smoothed(d, X, 4.0, 4.0)
    g = F.grad
    k = d.k
    basis = []
    for a in range(k):
        for b in range(a, k):
            E = np.zeros((k, k))
            E[a, b] = E[b, a] = 1.0 if a == b else 2 ** -0.5
            basis.append(E)
    H = np.array([[np.sum(Ei * F.hvp(Ej)) for Ej in basis] for Ei in basis])
    gv = np.array([np.sum(Ei * g) for Ei in basis])
    decrement = float(gv @ np.linalg.solve(H, gv))
    _, _, gKg = _cg(F, g, 3, 0.5, F.preconditioner())
    assert 0 < decrement <= gKg * (1 + 1e-10)


@pytest.mark.parametrize("d_", sorted(PREFIX_COSTS))
def test_prefix_workload_known_costs(d_):
    W = np.tril(np.ones((d_, d_)))
    res = solve(FitnessData(np.eye(d_), W, np.ones(d_)), NewtonSettings(eps_rel=1e-7))
    assert res.status == "optimal"
    assert res.objective == pytest.approx(PREFIX_COSTS[d_], abs=5e-7)
    assert res.lower_bound <= res.objective
    assert res.gap <= 1e-7
    # the returned precision meets every target and has that cost
    p, q, *_ = objective_parts(FitnessData(np.eye(d_), W, np.ones(d_)), res.x)
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
    _, q_plain, *_ = objective_parts(d, plain.x)
    _, q_hyb, *_ = objective_parts(d, hybrid.x)
    # compare at equal privacy cost: variances scale inversely with the cost
    total_plain = np.sum(q_plain * d.c) * plain.objective
    total_hyb = np.sum(q_hyb * d.c) * hybrid.objective
    assert hybrid.objective >= plain.objective * (1 - 1e-7)
    assert total_hyb <= total_plain * (1 + 1e-6)


def test_dual_bound_nuclear_norm_form():
    """dual_bound computes tr((P^{1/2} Q P^{1/2})^{1/2}) as the nuclear norm of
    diag(sqrt mu) B^T L^T diag(sqrt lam): equal to the eigenvalue formula on well-conditioned
    data, and exact (no square roots of rounding-sized eigenvalues) for a rank-one Q."""
    d, _ = random_instance(7)
    rng = np.random.default_rng(7)
    mu = rng.dirichlet(np.ones(d.B.shape[1]))
    lam = rng.random(d.L.shape[0])
    P = (d.B * mu) @ d.B.T
    Q = (d.L.T * lam) @ d.L
    ev, V = np.linalg.eigh(P)
    Ph = (V * np.sqrt(ev)) @ V.T
    T = np.sum(np.sqrt(np.maximum(np.linalg.eigvalsh(Ph @ Q @ Ph), 0)))
    assert dual_bound(d, mu, lam) == pytest.approx(T * T / (lam @ d.c), rel=1e-10)
    # rank one: P = b b^T, Q = l l^T / c gives (b . l)^2 / c exactly
    lam1 = np.zeros(d.L.shape[0])
    lam1[2] = 1.0
    mu1 = np.zeros(d.B.shape[1])
    mu1[4] = 1.0
    exact = float(d.B[:, 4] @ d.L[2]) ** 2 / d.c[2]
    assert dual_bound(d, mu1, lam1) == pytest.approx(exact, rel=1e-13)

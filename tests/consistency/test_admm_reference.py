"""cvxdp.ADMM against standard solvers on random and structured instances.

Objective gaps, constraint residuals, and the solution itself where it is
unique (elastic net and L2 are strictly convex; pure L1 is not, so only
objectives are compared there).
"""
import numpy as np
import pytest
import scipy.sparse as sp
import cvxpy as cp
from scipy.optimize import linprog

import cvxdp
from conftest import max_violation, reference, solve_admm, sparse_counts

W = cvxdp.workloads
M = cvxdp.mechanisms


def tree_problem(loss, n_leaves=64, k=2, eps=1.0, seed=0, nonneg=True, plain=False, alpha=0.9):
    rng = np.random.default_rng(seed)
    tree = W.hierarchy(n_leaves, k)
    y = M.laplace(tree.queries, sparse_counts(n_leaves, rng), epsilon=eps, rng=seed)
    x = cp.Variable(tree.n_nodes)
    obj = {"l1": cvxdp.nll(y, x), "en": cvxdp.elastic_net(y, x, alpha=alpha),
           "l2": cp.sum_squares(x - y.answers) / (2 * y.scale ** 2)}[loss]
    cons = [tree.consistency @ x == 0] if plain else [cvxdp.consistent(tree, x)]
    if nonneg:
        cons.append(x >= 0)
    return cp.Problem(cp.Minimize(obj), cons), x, tree, y


def table_problem(loss, shape=(4, 3, 5), seed=0, marg=((0,), (1,), (2,)), alpha=0.7):
    rng = np.random.default_rng(seed)
    T = rng.poisson(2.0, size=shape).astype(float)
    T[rng.random(shape) < 0.4] = 0
    Q = W.marginals(shape, list(marg))
    known = Q @ T.ravel()
    meas = M.laplace(sp.identity(T.size), T.ravel(), epsilon=0.5, rng=seed)
    z = cp.Variable(T.size)
    obj = cvxdp.nll(meas, z) if loss == "l1" else cvxdp.elastic_net(meas, z, alpha=alpha)
    return cp.Problem(cp.Minimize(obj), [Q @ z == known, z >= 0]), z


def check_against(prob, rel_obj=1e-6, unique=False, sol_atol=1e-5, **admm_opts):
    ref_val, ref_x, _ = reference(prob)
    val, xs, _ = solve_admm(prob, **admm_opts)
    assert prob.status == cp.OPTIMAL
    assert abs(val - ref_val) <= rel_obj * max(1.0, abs(ref_val)), (val, ref_val)
    assert max_violation(prob) <= 1e-6
    stats = prob.solver_stats
    assert stats.solver_name == cvxdp.ADMM and stats.num_iters > 0
    assert stats.extra_stats["gap"] <= admm_opts.get("eps_rel", 1e-6)
    if unique:
        for vid, v in xs.items():
            np.testing.assert_allclose(v, ref_x[vid], atol=sol_atol * max(1.0, np.abs(ref_x[vid]).max()))
    return val, ref_val


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("eps", [0.1, 1.0])
def test_tree_l1_nonneg(seed, eps):
    prob, *_ = tree_problem("l1", 64, 2, eps, seed)
    check_against(prob)


@pytest.mark.parametrize("k,n_leaves", [(3, 27), (2, 50), (4, 16)])
def test_tree_l1_other_shapes(k, n_leaves):
    prob, *_ = tree_problem("l1", n_leaves, k, 1.0, 4)
    check_against(prob)


@pytest.mark.parametrize("seed", [0, 1])
def test_tree_elastic_net_unique_solution(seed):
    prob, *_ = tree_problem("en", 64, 2, 1.0, seed, alpha=0.5)
    check_against(prob, rel_obj=1e-8, unique=True, sol_atol=1e-6)


def test_tree_l2_without_bounds_is_the_tree_projection():
    prob, x, tree, y = tree_problem("l2", 128, 2, 1.0, 3, nonneg=False)
    check_against(prob, rel_obj=1e-9, unique=True)
    np.testing.assert_allclose(x.value, tree.project(y.answers), atol=1e-6)


def test_plain_sparse_spelling_takes_the_tree_path():
    prob, x, tree, _ = tree_problem("l1", 64, 2, 1.0, 5, plain=True)
    check_against(prob)
    assert prob.solver_stats.extra_stats["info"]["route"] == "ADMM separable/tree"


@pytest.mark.parametrize("loss", ["l1", "en"])
@pytest.mark.parametrize("seed", [0, 1])
def test_contingency_table_with_known_marginals(loss, seed):
    prob, _ = table_problem(loss, seed=seed, marg=((0, 1), (1, 2)))
    check_against(prob, unique=(loss == "en"))


def test_matrix_mechanism_form():
    """min |A x - r|_1 / b, x >= 0 (Lee et al. Algorithm 4) with a Haar strategy."""
    rng = np.random.default_rng(8)
    n = 32
    A = W.wavelet(n)
    meas = M.laplace(A, sparse_counts(n, rng), epsilon=1.0, rng=8)
    x = cp.Variable(n)
    prob = cp.Problem(cp.Minimize(cvxdp.nll(meas, x)), [x >= 0])
    check_against(prob, rel_obj=1e-7)
    assert prob.solver_stats.extra_stats["info"]["route"] == "LP (HiGHS dual simplex)"
    check_against(prob, rel_obj=1e-7, general_route="admm")
    assert prob.solver_stats.extra_stats["info"]["route"] == "ADMM general"


def test_l1_optimum_matches_highs_lp():
    """The L1 problem as the LP of Lee et al. sec. 4.1, solved by scipy's HiGHS."""
    prob, x, tree, y = tree_problem("l1", 64, 2, 1.0, 9)
    solve_admm(prob)
    n, p = tree.n_nodes, tree.consistency.shape[0]
    I = sp.identity(n)
    res = linprog(np.r_[np.zeros(n), np.ones(n) / y.scale],
                  A_ub=sp.vstack([sp.hstack([I, -I]), sp.hstack([-I, -I])]),
                  b_ub=np.r_[y.answers, -y.answers],
                  A_eq=sp.hstack([tree.consistency, sp.csr_matrix((p, n))]), b_eq=np.zeros(p),
                  bounds=[(0, None)] * n + [(None, None)] * n, method="highs")
    assert res.status == 0
    assert abs(prob.value - res.fun) <= 1e-6 * res.fun


@pytest.mark.parametrize("loss", ["l1", "l2"])
def test_sorted_histogram_order_constraints(loss):
    rng = np.random.default_rng(2)
    truth = np.sort(rng.poisson(3, 40) * (rng.random(40) < 0.6))
    noisy = truth + rng.laplace(scale=2.0, size=40)
    x = cp.Variable(40)
    obj = cp.norm1(x - noisy) if loss == "l1" else cp.sum_squares(x - noisy)
    prob = cp.Problem(cp.Minimize(obj), [x[:-1] <= x[1:], x >= 0])
    check_against(prob, unique=(loss == "l2"))
    # L1 under order chains is solved exactly (L1 isotonic regression), L2 by the ADMM
    want = "isotonic L1 (exact)" if loss == "l1" else "ADMM separable/order"
    assert prob.solver_stats.extra_stats["info"]["route"] == want


def test_groups_with_different_scales_and_repeated_measurements():
    """Leaves measured twice (two releases), internal nodes once: general splitting."""
    rng = np.random.default_rng(4)
    tree = W.hierarchy(32, 2)
    data = sparse_counts(32, rng)
    m1 = M.laplace(tree.queries, data, epsilon=1.0, rng=1)
    m2 = M.laplace(sp.identity(32), data, epsilon=0.5, rng=2)
    leaves = cp.Variable(32)
    prob = cp.Problem(cp.Minimize(cvxdp.nll([m1, m2], leaves)), [leaves >= 0])
    check_against(prob, rel_obj=1e-7)


def test_kgram_prefix_consistency_forest():
    """(k+1)-gram counts sum to their k-gram prefix: a forest with one root per 1-gram."""
    rng = np.random.default_rng(6)
    sigma = 3
    n1, n2, n3 = sigma, sigma ** 2, sigma ** 3
    n = n1 + n2 + n3
    rows, cols, vals = [], [], []
    for p in range(n1 + n2):            # node p has children sigma*p + n1 + j (breadth first)
        base = n1 + (p * sigma if p < n1 else n2 + (p - n1) * sigma) - (0 if p < n1 else 0)
        kids = (n1 + p * sigma + np.arange(sigma)) if p < n1 else (n1 + n2 + (p - n1) * sigma + np.arange(sigma))
        rows += [p] * (sigma + 1)
        cols += [p] + list(kids)
        vals += [1.0] + [-1.0] * sigma
        del base
    A = sp.csr_matrix((vals, (rows, cols)), shape=(n1 + n2, n))
    leaf_counts = rng.poisson(4, n3).astype(float)
    counts = np.zeros(n)
    counts[n1 + n2:] = leaf_counts
    counts[n1:n1 + n2] = leaf_counts.reshape(n2, sigma).sum(1)
    counts[:n1] = counts[n1:n1 + n2].reshape(n1, sigma).sum(1)
    noisy = counts + rng.laplace(scale=3.0, size=n)
    x = cp.Variable(n)
    prob = cp.Problem(cp.Minimize(cp.norm1(x - noisy)), [A @ x == 0, x >= 0])
    check_against(prob)
    assert prob.solver_stats.extra_stats["info"]["route"] == "ADMM separable/tree"


def test_nonneg_variable_attribute_and_upper_bounds():
    rng = np.random.default_rng(3)
    tree = W.hierarchy(16, 2)
    y = M.laplace(tree.queries, sparse_counts(16, rng), epsilon=1.0, rng=3)
    x = cp.Variable(tree.n_nodes, nonneg=True)
    prob = cp.Problem(cp.Minimize(cvxdp.nll(y, x)), [cvxdp.consistent(tree, x), x <= 40])
    check_against(prob)


def test_parameters_are_read_at_solve_time():
    tree = W.hierarchy(16, 2)
    p = cp.Parameter(tree.n_nodes)
    x = cp.Variable(tree.n_nodes)
    prob = cp.Problem(cp.Minimize(cp.norm1(x - p)), [cvxdp.consistent(tree, x), x >= 0])
    rng = np.random.default_rng(0)
    for _ in range(2):
        p.value = tree.queries @ sparse_counts(16, rng) + rng.laplace(scale=5, size=tree.n_nodes)
        check_against(prob)


def test_noise_free_consistent_data_is_reproduced_exactly():
    rng = np.random.default_rng(1)
    tree = W.hierarchy(64, 2)
    exact = tree.queries @ sparse_counts(64, rng)
    meas = cvxdp.Measurement(tree.queries, exact, "laplace", 3.0)
    x = cp.Variable(tree.n_nodes)
    for obj in (cvxdp.nll(meas, x), cvxdp.elastic_net(meas, x, 0.5)):
        prob = cp.Problem(cp.Minimize(obj), [cvxdp.consistent(tree, x), x >= 0])
        solve_admm(prob)
        assert prob.status == cp.OPTIMAL
        np.testing.assert_allclose(x.value, exact, atol=1e-9)
        assert prob.value <= 1e-9


def test_other_standard_solvers_agree():
    """SCS (conic) and OSQP (QP) reach the same optimum on small instances."""
    prob, *_ = tree_problem("l2", 16, 2, 1.0, 2)
    val, _, _ = solve_admm(prob)
    prob.solve(solver=cp.OSQP, eps_abs=1e-9, eps_rel=1e-9, max_iter=200000)
    assert abs(prob.value - val) <= 1e-5 * val
    prob, *_ = tree_problem("l1", 16, 2, 1.0, 2)
    val, _, _ = solve_admm(prob)
    prob.solve(solver=cp.SCS, eps_abs=1e-9, eps_rel=1e-9, max_iters=100000)
    assert abs(prob.value - val) <= 1e-5 * val


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_duals_match_clarabel_on_strictly_convex_instances(seed):
    """Elastic net with large counts (full-row-rank constraints, nonneg inactive):
    the multipliers are unique and must agree with Clarabel's, with cvxpy's signs."""
    rng = np.random.default_rng(seed)
    tree = W.hierarchy(32, 2)
    y = M.laplace(tree.queries, rng.integers(50, 200, 32).astype(float), epsilon=1.0, rng=seed)
    x = cp.Variable(tree.n_nodes)
    shape = (3, 4, 5)
    T = rng.poisson(20, size=shape).astype(float)
    Q = W.marginal(shape, (0, 1))
    meas = M.laplace(sp.identity(T.size), T.ravel(), epsilon=0.5, rng=seed)
    z = cp.Variable(T.size)
    problems = [
        cp.Problem(cp.Minimize(cvxdp.elastic_net(y, x, alpha=0.5)), [cvxdp.consistent(tree, x), x >= 0]),
        cp.Problem(cp.Minimize(cvxdp.elastic_net(meas, z, alpha=0.5)), [Q @ z == Q @ T.ravel(), z >= 0]),
    ]
    for prob in problems:
        _, _, ref_duals = reference(prob)
        _, _, duals = solve_admm(prob)
        for c in prob.constraints:
            scale = max(1.0, np.abs(ref_duals[c.id]).max())
            np.testing.assert_allclose(duals[c.id], ref_duals[c.id], atol=1e-5 * scale)


@pytest.mark.parametrize("seed", [0, 1])
def test_l1_duals_satisfy_kkt(seed):
    """Pure L1 duals are not unique; ours must still certify optimality: stationarity
    C^T y - s in -d|x - y|/b, s >= 0, s * x = 0 (complementarity)."""
    prob, x, tree, y = tree_problem("l1", 64, 2, 1.0, seed)
    solve_admm(prob)
    yd, s = prob.constraints[0].dual_value, prob.constraints[1].dual_value
    g = -(tree.consistency.T @ yd) + s                 # must lie in d(|x - y| / b)
    r = x.value - y.answers
    w = 1.0 / y.scale
    kink = np.abs(r) <= 1e-7 * max(1.0, np.abs(y.answers).max())
    assert np.all(np.abs(g[kink]) <= w + 1e-8)
    np.testing.assert_allclose(g[~kink], w * np.sign(r[~kink]), atol=1e-8)
    assert np.all(s >= 0)
    assert np.max(np.abs(s * x.value)) <= 1e-8


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matrix_mechanism_random_ranges_with_known_total(seed):
    """General splitting with an equality: min |R x - r|_1 / b, sum(x) = N, x >= 0."""
    rng = np.random.default_rng(seed)
    n = 24
    R = W.random_ranges(n, 60, rng=seed)
    data = sparse_counts(n, rng, zero_frac=0.5)
    meas = M.laplace(R, data, epsilon=0.5, rng=seed)
    x = cp.Variable(n)
    prob = cp.Problem(cp.Minimize(cvxdp.nll(meas, x)), [x >= 0, cp.sum(x) == data.sum()])
    check_against(prob, rel_obj=1e-7)
    assert prob.solver_stats.extra_stats["info"]["route"] == "LP (HiGHS dual simplex)"
    check_against(prob, rel_obj=1e-7, general_route="admm")
    assert prob.solver_stats.extra_stats["info"]["route"] == "ADMM general"


@pytest.mark.parametrize("loss", ["l1", "en"])
def test_penalty_split_algorithm_1(loss):
    """equality_split='penalty': A x - b as a residual block, x-update with A^T A + 2 I."""
    prob, _ = table_problem(loss, seed=3, marg=((0, 1),))
    ref_val, _, _ = reference(prob)
    val, _, _ = solve_admm(prob, equality_split="penalty", eps_rel=1e-7)
    assert prob.status == cp.OPTIMAL
    assert prob.solver_stats.extra_stats["info"]["route"] == "ADMM general/penalty"
    assert abs(val - ref_val) <= 1e-6 * abs(ref_val)
    assert max_violation(prob) <= 1e-6

"""cvxdp.error_bars: exact standard errors against dense covariance formulas, the bootstrap
against the exact ones where both apply, the choice of ``auto``, and bad input."""
from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest
import scipy.linalg as sl
import scipy.sparse as sp

import cvxdp
from cvxdp.solvers.consistency import histogram_tree
from cvxdp.recognise.consistency import recognise


def _dense_cov(A, sig2, E=None, W=None):
    """Covariance of argmin (A x - y)^T W (A x - y) s.t. E x = const, Cov(y) = diag(sig2)."""
    A = A.toarray() if sp.issparse(A) else np.asarray(A, float)
    W = np.eye(A.shape[0]) if W is None else np.diag(W)
    Z = np.eye(A.shape[1]) if E is None else sl.null_space(np.asarray(E, float))
    K = Z @ np.linalg.inv(Z.T @ A.T @ W @ A @ Z) @ Z.T
    G = K @ A.T @ W
    return G @ np.diag(sig2) @ G.T


def _tree_model(n_leaves, branching, sigma, seed, layout="hay"):
    rng = np.random.default_rng(seed)
    tree = cvxdp.workloads.hierarchy(n_leaves, branching) if layout == "hay" else \
        cvxdp.workloads.hierarchy(n_leaves, branching, layout=layout)
    counts = rng.integers(0, 20, n_leaves).astype(float)
    m = cvxdp.mechanisms.gaussian(tree.queries, counts, sigma=sigma, rng=rng)
    return tree, m


@pytest.mark.parametrize("n_leaves,branching", [(16, 2), (10, 3), (27, 3), (7, 5), (50, 4)])
def test_exact_tree_in_node_space_matches_dense(n_leaves, branching):
    tree, m = _tree_model(n_leaves, branching, 2.5, n_leaves)
    x = cp.Variable(tree.n_nodes)
    prob = cp.Problem(cp.Minimize(cvxdp.nll(m, x)), [cvxdp.consistent(tree, x)])
    prob.solve(method="cvxdp")
    eb = cvxdp.error_bars(prob)
    Q = tree.queries.toarray()
    cov_leaves = _dense_cov(Q, np.full(Q.shape[0], 2.5 ** 2))
    want = np.sqrt(np.diag(Q @ cov_leaves @ Q.T))
    assert eb.method == "exact" and eb.route == "tree GLS variances"
    np.testing.assert_allclose(eb.std_err, want, rtol=1e-9)
    np.testing.assert_allclose(eb.estimate, x.value)
    z = 1.6448536269514722
    np.testing.assert_allclose(eb.upper - eb.lower, 2 * z * want, rtol=1e-9)


def test_exact_tree_in_leaf_space_and_any_query_matrix():
    tree, m = _tree_model(12, 3, 1.5, 1)
    x = cp.Variable(12)
    prob = cp.Problem(cp.Minimize(cvxdp.nll(m, x)))
    prob.solve(method="cvxdp")
    Q = tree.queries.toarray()
    cov = _dense_cov(Q, np.full(Q.shape[0], 1.5 ** 2))
    R = np.random.default_rng(0).standard_normal((5, 12))
    eb = cvxdp.error_bars(prob, queries=R)
    np.testing.assert_allclose(eb.std_err, np.sqrt(np.diag(R @ cov @ R.T)), rtol=1e-8)
    np.testing.assert_allclose(eb.estimate, R @ x.value, rtol=1e-9, atol=1e-9)
    # an affine expression gives the same as its matrix
    eb2 = cvxdp.error_bars(prob, queries=cp.sum(x[:4]) - 2 * x[5])
    r = np.zeros(12)
    r[:4], r[5] = 1.0, -2.0
    np.testing.assert_allclose(eb2.std_err, np.sqrt(r @ cov @ r), rtol=1e-8)


def test_exact_geography_histogram_matches_dense():
    """A (units, cells) variable with a histogram per unit: the k-cell tree GLS route."""
    rng = np.random.default_rng(3)
    parent = np.array([-1, 0, 0, 1, 1, 2, 2, 2])
    n, k = parent.size, 3
    C = np.zeros((n, n))
    for v, p in enumerate(parent):
        if p >= 0:
            C[p, v] = -1.0
    C[np.arange(n), np.arange(n)] = 1.0
    C = C[[0, 1, 2]]                           # parents minus children
    X = cp.Variable((n, k))
    Y = rng.normal(5, 1, (n, k))
    sig = np.where(np.arange(n) < 3, 2.0, 1.0)
    loss = cp.sum_squares(cp.multiply(1 / sig[:, None], X - Y)) / 2
    prob = cp.Problem(cp.Minimize(loss), [C @ X == 0])
    prob.solve(method="cvxdp")
    eb = cvxdp.error_bars(prob, noise=[(Y, ("gaussian", np.repeat(sig[:, None], k, 1)))])
    assert eb.method == "exact" and eb.std_err.shape == (n, k)
    # dense, cell by cell (the cells are independent problems)
    for j in range(k):
        cov = _dense_cov(np.eye(n), sig ** 2, E=C, W=1 / sig ** 2)
        np.testing.assert_allclose(eb.std_err[:, j], np.sqrt(np.diag(cov)), rtol=1e-8)


def test_exact_general_equalities_duplicates_and_unweighted_loss():
    """The KKT route: duplicated equality rows, a loss whose weights are not the inverse
    noise variances (the sandwich formula), answers inside a constraint."""
    rng = np.random.default_rng(5)
    n, m = 9, 14
    A = rng.standard_normal((m, n))
    sig = rng.uniform(0.5, 3.0, m)
    y = cp.Parameter(m, value=A @ rng.normal(3, 1, n) + sig * rng.standard_normal(m))
    E = rng.standard_normal((2, n))
    x = cp.Variable(n)
    cons = [E @ x == 1.0, E[:1] @ x == 1.0, np.zeros((1, n)) @ x == 0]
    prob = cp.Problem(cp.Minimize(cp.sum_squares(A @ x - y)), cons)
    prob.solve(method="cvxdp")
    eb = cvxdp.error_bars(prob, noise={y: ("gaussian", sig)}, method="exact")
    cov = _dense_cov(A, sig ** 2, E=E)
    assert eb.route == "KKT factorisation"
    np.testing.assert_allclose(eb.std_err, np.sqrt(np.diag(cov)), rtol=1e-7)
    # the total pinned to a noisy answer: Var(sum x) = Var(y_0)
    prob2 = cp.Problem(cp.Minimize(cp.sum_squares(A @ x - y)), [cp.sum(x) == y[0]])
    prob2.solve(method="cvxdp")
    eb2 = cvxdp.error_bars(prob2, queries=cp.sum(x), noise={y: ("gaussian", sig)})
    np.testing.assert_allclose(eb2.std_err, [sig[0]], rtol=1e-7)


def test_not_identified_direction_is_an_error():
    x = cp.Variable(3)
    y = np.array([1.0, 2.0])
    prob = cp.Problem(cp.Minimize(cp.sum_squares(x[:2] - y) + 0 * cp.sum(x)))
    prob.solve(method="cvxdp", solver=cp.CLARABEL)
    with pytest.raises(ValueError, match="not determined"):
        cvxdp.error_bars(prob, noise=[(y, ("gaussian", 1.0))], method="exact")


def test_auto_takes_the_bootstrap_where_the_estimate_is_not_linear():
    tree, _ = _tree_model(16, 2, 1.0, 2)
    rng = np.random.default_rng(2)
    m = cvxdp.mechanisms.laplace(tree.queries, np.zeros(16), epsilon=1.0, rng=rng)
    x = cp.Variable(tree.n_nodes)
    prob = cp.Problem(cp.Minimize(cvxdp.nll(m, x)), [cvxdp.consistent(tree, x), x >= 0])
    prob.solve(method="cvxdp", solver=cvxdp.ADMM)
    before = x.value.copy()
    duals = prob.constraints[0].dual_value.copy()
    with pytest.raises(ValueError, match="exact.*(active|absolute)"):
        cvxdp.error_bars(prob, method="exact")
    eb = cvxdp.error_bars(prob, draws=40, rng=0)
    assert eb.method == "bootstrap" and eb.draws + eb.failed == 40
    assert eb.samples.shape == (eb.draws, tree.n_nodes)
    assert np.all(eb.lower <= eb.upper) and np.all(eb.std_err >= 0)
    # the caller's solution, duals and status are untouched
    np.testing.assert_array_equal(x.value, before)
    np.testing.assert_array_equal(prob.constraints[0].dual_value, duals)
    assert prob.status == cp.OPTIMAL


def test_bootstrap_agrees_with_exact_on_a_linear_estimate():
    tree, m = _tree_model(8, 2, 2.0, 4)
    x = cp.Variable(tree.n_nodes)
    prob = cp.Problem(cp.Minimize(cvxdp.nll(m, x)), [cvxdp.consistent(tree, x)])
    prob.solve(method="cvxdp")
    ex = cvxdp.error_bars(prob, method="exact")
    bs = cvxdp.error_bars(prob, method="bootstrap", draws=400, rng=7)
    # 400 draws: the standard error of a standard deviation is about 3.5%
    np.testing.assert_allclose(bs.std_err, ex.std_err, rtol=0.15)
    for kind in ("percentile", "basic", "normal", "bc"):
        b = cvxdp.error_bars(prob, method="bootstrap", draws=60, rng=1, interval=kind)
        assert b.interval == kind and np.all(b.lower <= b.upper)
        assert np.all((b.lower <= b.estimate + 1e-9) | (kind != "normal"))


def test_bootstrap_callable_query_and_seeded_reproducibility():
    tree, m = _tree_model(8, 2, 2.0, 6)
    x = cp.Variable(tree.n_nodes)
    prob = cp.Problem(cp.Minimize(cvxdp.nll(m, x)), [cvxdp.consistent(tree, x), x >= 0])
    prob.solve(method="cvxdp")
    f = lambda p: np.round(x.value[:3])      # noqa: E731  (a non-linear pipeline)
    a = cvxdp.error_bars(prob, queries=f, draws=20, rng=3)
    b = cvxdp.error_bars(prob, queries=f, draws=20, rng=3)
    assert a.method == "bootstrap" and a.estimate.shape == (3,)
    np.testing.assert_array_equal(a.samples, b.samples)
    assert np.all(a.samples == np.round(a.samples))


def test_gls_result_error_bars():
    geo = cvxdp.workloads.hierarchy(9, 3)
    rng = np.random.default_rng(0)
    ms = [cvxdp.HistogramMeasurement(np.arange(geo.n_nodes), np.eye(2),
                                     rng.normal(3, 1, (geo.n_nodes, 2)), 1.5)]
    res = cvxdp.histograms.gls(geo, ms)
    eb = cvxdp.error_bars(res, level=0.95)
    np.testing.assert_allclose(eb.std_err, np.sqrt(res.cell_variance))
    assert eb.method == "exact" and eb.std_err.shape == res.x.shape


@pytest.mark.parametrize("kwargs,match", [
    (dict(level=1.0), "level"), (dict(level="0.9"), "level"), (dict(method="jackknife"), "method"),
    (dict(draws=1), "draws"), (dict(draws=2.5), "draws"), (dict(interval="studentized"), "interval"),
    (dict(queries=np.ones((2, 5))), "columns"), (dict(queries="x"), "queries"),
    (dict(noise={"y": ("gaussian", 1.0)}), "noise"),
    (dict(noise=[(np.arange(3.0), ("gaussian", 1.0))]), "holds no"),
    (dict(noise=[(np.arange(4.0), ("poisson", 1.0))]), "family"),
    (dict(noise=[(np.arange(4.0), ("gaussian", -1.0))]), "scale"),
])
def test_bad_arguments_are_value_errors_naming_them(kwargs, match):
    x = cp.Variable(4)
    prob = cp.Problem(cp.Minimize(cp.sum_squares(x - np.arange(4.0))))
    prob.solve(method="cvxdp")
    kwargs.setdefault("noise", [(np.arange(4.0), ("gaussian", 1.0))])
    with pytest.raises((ValueError, TypeError), match=match):
        cvxdp.error_bars(prob, **kwargs)


def test_unsolved_problem_and_unknown_noise_are_errors():
    x = cp.Variable(4)
    prob = cp.Problem(cp.Minimize(cp.sum_squares(x - np.arange(4.0))))
    with pytest.raises(ValueError, match="solve"):
        cvxdp.error_bars(prob, noise=[(np.arange(4.0), ("gaussian", 1.0))])
    prob.solve(method="cvxdp")
    with pytest.raises(ValueError, match="noisy data"):
        cvxdp.error_bars(prob)
    with pytest.raises(ValueError, match="affine"):
        cvxdp.error_bars(prob, queries=cp.square(x), noise=[(np.arange(4.0), ("gaussian", 1.0))])


def test_histogram_tree_detection_beyond_int32_keys():
    """More than 46,341 units: the parent keys ``unit * n + parent`` overflow int32."""
    n_leaves = 50_000
    parent = np.r_[-1, np.zeros(n_leaves, dtype=np.int64)]
    n = parent.size
    rows = np.r_[0, np.arange(1, n)]
    A = sp.csr_matrix((np.r_[1.0, -np.ones(n - 1)], (np.zeros(n, int), rows)), shape=(1, n))
    x = cp.Variable((n, 1))
    y = np.ones((n, 1))
    prob = cp.Problem(cp.Minimize(cp.sum_squares(x - y)), [A @ x == 0])
    data = recognise(prob).data
    tree = histogram_tree.detect(data, (n, 1))
    assert tree is not None
    np.testing.assert_array_equal(tree.forest.parent, parent)


def test_bootstrap_on_dask_gives_the_same_draws(client):
    """The re-solves through cvxdp.solve_many on a real LocalCluster (the session's)."""
    tree, m = _tree_model(8, 2, 2.0, 9)
    x = cp.Variable(tree.n_nodes)
    prob = cp.Problem(cp.Minimize(cvxdp.nll(m, x)), [cvxdp.consistent(tree, x), x >= 0])
    prob.solve(method="cvxdp", solver=cvxdp.ADMM)
    here = cvxdp.error_bars(prob, draws=8, rng=5)
    there = cvxdp.error_bars(prob, draws=8, rng=5, client=client)
    # the same draws and re-solves; ADMM's time-budgeted polish may end a hair apart
    scale = max(1.0, float(np.abs(here.samples).max()))
    np.testing.assert_allclose(here.samples, there.samples, rtol=0, atol=1e-6 * scale)
    np.testing.assert_allclose(here.upper, there.upper, rtol=0, atol=1e-6 * scale)


def test_bootstrap_intervals_keep_a_bound_the_estimate_sits_on():
    """Cells at ``x >= 0`` come back as ~1e-11; their intervals must still contain 0."""
    x = cp.Variable(4)
    y = np.array([-5.0, 3.0, -2.0, 8.0])
    prob = cp.Problem(cp.Minimize(cp.sum_squares(x - y)), [x >= 0])
    prob.solve(method="cvxdp", solver=cp.CLARABEL)
    eb = cvxdp.error_bars(prob, noise=[(y, ("gaussian", 0.5))], draws=30, rng=0,
                          solver=cp.CLARABEL)
    assert eb.lower[0] == 0.0 and eb.lower[2] == 0.0 and eb.estimate[0] == 0.0


def test_a_problem_whose_variables_were_solved_by_another_is_refused():
    x = cp.Variable(3)
    y1, y2 = np.array([1.0, 2, 3]), np.array([10.0, 20, 30])
    p1 = cp.Problem(cp.Minimize(cp.sum_squares(x - y1)))
    p2 = cp.Problem(cp.Minimize(cp.sum_squares(x - y2)))
    p1.solve(method="cvxdp")
    p2.solve(method="cvxdp")
    with pytest.raises(ValueError, match="no longer hold"):
        cvxdp.error_bars(p1, noise=[(y1, ("gaussian", 1.0))])
    eb = cvxdp.error_bars(p2, noise=[(y2, ("gaussian", 1.0))], level=np.float32(0.9))
    np.testing.assert_allclose(eb.std_err, 1.0)


@pytest.mark.parametrize("spelling", ["constraint", "attribute"])
def test_relaxed_is_the_gls_interval_clipped_to_the_bounds(spelling):
    rng = np.random.default_rng(11)
    tree = cvxdp.workloads.hierarchy(12, 3)
    counts = np.where(rng.random(12) < 0.6, 0.0, rng.integers(1, 9, 12).astype(float))
    m = cvxdp.mechanisms.gaussian(tree.queries, counts, sigma=3.0, rng=rng)
    x = cp.Variable(12, nonneg=(spelling == "attribute"))
    cons = [x >= 0] if spelling == "constraint" else []
    prob = cp.Problem(cp.Minimize(cvxdp.nll(m, x)), cons + [x <= 30])
    prob.solve(method="cvxdp")
    Rq = np.vstack([np.eye(12), np.ones(12), np.r_[1.0, -1.0, np.zeros(10)]])
    eb = cvxdp.error_bars(prob, queries=Rq, method="relaxed")
    # the relaxation by hand: the same loss without the bounds, its dense GLS covariance
    Q = tree.queries.toarray()
    gls = np.linalg.lstsq(Q, m.answers, rcond=None)[0]
    cov = _dense_cov(Q, np.full(Q.shape[0], 9.0))
    se = np.sqrt(np.diag(Rq @ cov @ Rq.T))
    z = 1.6448536269514722
    low = np.r_[np.zeros(12), 0.0, -30.0]
    high = np.r_[np.full(12, 30.0), 360.0, 30.0]
    assert eb.method == "relaxed" and eb.interval == "normal"
    np.testing.assert_allclose(eb.center, Rq @ gls, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(eb.std_err, se, rtol=1e-9)
    np.testing.assert_allclose(eb.lower, np.clip(Rq @ gls - z * se, low, high), atol=1e-9)
    np.testing.assert_allclose(eb.upper, np.clip(Rq @ gls + z * se, low, high), atol=1e-9)
    np.testing.assert_allclose(eb.estimate, Rq @ x.value)          # the caller's estimate
    assert np.any(Rq @ gls < 0) and np.all(eb.lower >= low - 1e-12)


def test_relaxed_refuses_what_it_cannot_relax():
    rng = np.random.default_rng(2)
    y = rng.laplace(size=8)
    x = cp.Variable(8)
    l1 = cp.Problem(cp.Minimize(cp.norm1(x - y)), [x >= 0])
    l1.solve(method="cvxdp")
    with pytest.raises(ValueError, match="relaxed.*L1"):
        cvxdp.error_bars(l1, method="relaxed", noise=[(y, ("laplace", 1.0))])
    chain = cp.Problem(cp.Minimize(cp.sum_squares(x - y)), [x[:-1] <= x[1:]])
    chain.solve(method="cvxdp")
    with pytest.raises(ValueError, match="relaxed.*order"):
        cvxdp.error_bars(chain, method="relaxed", noise=[(y, ("gaussian", 1.0))])
    with pytest.raises(ValueError, match="relaxed intervals are normal"):
        cvxdp.error_bars(chain, method="relaxed", interval="percentile",
                         noise=[(y, ("gaussian", 1.0))])


def test_relaxed_says_when_the_relaxation_leaves_a_query_free():
    # only x[0] is measured; x[1] is pinned by its bounds alone: without them it is free
    y = np.array([3.0])
    x = cp.Variable(2)
    prob = cp.Problem(cp.Minimize(cp.sum_squares(x[0:1] - y)), [x >= 0, x[1] <= 0])
    prob.solve(solver=cp.CLARABEL)
    eb = cvxdp.error_bars(prob, queries=np.array([[1.0, 0.0]]), method="relaxed",
                          noise=[(y, ("gaussian", 1.0))])
    np.testing.assert_allclose(eb.std_err, [1.0], rtol=1e-9)
    with pytest.raises(ValueError, match="not determined.*query 0"):
        cvxdp.error_bars(prob, queries=np.array([[0.0, 1.0]]), method="relaxed",
                         noise=[(y, ("gaussian", 1.0))])

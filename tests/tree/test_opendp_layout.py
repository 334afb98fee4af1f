"""OpenDP's b-ary tree layout, ``cvxdp.workloads.hierarchy(n, k, layout="opendp")``, without
OpenDP: node counts, an independent breadth-first reference, every internal row the sum of its
children's, the GLS with the empty nodes fixed at zero (a dense least squares), and the tree
routes of ``cvxdp.ADMM`` on it (objective against Clarabel, duals by the Lagrangian bound).
The same layout against the real package is in tests/test_opendp.py."""
from __future__ import annotations

import numpy as np
import pytest
import cvxpy as cp

import cvxdp
from cvxdp.modelling import workloads as W
from cvxdp.modelling.mechanisms import l1_sensitivity
from tests.conftest import CLARABEL_TIGHT, sparse_counts


def _height(n: int, k: int) -> int:
    h = 0
    while k ** h < n:
        h += 1
    return h


def reference_opendp(n: int, k: int):
    """Intervals and parents by a queue: the complete ``k``-ary tree over ``k^h`` slots,
    breadth first, every internal node kept and only the leaves (width 1) beyond ``n`` cut."""
    h = _height(n, k)
    queue = [(0, k ** h, -1)]
    ivs, parent = [], []
    while queue:
        lo, hi, par = queue.pop(0)
        if hi - lo == 1 and lo >= n:
            continue
        v = len(ivs)
        ivs.append((min(lo, n), min(hi, n)))
        parent.append(par)
        if hi - lo > 1:
            w = (hi - lo) // k
            queue += [(lo + i * w, lo + (i + 1) * w, v) for i in range(k)]
    return np.array(ivs).reshape(-1, 2), np.array(parent)


# -------------------------------------------------------------------------------- counts
def test_the_issue_case_has_1341_nodes():
    H = W.hierarchy(1000, 4, layout="opendp")
    assert H.n_nodes == 1341 and W.hierarchy(1000, 4).n_nodes == 1334
    assert H.layout == "opendp" and H.empty.size == 7 and H.height == 5
    assert repr(H) == ("Hierarchy(n_leaves=1000, branching=4, layout='opendp', height=5, "
                       "n_nodes=1341)")


def _grid():
    """Every n in 1..5000 for k = 2 and 4; for every k in 2..16 the values around each power
    below 5000 and 40 random ones."""
    rng = np.random.default_rng(0)
    cases = [(n, k) for k in (2, 4) for n in range(1, 5001)]
    for k in range(2, 17):
        near = {k ** j + d for j in range(1, 9) for d in (-1, 0, 1) if 1 <= k ** j + d <= 5000}
        cases += [(n, k) for n in sorted(near | set(rng.integers(1, 5001, 40).tolist()) | {1})]
    return cases


def test_node_counts_on_a_grid_of_sizes_and_branchings():
    for n, k in _grid():
        H = W.Hierarchy(n, k, "opendp")
        h = _height(n, k)
        assert H.height == h and H.n_nodes == (k ** h - 1) // (k - 1) + n, (n, k)
        sizes = [s.stop - s.start for s in H.levels]
        assert sizes == [k ** d for d in range(h)] + [n], (n, k)     # internal levels complete
        assert H.n_internal == H.n_nodes - n


# ---------------------------------------------------------------------- the reference tree
CASES = [(1, 2), (2, 2), (3, 2), (5, 2), (8, 2), (9, 2), (10, 3), (26, 3), (28, 3), (7, 3),
         (15, 4), (17, 4), (64, 4), (65, 4), (100, 4), (31, 5), (7, 8), (65, 8), (17, 16),
         (255, 16), (300, 16), (40, 6), (50, 7)]


@pytest.mark.parametrize("n,k", CASES)
def test_layout_matches_the_reference_and_sums_children(n, k):
    H = W.hierarchy(n, k, layout="opendp")
    ivs, parent = reference_opendp(n, k)
    np.testing.assert_array_equal(H.intervals, ivs)
    np.testing.assert_array_equal(H.parent, parent)
    Q = H.queries.toarray()
    for v in range(H.n_nodes):
        np.testing.assert_array_equal(Q[v], (np.arange(n) >= ivs[v, 0]) & (np.arange(n) < ivs[v, 1]))
    for p in range(H.n_internal):                  # each internal row is its children's sum
        np.testing.assert_array_equal(Q[p], Q[parent == p].sum(axis=0))
    np.testing.assert_array_equal(Q[H.leaves], np.eye(n))
    np.testing.assert_array_equal(H.empty, np.flatnonzero(Q.sum(axis=1) == 0))
    assert abs(H.consistency @ H.queries).sum() == 0
    assert H.consistency.shape == (H.n_internal, H.n_nodes)
    assert H.sensitivity == _height(n, k) + 1 == l1_sensitivity(H.queries)
    x = np.random.default_rng(n).integers(0, 50, n).astype(float)
    np.testing.assert_array_equal(H.sum_up(x), Q @ x)


@pytest.mark.parametrize("n,k", [(5, 2), (10, 3), (17, 4), (40, 6)])
def test_range_nodes_partition_on_the_opendp_layout(n, k):
    H = W.hierarchy(n, k, layout="opendp")
    Q = H.queries.toarray()
    for lo in range(n):
        for hi in range(lo + 1, n + 1):
            nodes = H.range_nodes(lo, hi)
            ind = ((np.arange(n) >= lo) & (np.arange(n) < hi)).astype(float)
            np.testing.assert_array_equal(Q[nodes].sum(axis=0), ind)
            assert not np.isin(nodes, H.empty).any()
            par = H.parent[nodes]
            par = par[par >= 0]                    # maximal: no parent inside the range
            assert not np.any((H.intervals[par, 0] >= lo) & (H.intervals[par, 1] <= hi))
    np.testing.assert_array_equal(H.range_nodes(0, n), [0])


@pytest.mark.parametrize("n,k", [(5, 2), (10, 3), (100, 4), (17, 16), (300, 16)])
def test_project_is_the_least_squares_fit_of_the_release(n, k):
    """The GLS of a release ``y`` over the consistent node vectors ``H x``: the empty nodes
    count nothing, so they are zero, not their noise (a forest leaf left free would absorb it)."""
    H = W.hierarchy(n, k, layout="opendp")
    Q = H.queries.toarray()
    rng = np.random.default_rng(n + k)
    y = Q @ rng.integers(0, 30, n) + rng.laplace(0, 3, H.n_nodes)
    x = np.linalg.lstsq(Q, y, rcond=None)[0]
    np.testing.assert_allclose(H.project(y), Q @ x, atol=1e-9)
    a = rng.uniform(0.3, 3.0, H.n_nodes)
    xw = np.linalg.lstsq(Q * np.sqrt(a)[:, None], y * np.sqrt(a), rcond=None)[0]
    np.testing.assert_allclose(H.project(y, weights=a), Q @ xw, atol=1e-9)


def test_layout_validation():
    with pytest.raises(ValueError, match="layout"):
        W.hierarchy(10, 2, layout="OpenDP ")
    assert W.hierarchy(16, 4, layout="opendp").n_nodes == W.hierarchy(16, 4).n_nodes == 21
    assert W.hierarchy(16, 4).empty.size == 0


# --------------------------------------------------------------------- ADMM on the layout
def _release(n=300, k=4, seed=0, eps=1.0):
    tree = W.hierarchy(n, k, layout="opendp")
    rng = np.random.default_rng(seed)
    y = cvxdp.mechanisms.laplace(tree.queries, sparse_counts(n, rng), epsilon=eps, rng=seed + 1)
    return tree, y


def _solve_both(prob):
    prob.solve(method="cvxdp", solver=cvxdp.ADMM, eps_rel=1e-9, warm_start=False)
    assert prob.status == cp.OPTIMAL
    ours = (prob.value, prob.solver_stats.extra_stats["info"]["route"],
            [None if c.dual_value is None else np.array(c.dual_value, dtype=float)
             for c in prob.constraints])
    ref = cp.Problem(prob.objective, prob.constraints).solve(solver=cp.CLARABEL, **CLARABEL_TIGHT)
    return ours, ref


@pytest.mark.parametrize("loss", ["l1", "l2"])
def test_node_formulation_takes_the_tree_route(loss):
    """Node counts ``z`` with ``cvxdp.consistent``: the empty nodes' rows ``z_p = 0`` become
    bounds (solvers.consistency.fixings) and the rest is the forest projection."""
    tree, y = _release()
    z = cp.Variable(tree.n_nodes)
    a = y.answers
    f = cp.norm1(z - a) if loss == "l1" else cp.sum_squares(z - a)
    prob = cp.Problem(cp.Minimize(f), [cvxdp.consistent(tree, z), z >= 0])
    (val, route, (y_c, s)), ref = _solve_both(prob)
    assert route == "ADMM separable/tree"
    assert val == pytest.approx(ref, rel=1e-7)
    # Lagrangian f(z) + y_c^T C z - s^T z, minimised over z node by node (c = C^T y_c - s)
    c = tree.consistency.T @ y_c - s
    assert np.all(s >= -1e-9)
    if loss == "l1":
        assert np.max(np.abs(c)) <= 1 + 1e-7
        bound = float(c @ a)
    else:
        bound = float(c @ a - c @ c / 4)
    assert bound == pytest.approx(val, rel=1e-7, abs=1e-7)
    np.testing.assert_allclose(z.value[tree.empty], 0.0, atol=1e-9)


@pytest.mark.parametrize("loss", ["l1", "l2"])
def test_leaf_formulation_takes_the_lifted_tree_route(loss):
    """Leaf counts ``x`` measured through the layout's queries (zero rows for the empty
    nodes): the rows with an entry are lifted to node space, the others are constants."""
    tree, y = _release(seed=3)
    x = cp.Variable(tree.n_leaves)
    f = cvxdp.nll(y, x) if loss == "l1" else cp.sum_squares(tree.queries @ x - y.answers)
    prob = cp.Problem(cp.Minimize(f), [x >= 0])
    (val, route, (s,)), ref = _solve_both(prob)
    assert route == "ADMM lifted separable/tree"
    assert val == pytest.approx(ref, rel=1e-7)
    assert s is not None and np.all(s >= -1e-9)
    assert float(s @ x.value) == pytest.approx(0.0, abs=1e-6 * max(1.0, val))
    if loss == "l2":                               # min_x ||Q x - y||^2 - s^T x, exactly
        Q = tree.queries.toarray()
        xs = np.linalg.solve(Q.T @ Q, Q.T @ y.answers + s / 2)
        bound = float(np.sum((Q @ xs - y.answers) ** 2) - s @ xs)
        assert bound == pytest.approx(val, rel=1e-8)


def test_fixings_that_contradict_are_infeasible_and_duplicates_are_fine():
    tree, y = _release(n=50, k=4, seed=5)
    z = cp.Variable(tree.n_nodes)
    e = int(tree.empty[-1])
    base = [cvxdp.consistent(tree, z), z >= 0]
    bad = cp.Problem(cp.Minimize(cp.sum_squares(z - y.answers)), base + [z[e] == 1])
    bad.solve(method="cvxdp", solver=cvxdp.ADMM)
    assert bad.status == cp.INFEASIBLE
    assert cp.Problem(bad.objective, bad.constraints).solve(solver=cp.CLARABEL) == np.inf
    twice = cp.Problem(cp.Minimize(cp.sum_squares(z - y.answers)), base + [z[e] == 0])
    (val, route, duals), ref = _solve_both(twice)
    assert route == "ADMM separable/tree" and val == pytest.approx(ref, rel=1e-7)
    y_c, s, y_e = duals
    c = tree.consistency.T @ y_c - s
    c[e] += float(y_e)
    bound = float(c @ y.answers - c @ c / 4)
    assert bound == pytest.approx(val, rel=1e-7)


def test_histogram_gls_with_the_empty_nodes_as_invariants_is_the_projection():
    """What the Hierarchy docstring tells users of cvxdp.histograms.gls on this layout."""
    tree = W.hierarchy(50, 4, layout="opendp")
    rng = np.random.default_rng(2)
    y = tree.queries @ rng.integers(0, 9, 50) + rng.normal(size=tree.n_nodes)
    m = cvxdp.HistogramMeasurement(np.arange(tree.n_nodes), np.eye(1), y[:, None], 1.0)
    zeros = {int(v): (np.eye(1), [0.0]) for v in tree.empty}
    got = cvxdp.histograms.gls(tree, [m], invariants=zeros, variances=False).x.ravel()
    np.testing.assert_allclose(got, tree.project(y), atol=1e-10)

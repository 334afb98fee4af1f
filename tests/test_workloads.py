"""Tests for cvxdp.workloads: brute-force references built independently of the code."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse as sp

from cvxdp.modelling import workloads as W
from cvxdp.modelling.mechanisms import l1_sensitivity
from cvxdp.solvers.tree.forest import hay_projection

SIZES = [(1, 2), (5, 2), (7, 2), (8, 2), (9, 2), (10, 2), (27, 3), (10, 3), (5, 3),
         (16, 4), (10, 4), (9, 3), (1, 4)]


# ---------------------------------------------------------------- reference tree
def reference_tree(n, k):
    """Complete k-ary tree over k^h >= n cells built recursively, empty subtrees
    pruned, nodes then numbered breadth first.  Returns (intervals, parent)."""
    h = 0
    while k ** h < n:
        h += 1

    def build(lo, width, depth):
        if lo >= n:
            return None
        node = {"iv": (lo, min(lo + width, n)), "depth": depth, "kids": []}
        if depth < h:
            for j in range(k):
                child = build(lo + j * width // k, width // k, depth + 1)
                if child is not None:
                    node["kids"].append(child)
        return node

    root = build(0, k ** h, 0)
    order, queue, parent_of = [], [(root, -1)], []
    while queue:
        node, par = queue.pop(0)
        idx = len(order)
        order.append(node)
        parent_of.append(par)
        queue.extend((c, idx) for c in node["kids"])
    return [nd["iv"] for nd in order], np.array(parent_of)


def dense_projection(C, v, a):
    """argmin sum a (x - v)^2 s.t. C x = 0 via the KKT system."""
    N, p = v.size, C.shape[0]
    K = np.zeros((N + p, N + p))
    K[:N, :N] = 2 * np.diag(a)
    K[:N, N:] = C.T
    K[N:, :N] = C
    rhs = np.r_[2 * a * v, np.zeros(p)]
    return np.linalg.lstsq(K, rhs, rcond=None)[0][:N]


# --------------------------------------------------------------------- hierarchy
@pytest.mark.parametrize("n,k", SIZES)
def test_hierarchy_matches_reference(n, k):
    H = W.hierarchy(n, k)
    ivs, parent = reference_tree(n, k)
    N = len(ivs)
    assert H.n_nodes == N and H.n_leaves == n and H.branching == k
    np.testing.assert_array_equal(H.parent, parent)
    np.testing.assert_array_equal(H.intervals, np.array(ivs).reshape(N, 2))
    Qref = np.zeros((N, n))
    for v, (lo, hi) in enumerate(ivs):
        Qref[v, lo:hi] = 1
    assert sp.isspmatrix_csr(H.queries) and H.queries.dtype == np.float64
    np.testing.assert_array_equal(H.queries.toarray(), Qref)
    internal = [p for p in range(N) if np.any(parent == p)]
    assert internal == list(range(len(internal))) and H.n_internal == len(internal)
    Cref = np.zeros((len(internal), N))
    for r, p in enumerate(internal):
        Cref[r, p] = 1
        Cref[r, parent == p] = -1
    assert sp.isspmatrix_csr(H.consistency)
    np.testing.assert_array_equal(H.consistency.toarray(), Cref)
    assert H.consistency.shape == (len(internal), N)
    assert abs(H.consistency @ H.queries).sum() == 0
    # leaves are the last n nodes, in cell order
    leaves = np.arange(N)[H.leaves]
    assert leaves.size == n and np.all(H.intervals[leaves, 0] == np.arange(n))
    assert sum(s.stop - s.start for s in H.levels) == N and len(H.levels) == H.height + 1
    assert H.sensitivity == H.height + 1 == l1_sensitivity(H.queries)


def test_complete_tree_layout_children():
    for k, h in [(2, 4), (3, 3), (4, 2)]:
        H = W.hierarchy(k ** h, k)
        for v in range(H.n_internal):
            np.testing.assert_array_equal(np.flatnonzero(H.parent == v), k * v + 1 + np.arange(k))
        assert H.height == h


@pytest.mark.parametrize("n,k", SIZES)
def test_project_is_least_squares(n, k):
    H = W.hierarchy(n, k)
    rng = np.random.default_rng(n * 10 + k)
    v = rng.normal(size=H.n_nodes) * 5
    v_before = v.copy()
    C = H.consistency.toarray()
    x = H.project(v)
    np.testing.assert_array_equal(v, v_before)                     # input untouched
    np.testing.assert_allclose(x, dense_projection(C, v, np.ones(H.n_nodes)), atol=1e-9)
    np.testing.assert_allclose(H.project(x), x, atol=1e-9)        # idempotent
    a = rng.uniform(0.2, 3.0, size=H.n_nodes)
    np.testing.assert_allclose(H.project(v, weights=a), dense_projection(C, v, a), atol=1e-9)
    data = rng.poisson(4, size=n).astype(float)
    y = H.queries @ data
    np.testing.assert_allclose(H.project(y), y, atol=1e-9)        # consistent data is fixed
    np.testing.assert_allclose(H.sum_up(data), y)


def test_project_matches_hay_on_complete_trees():
    rng = np.random.default_rng(1)
    for k, h in [(2, 5), (3, 3), (4, 3)]:
        H = W.hierarchy(k ** h, k)
        v = rng.normal(size=H.n_nodes)
        np.testing.assert_allclose(H.project(v), hay_projection(v, k), atol=1e-10)


@pytest.mark.parametrize("n,k", SIZES)
def test_range_nodes_partition(n, k):
    H = W.hierarchy(n, k)
    Q = H.queries.toarray()
    for lo in range(n):
        for hi in range(lo + 1, n + 1):
            nodes = H.range_nodes(lo, hi)
            ind = np.zeros(n)
            ind[lo:hi] = 1
            # a partition: the rows sum to the indicator (no overlaps, no gaps)
            np.testing.assert_array_equal(Q[nodes].sum(axis=0), ind)
            assert len(set(nodes.tolist())) == nodes.size
            assert nodes.size <= 2 * (k - 1) * (H.height + 1)
            # left to right
            assert np.all(np.diff(H.intervals[nodes, 0]) > 0)
            # maximal: no returned node's parent also lies inside [lo, hi)
            par = H.parent[nodes]
            par = par[par >= 0]
            assert not np.any((H.intervals[par, 0] >= lo) & (H.intervals[par, 1] <= hi))
    np.testing.assert_array_equal(H.range_nodes(0, n), [0])


def test_range_nodes_uses_high_nodes():
    H = W.hierarchy(16, 2)
    np.testing.assert_array_equal(H.range_nodes(0, 16), [0])
    np.testing.assert_array_equal(H.range_nodes(0, 8), [1])
    # [1, 15) = cell 1, [2,4), [4,8), [8,12), [12,14), cell 14
    got = H.range_nodes(1, 15)
    assert [tuple(H.intervals[v]) for v in got] == [(1, 2), (2, 4), (4, 8), (8, 12),
                                                    (12, 14), (14, 15)]


def test_hierarchy_large_builds_sparse():
    # no timing assert (timings belong in benchmarks/); the sizes say nothing dense was built
    H = W.hierarchy(2 ** 20, 2)
    Q = H.queries
    assert Q.shape == (2 ** 21 - 1, 2 ** 20) and Q.nnz == 21 * 2 ** 20
    assert H.range_nodes(3, 2 ** 20 - 5).size <= 2 * 21


def test_hierarchy_repr_and_validation():
    assert repr(W.hierarchy(8)) == "Hierarchy(n_leaves=8, branching=2, height=3, n_nodes=15)"
    with pytest.raises(ValueError, match="n_leaves"):
        W.hierarchy(0)
    with pytest.raises(ValueError, match="branching"):
        W.hierarchy(8, 1)
    H = W.hierarchy(8)
    with pytest.raises(ValueError, match="v must have shape"):
        H.project(np.zeros(8))
    with pytest.raises(ValueError, match="lo"):
        H.range_nodes(3, 3)
    with pytest.raises(ValueError, match="leaf_values"):
        H.sum_up(np.zeros(15))


# ----------------------------------------------------------------------- wavelet
def test_wavelet_explicit():
    W4 = np.array([[1, 1, 1, 1],
                   [1, 1, -1, -1],
                   [1, -1, 0, 0],
                   [0, 0, 1, -1]], dtype=float)
    np.testing.assert_array_equal(W.wavelet(4).toarray(), W4)
    W8 = np.array([[1, 1, 1, 1, 1, 1, 1, 1],
                   [1, 1, 1, 1, -1, -1, -1, -1],
                   [1, 1, -1, -1, 0, 0, 0, 0],
                   [0, 0, 0, 0, 1, 1, -1, -1],
                   [1, -1, 0, 0, 0, 0, 0, 0],
                   [0, 0, 1, -1, 0, 0, 0, 0],
                   [0, 0, 0, 0, 1, -1, 0, 0],
                   [0, 0, 0, 0, 0, 0, 1, -1]], dtype=float)
    M = W.wavelet(8)
    assert sp.isspmatrix_csr(M) and M.dtype == np.float64
    np.testing.assert_array_equal(M.toarray(), W8)


@pytest.mark.parametrize("n", [1, 2, 4, 8, 64, 1024])
def test_wavelet_sensitivity_and_inverse(n):
    M = W.wavelet(n)
    assert M.shape == (n, n)
    assert l1_sensitivity(M) == 1 + np.log2(n)
    if n <= 64:
        D = M.toarray()
        assert np.linalg.matrix_rank(D) == n
        # rows are orthogonal: D D^T is diagonal with the row supports
        G = D @ D.T
        np.testing.assert_array_equal(G, np.diag(np.abs(D).sum(axis=1)))


def test_wavelet_haar_coefficients():
    # weighted rows = Haar coefficients times their Privlet weights
    x = np.array([3., 5., 1., 7., 2., 2., 9., 0.])
    c = W.wavelet(8) @ x
    assert c[0] == x.sum()                                    # n * mean
    assert c[1] == (x[:4].sum() - x[4:].sum())               # m=8: 8 * (a - b) / 2
    assert c[5] == x[2] - x[3]


def test_wavelet_rejects_non_power():
    with pytest.raises(ValueError, match="power of 2"):
        W.wavelet(12)
    with pytest.raises(ValueError, match="n must be"):
        W.wavelet(0)


# ---------------------------------------------------------------------- marginals
def test_marginals_match_numpy_sums():
    domain = (3, 2, 4, 2)
    rng = np.random.default_rng(0)
    table = rng.poisson(3, size=domain).astype(float)
    x = table.ravel()                                         # C order
    for r in range(len(domain) + 1):
        for attrs in itertools.combinations(range(len(domain)), r):
            M = W.marginal(domain, attrs)
            assert sp.isspmatrix_csr(M)
            kept = [domain[a] for a in attrs]
            assert M.shape == (int(np.prod(kept)), int(np.prod(domain)))
            others = tuple(a for a in range(len(domain)) if a not in attrs)
            np.testing.assert_array_equal(M @ x, table.sum(axis=others).ravel())
    # attrs given out of order: rows still in domain order
    np.testing.assert_array_equal(W.marginal(domain, (2, 0)) @ x, table.sum(axis=(1, 3)).ravel())
    np.testing.assert_array_equal(W.marginal(domain, ()).toarray(), np.ones((1, 48)))
    # the Kronecker form F_1 (x) ... (x) F_k, F = identity (kept) or ones row (summed)
    F = [np.eye(3), np.ones((1, 2)), np.eye(4), np.ones((1, 2))]
    K = np.kron(np.kron(np.kron(F[0], F[1]), F[2]), F[3])
    np.testing.assert_array_equal(W.marginal(domain, (0, 2)).toarray(), K)


def test_marginal_named_domain_and_stack():
    domain = {"age": 3, "sex": 2, "edu": 4}
    table = np.arange(24, dtype=float).reshape(3, 2, 4)
    x = table.ravel()
    M = W.marginals(domain, [("edu",), ("age", "sex"), ()])
    expect = np.r_[table.sum(axis=(0, 1)), table.sum(axis=2).ravel(), table.sum()]
    assert M.shape == (4 + 6 + 1, 24)
    np.testing.assert_array_equal(M @ x, expect)
    np.testing.assert_array_equal(W.marginal(domain, "sex") @ x, table.sum(axis=(0, 2)))
    with pytest.raises(ValueError, match="unknown attribute"):
        W.marginal(domain, ["income"])
    with pytest.raises(ValueError, match="attrs"):
        W.marginal((2, 3), [2])
    with pytest.raises(ValueError, match="repeat"):
        W.marginal((2, 3), [1, 1])
    with pytest.raises(ValueError, match="cells"):
        W.marginal([100] * 6, [0])
    with pytest.raises(ValueError, match="domain size"):
        W.marginal((2, 0), [0])
    with pytest.raises(ValueError, match="attr_sets"):
        W.marginals((2, 3), [])


def test_kron_matches_numpy():
    rng = np.random.default_rng(2)
    A, B, C = rng.normal(size=(2, 3)), rng.normal(size=(3, 2)), rng.normal(size=(2, 2))
    K = W.kron(A, sp.csr_matrix(B), C)
    assert sp.isspmatrix_csr(K)
    np.testing.assert_allclose(K.toarray(), np.kron(np.kron(A, B), C))
    np.testing.assert_array_equal(W.kron(A).toarray(), A)
    with pytest.raises(ValueError, match="at least one"):
        W.kron()


# ------------------------------------------------------------------------ ranges
def test_sqrt_tree():
    # n = 10: k = 3, so the total, blocks [0,3) [3,6) [6,9), and the 10 cells; cell 9 is in no block
    T = W.sqrt_tree(10).toarray()
    expect = np.vstack([np.ones((1, 10)), np.kron(np.eye(3), np.ones((1, 3))) @ np.eye(9, 10),
                        np.eye(10)])
    np.testing.assert_array_equal(T, expect)
    np.testing.assert_array_equal((T * T).sum(axis=0), [3] * 9 + [2])
    for n in (1, 2, 9, 16, 17, 252):
        T = W.sqrt_tree(n)
        k = int(np.floor(np.sqrt(n)))
        assert sp.isspmatrix_csr(T) and T.shape == (1 + k + n, n)
        assert T.toarray().max(axis=0).min() == 1 and (T.power(2).sum(axis=0)).max() == 3
    with pytest.raises(ValueError, match="n must be"):
        W.sqrt_tree(0)


def test_simple_workloads():
    np.testing.assert_array_equal(W.identity(3).toarray(), np.eye(3))
    np.testing.assert_array_equal(W.total(3).toarray(), [[1, 1, 1]])
    np.testing.assert_array_equal(W.prefix(4).toarray(), np.tril(np.ones((4, 4))))
    for f in (W.identity, W.total, W.prefix, W.all_ranges):
        M = f(5)
        assert sp.isspmatrix_csr(M) and M.dtype == np.float64
        with pytest.raises(ValueError, match="n must be"):
            f(0)


def test_all_ranges_n4():
    expect = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1],
                       [0, 1, 0, 0], [0, 1, 1, 0], [0, 1, 1, 1],
                       [0, 0, 1, 0], [0, 0, 1, 1],
                       [0, 0, 0, 1]], dtype=float)
    np.testing.assert_array_equal(W.all_ranges(4).toarray(), expect)
    assert W.all_ranges(30).shape == (30 * 31 // 2, 30)
    assert W.all_ranges(30).nnz == 30 * 31 * 32 // 6


def test_range_queries():
    M = W.range_queries(6, [(0, 2), (3, 6), (4, 5)])
    np.testing.assert_array_equal(M.toarray(), [[1, 1, 0, 0, 0, 0],
                                                [0, 0, 0, 1, 1, 1],
                                                [0, 0, 0, 0, 1, 0]])
    assert W.range_queries(6, np.zeros((0, 2), dtype=int)).shape == (0, 6)
    for bad in ([(2, 2)], [(-1, 2)], [(0, 7)], [(3, 1)]):
        with pytest.raises(ValueError, match="intervals"):
            W.range_queries(6, bad)
    with pytest.raises(ValueError, match="shape"):
        W.range_queries(6, [1, 2, 3])


def _rows_as_intervals(M):
    D = M.toarray()
    out = []
    for row in D:
        nz = np.flatnonzero(row)
        assert nz.size > 0 and np.all(row[nz] == 1)
        assert np.all(np.diff(nz) == 1)                       # contiguous
        out.append((nz[0], nz[-1] + 1))
    return out


def test_random_ranges():
    A = W.random_ranges(20, 500, rng=7)
    B = W.random_ranges(20, 500, rng=7)
    assert A.shape == (500, 20)
    assert (A != B).nnz == 0
    assert (A != W.random_ranges(20, 500, rng=8)).nnz > 0
    ivs = _rows_as_intervals(A)
    assert all(0 <= lo < hi <= 20 for lo, hi in ivs)
    F = W.random_ranges(20, 200, rng=np.random.default_rng(3), length=5)
    assert all(hi - lo == 5 for lo, hi in _rows_as_intervals(F))
    with pytest.raises(ValueError, match="length"):
        W.random_ranges(20, 5, length=21)
    with pytest.raises(ValueError, match="rng"):
        W.random_ranges(20, 5, rng="seed")


def test_random_ranges_uniform_over_intervals():
    # n = 3 has 6 intervals; each should get ~1/6 of the draws
    D = W.random_ranges(3, 60000, rng=0).toarray()
    lo = D.argmax(axis=1)
    length = D.sum(axis=1).astype(int)
    counts = np.zeros((3, 4))
    np.add.at(counts, (lo, length), 1)
    freq = counts[counts > 0] / 60000
    assert freq.size == 6
    np.testing.assert_allclose(freq, 1 / 6, atol=0.01)

"""``cvxdp.solvers.tree.gls``: exact GLS over a tree with a histogram per unit, with variances.

Against the dense normal equations over the leaves' cells (the estimate, each cell's variance,
each query's variance) on random trees with rank-deficient blocks at inner units, several
blocks per unit and unequal weights; identities (noise-free measurements are reproduced, the
estimate is consistent, shared classes); refusals.
"""
from __future__ import annotations

import numpy as np
import pytest

import cvxdp
from cvxdp.solvers.tree.gls import Block, TreeGLS
from conftest import random_parent


def instance(seed):
    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(1, 25)), int(rng.integers(1, 5))
    geo = cvxdp.workloads.geography(random_parent(rng, n))
    blocks = [Block(geo.leaves, np.eye(k), rng.uniform(0.5, 2, k), rng.normal(size=(geo.leaves.size, k)))]
    if geo.internal.size:
        m = int(rng.integers(1, k + 2))        # often fewer queries than cells: rank-deficient
        blocks.append(Block(geo.internal, rng.normal(size=(m, k)), rng.uniform(0.5, 2, m),
                            rng.normal(size=(geo.internal.size, m))))
    sel = rng.choice(n, size=max(1, n // 3), replace=False)
    blocks.append(Block(sel, rng.normal(size=(2, k)), rng.uniform(0.5, 2, 2), rng.normal(size=(sel.size, 2))))
    return geo, k, blocks


def dense_reference(geo, k, blocks):
    """Estimate and the covariance of every unit's histogram from the normal equations over
    the leaves' cells."""
    agg = geo.aggregation.toarray()
    L = geo.leaves.size
    H, r = np.zeros((L * k, L * k)), np.zeros(L * k)
    lift = [np.kron(agg[v][None, :], np.eye(k)) for v in range(geo.n_nodes)]
    for b in blocks:
        for i, v in enumerate(b.nodes):
            QM = b.Q @ lift[v]
            H += QM.T @ (b.w[:, None] * QM)
            r += QM.T @ (b.w * b.y[i])
    Hi = np.linalg.inv(H)
    x = agg @ (Hi @ r).reshape(L, k)
    return x, [lift[v] @ Hi @ lift[v].T for v in range(geo.n_nodes)]


@pytest.mark.parametrize("seed", range(25))
def test_estimate_and_variances_match_the_normal_equations(seed):
    geo, k, blocks = instance(seed)
    g = TreeGLS(geo.forest, k, blocks)
    x = g.solve()
    ref, covs = dense_reference(geo, k, blocks)
    np.testing.assert_allclose(x, ref, atol=1e-9 * max(1.0, np.abs(ref).max()))
    np.testing.assert_allclose(geo.consistency @ x, 0, atol=1e-9 * max(1.0, np.abs(ref).max()))
    cells, queries = g.variances()
    np.testing.assert_allclose(cells, np.array([np.diag(C) for C in covs]), rtol=1e-9, atol=1e-12)
    for b, q in zip(blocks, queries):
        want = np.array([np.diag(b.Q @ covs[v] @ b.Q.T) for v in b.nodes])
        np.testing.assert_allclose(q, want, rtol=1e-9, atol=1e-12)


def test_noise_free_measurements_are_reproduced_and_classes_are_shared():
    geo = cvxdp.workloads.geography(np.r_[-1, np.zeros(4, int), np.repeat(np.arange(1, 5), 6)])
    rng = np.random.default_rng(0)
    truth = geo.aggregate(rng.poisson(5, size=(24, 3)).astype(float))
    Q = np.array([[1.0, 1.0, 1.0], [1.0, -1.0, 0.0]])
    blocks = [Block(geo.leaves, np.eye(3), 1.0, truth[geo.leaves]),
              Block(geo.internal, Q, [2.0, 0.5], truth[geo.internal] @ Q.T)]
    g = TreeGLS(geo.forest, 3, blocks)
    np.testing.assert_allclose(g.solve(), truth, atol=1e-10)
    # 24 leaves alike, 4 counties alike, the root: three distinct matrices
    assert len(g._P) == 3


def test_a_leaf_without_full_information_is_refused():
    geo = cvxdp.workloads.geography(np.array([-1, 0, 0]))
    blocks = [Block([1], np.eye(2), 1.0, np.zeros((1, 2))), Block([2], [[1.0, 1.0]], 1.0, np.zeros((1, 1)))]
    with pytest.raises(ValueError, match="leaf 2 is measured on a rank 1 subspace of its 2 cells"):
        TreeGLS(geo.forest, 2, blocks)


@pytest.mark.parametrize("kwargs, match", [
    (dict(Q=np.eye(3)), "3 columns, the histograms 2"),
    (dict(nodes=[7]), "outside the tree"),
])
def test_block_refusals(kwargs, match):
    geo = cvxdp.workloads.geography(np.array([-1, 0, 0]))
    spec = dict(nodes=[1], Q=np.eye(2), w=1.0, y=None)
    spec.update(kwargs)
    spec["y"] = np.zeros((len(spec["nodes"]), np.atleast_2d(spec["Q"]).shape[0]))
    with pytest.raises(ValueError, match=match):
        TreeGLS(geo.forest, 2, [Block(**spec)])
    with pytest.raises(ValueError, match="positive and finite"):
        Block([1], np.eye(2), [1.0, 0.0], np.zeros((1, 2)))
    with pytest.raises(ValueError, match="finite"):
        Block([1], np.eye(2), 1.0, np.full((1, 2), np.nan))


def constrained_reference(geo, k, blocks, invariants):
    """Estimate and covariances with exact constraints, from the dense KKT system."""
    agg = geo.aggregation.toarray()
    L = geo.leaves.size
    lift = [np.kron(agg[v][None, :], np.eye(k)) for v in range(geo.n_nodes)]
    H, r = np.zeros((L * k, L * k)), np.zeros(L * k)
    for b in blocks:
        for i, v in enumerate(b.nodes):
            QM = b.Q @ lift[v]
            H += QM.T @ (b.w[:, None] * QM)
            r += QM.T @ (b.w * b.y[i])
    C = np.vstack([inv.E @ lift[v] for inv in invariants for v in inv.nodes])
    e = np.concatenate([inv.e[i] for inv in invariants for i in range(inv.nodes.size)])
    Hi = np.linalg.inv(H)
    x0 = Hi @ r
    M = np.linalg.pinv(C @ Hi @ C.T)
    xl = x0 - Hi @ C.T @ M @ (C @ x0 - e)
    cov = Hi - Hi @ C.T @ M @ C @ Hi
    return agg @ xl.reshape(L, k), [lift[v] @ cov @ lift[v].T for v in range(geo.n_nodes)]


@pytest.mark.parametrize("seed", range(15))
def test_invariants_are_met_exactly_and_match_constrained_least_squares(seed):
    from cvxdp.solvers.tree.gls import Invariant
    geo, k, blocks = instance(seed)
    rng = np.random.default_rng(1000 + seed)
    truth = geo.aggregate(rng.normal(size=(geo.leaves.size, k)))
    invs = []
    # totals at a random set of units (a parent and all its children sometimes: redundant)
    units = rng.choice(geo.n_nodes, size=max(1, geo.n_nodes // 3), replace=False)
    if geo.internal.size and seed % 2:
        p = int(geo.internal[0])
        units = np.unique(np.r_[units, p, geo.children(p)])
    invs.append(Invariant(units, np.ones((1, k)), truth[units].sum(axis=1, keepdims=True)))
    # and one query at the root when k > 1
    if k > 1:
        roots = np.flatnonzero(geo.parent < 0)
        E = np.zeros((1, k))
        E[0, 0] = 1.0
        if not np.isin(roots, units).any():
            invs.append(Invariant(roots, E, truth[roots][:, :1]))
    g = TreeGLS(geo.forest, k, blocks, invs)
    x = g.solve()
    ref, covs = constrained_reference(geo, k, blocks, invs)
    scale = max(1.0, np.abs(ref).max())
    np.testing.assert_allclose(x, ref, atol=1e-8 * scale)
    for inv in invs:
        np.testing.assert_allclose(x[inv.nodes] @ inv.E.T, inv.e, atol=1e-9 * scale)
    cells, _ = g.variances()
    np.testing.assert_allclose(cells, np.array([np.diag(C) for C in covs]), atol=1e-8)


def test_contradicting_invariants_are_refused():
    from cvxdp.solvers.tree.gls import Invariant
    geo = cvxdp.workloads.geography(np.array([-1, 0, 0]))
    blocks = [Block([1, 2], np.eye(2), 1.0, np.zeros((2, 2)))]
    invs = [Invariant([0, 1, 2], np.ones((1, 2)), [[10.0], [4.0], [5.0]])]
    with pytest.raises(ValueError, match="invariants contradict at unit 0"):
        TreeGLS(geo.forest, 2, blocks, invs).solve()


def test_public_gls_with_variances_and_invariants():
    geo = cvxdp.workloads.geography({"US": {"PA": ["a", "b"], "NY": ["c", "d", "e"]}})
    rng = np.random.default_rng(0)
    truth = geo.aggregate(rng.poisson(4, (5, 3)).astype(float))
    ms = [cvxdp.HistogramMeasurement(u, np.eye(3), truth[u] + rng.normal(0, 1, (u.size, 3)), 1.0)
          for u in geo.levels]
    ms.append(cvxdp.HistogramMeasurement(geo.internal, np.ones((1, 3)), truth[geo.internal].sum(1, keepdims=True), 0.5))
    res = cvxdp.histograms.gls(geo, ms)
    blocks = [m.block() for m in ms]
    ref, covs = dense_reference(geo, 3, blocks)
    np.testing.assert_allclose(res.x, ref, atol=1e-9)
    np.testing.assert_allclose(res.cell_variance, [np.diag(C) for C in covs], atol=1e-12)
    assert [q.shape for q in res.query_variance] == [(1, 3), (2, 3), (5, 3), (3, 1)]
    pa = geo.index("PA")
    fixed = cvxdp.histograms.gls(geo, ms, invariants={pa: (np.eye(3), truth[pa])})
    np.testing.assert_allclose(fixed.x[pa], truth[pa], atol=1e-10)
    np.testing.assert_allclose(fixed.cell_variance[pa], 0, atol=1e-10)
    with pytest.raises(ValueError, match="leaf"):
        cvxdp.histograms.gls(geo, ms[:2])
    with pytest.raises(TypeError, match="geography"):
        cvxdp.histograms.gls("US", ms)

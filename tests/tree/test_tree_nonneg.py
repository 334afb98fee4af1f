"""``cvxdp.solvers.tree.nonneg``: non-negative GLS over a tree of histograms by ADMM.

Against Clarabel on the same problem written over the leaves (objective, and the certified
lower bound below it), on random trees with sparse counts (the non-negativity binds), a
rank-deficient inner block and unequal weights; the result is consistent and non-negative;
a warm start from the previous state converges at once.
"""
from __future__ import annotations

import numpy as np
import pytest
import cvxpy as cp

import cvxdp
from cvxdp.solvers.tree.gls import Block
from cvxdp.solvers.tree.nonneg import NonnegSettings, objective, solve_nonneg


def instance(seed):
    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(2, 40)), int(rng.integers(1, 5))
    parent = np.full(n, -1)
    for v in range(1, n):
        parent[v] = rng.integers(0, v)
    geo = cvxdp.workloads.geography(parent)
    truth = geo.aggregate(rng.poisson(0.4, (geo.leaves.size, k)).astype(float))
    blocks = [Block(np.arange(n), np.eye(k), rng.uniform(0.2, 2.0), truth + rng.normal(0, 2, truth.shape))]
    if geo.internal.size and k > 1:
        Q = np.ones((1, k))
        blocks.append(Block(geo.internal, Q, 4.0, truth[geo.internal] @ Q.T + rng.normal(0, 0.5, (geo.internal.size, 1))))
    return geo, k, blocks


def clarabel(geo, k, blocks):
    X = cp.Variable((geo.leaves.size, k), nonneg=True)
    full = geo.aggregation @ X
    obj = 0
    for b in blocks:
        r = full[b.nodes] @ b.Q.T - b.y
        obj = obj + 0.5 * cp.sum(cp.multiply(np.broadcast_to(b.w, r.shape), cp.square(r)))
    prob = cp.Problem(cp.Minimize(obj))
    prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-11, tol_gap_rel=1e-11, tol_feas=1e-11)
    return prob.value


@pytest.mark.parametrize("seed", range(12))
def test_matches_clarabel_with_a_certified_gap(seed):
    geo, k, blocks = instance(seed)
    res = solve_nonneg(geo.forest, k, blocks, NonnegSettings(eps_rel=1e-8))
    assert res.status == "optimal" and res.gap <= 1e-8
    ref = clarabel(geo, k, blocks)
    assert res.objective == pytest.approx(ref, rel=1e-7, abs=1e-7)
    assert res.lower_bound <= ref + 1e-7 * max(1.0, ref)
    x = res.x
    assert np.all(x >= 0)
    np.testing.assert_allclose(geo.consistency @ x, 0, atol=1e-9)
    assert objective(blocks, x) == pytest.approx(res.objective, rel=1e-12)


def test_warm_start_resumes():
    geo, k, blocks = instance(3)
    first = solve_nonneg(geo.forest, k, blocks, NonnegSettings(eps_rel=1e-8))
    again = solve_nonneg(geo.forest, k, blocks, NonnegSettings(eps_rel=1e-8), state=first.state)
    assert again.status == "optimal" and again.iterations <= 10
    assert again.objective == pytest.approx(first.objective, rel=1e-8)


def test_limits_give_an_honest_status():
    geo, k, blocks = instance(5)
    res = solve_nonneg(geo.forest, k, blocks, NonnegSettings(eps_rel=1e-14, max_iters=3, check_every=1))
    assert res.status == "optimal_inaccurate" and res.iterations == 3
    assert np.all(res.x >= 0)
    stop = solve_nonneg(geo.forest, k, blocks, NonnegSettings(eps_rel=1e-14, callback=lambda row: True))
    assert stop.status == "user_limit"


def test_fixed_roots_children_problems_match_clarabel():
    """The top-down children problem: a forest of two-level trees whose roots are fixed."""
    from cvxdp.solvers.tree.forest import Forest
    from cvxdp.solvers.tree.gls import Invariant
    rng = np.random.default_rng(7)
    parent = np.array([-1, -1, -1] + [0] * 4 + [1] * 3 + [2] * 5)
    kids, k = np.arange(3, parent.size), 3
    y = rng.poisson(0.5, (kids.size, k)) + rng.normal(0, 1, (kids.size, k))
    roots = np.abs(rng.normal(2, 1, (3, k)))
    res = solve_nonneg(Forest(parent), k, [Block(kids, np.eye(k), 1.0, y)], NonnegSettings(eps_rel=1e-9),
                       fixed_roots=Invariant([0, 1, 2], np.eye(k), roots))
    X = cp.Variable((kids.size, k), nonneg=True)
    cons = [cp.sum(X[parent[kids] == r], axis=0) == roots[r] for r in range(3)]
    ref = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(X - y)), cons)
    ref.solve(solver=cp.CLARABEL, tol_gap_abs=1e-11, tol_gap_rel=1e-11, tol_feas=1e-11)
    assert res.status == "optimal" and res.objective == pytest.approx(ref.value, rel=1e-7)
    np.testing.assert_allclose(res.x[:3], roots, atol=1e-12)
    assert np.all(res.x >= 0)
    with pytest.raises(ValueError, match="must be roots"):
        solve_nonneg(Forest(parent), k, [Block(kids, np.eye(k), 1.0, y)],
                     fixed_roots=Invariant([3], np.eye(k), roots[:1]))
    with pytest.raises(ValueError, match="E = I"):
        solve_nonneg(Forest(parent), k, [Block(kids, np.eye(k), 1.0, y)],
                     fixed_roots=Invariant([0], np.ones((1, k)), [[1.0]]))


def test_group_invariants_with_nonnegativity_match_clarabel():
    """Totals of two groups of cells fixed at the root and at one inner unit."""
    from cvxdp.solvers.tree.gls import Invariant
    geo, k, blocks = instance(9)
    if k < 2 or not geo.internal.size:
        pytest.skip("needs two cells and an inner unit")
    rng = np.random.default_rng(9)
    truth = geo.aggregate(rng.poisson(0.8, (geo.leaves.size, k)).astype(float))
    E = np.zeros((2, k))
    E[0, : k // 2] = 1
    E[1, k // 2:] = 1
    units = np.unique(np.r_[np.flatnonzero(geo.parent < 0), geo.internal[:1]])
    inv = Invariant(units, E, truth[units] @ E.T)
    res = solve_nonneg(geo.forest, k, blocks, NonnegSettings(eps_rel=1e-9), invariants=[inv])
    assert res.status == "optimal"
    np.testing.assert_allclose(res.x[units] @ E.T, inv.e, atol=1e-9)
    X = cp.Variable((geo.leaves.size, k), nonneg=True)
    full = geo.aggregation @ X
    obj = sum(0.5 * cp.sum(cp.multiply(np.broadcast_to(b.w, (b.nodes.size, b.Q.shape[0])),
                                       cp.square(full[b.nodes] @ b.Q.T - b.y))) for b in blocks)
    ref = cp.Problem(cp.Minimize(obj), [full[units] @ E.T == inv.e])
    ref.solve(solver=cp.CLARABEL, tol_gap_abs=1e-11, tol_gap_rel=1e-11, tol_feas=1e-11)
    assert res.objective == pytest.approx(ref.value, rel=1e-7)


def test_invariant_refusals():
    from cvxdp.solvers.tree.gls import Invariant
    geo, k, blocks = instance(9)
    root = np.flatnonzero(geo.parent < 0)[:1]
    with pytest.raises(ValueError, match="0/1 rows"):
        solve_nonneg(geo.forest, k, blocks, invariants=[Invariant(root, 2 * np.ones((1, k)), [[1.0]])])
    if k > 1:
        E = np.vstack([np.ones(k), np.eye(k)[0]])
        with pytest.raises(ValueError, match="must not overlap"):
            solve_nonneg(geo.forest, k, blocks, invariants=[Invariant(root, E, [[3.0, 1.0]])])
    with pytest.raises(ValueError, match="negative"):
        solve_nonneg(geo.forest, k, blocks, invariants=[Invariant(root, np.ones((1, k)), [[-1.0]])])

"""The lower bound of the non-negative L1 problem on a tree (``cvxdp.solvers.tree.l1_bound``).

The bound holds for *every* multiplier in the box ``|mu| <= w`` (the moves only sharpen it):
checked against the LP optimum (HiGHS) at random multipliers on random trees, with leaves
that have identity rows, leaves that have none, and units measured twice.  Where the leaves
have no identity row, their parents' rows lift them: the ADMM then certifies (it could not
before, the box being infinite there).
"""
from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest

from cvxdp.solvers.tree.forest import Forest
from cvxdp.solvers.tree.gls import Block
from cvxdp.solvers.tree.l1 import l1_objective, solve_l1
from cvxdp.solvers.tree.l1_bound import IdentityRows, dual_point, leaf_sums, lower_bound, unit_terms
from cvxdp.solvers.tree.nonneg import NonnegSettings


def random_tree(rng, n_min=4, n_max=25):
    n = int(rng.integers(n_min, n_max))
    parent = np.full(n, -1)
    for v in range(1, n):
        parent[v] = rng.integers(0, v)
    return Forest(parent)


def random_blocks(rng, forest, k, leaf_rows=True):
    """Identity rows at the internal units (and at the leaves if ``leaf_rows``), a second
    identity block of another weight on some units, and one aggregate row everywhere."""
    truth = ancestors(forest) @ rng.poisson(2.0, (forest.leaves.size, k)).astype(float)
    units = np.arange(forest.n) if leaf_rows else forest.internal
    eye = np.eye(k)
    blocks = [Block(units, eye, rng.uniform(0.5, 2.0, k), truth[units] + rng.laplace(0, 1.0, (units.size, k)))]
    some = rng.choice(forest.n, size=max(1, forest.n // 3), replace=False)
    blocks.append(Block(some, eye, rng.uniform(0.1, 3.0, k), truth[some] + rng.laplace(0, 2.0, (some.size, k))))
    agg = np.ones((1, k))
    blocks.append(Block(np.arange(forest.n), agg, 0.7, truth @ agg.T + rng.laplace(0, 1.0, (forest.n, 1))))
    return blocks


def ancestors(forest):
    """``A`` with ``x = A x_leaf`` (unit ``v`` sums the leaves below it)."""
    leaves = forest.leaves
    A = np.zeros((forest.n, leaves.size))
    for i, leaf in enumerate(leaves):
        v = int(leaf)
        while v >= 0:
            A[v, i] = 1.0
            v = int(forest.parent[v])
    return A


def lp_optimum(forest, k, blocks):
    A = ancestors(forest)
    z = cp.Variable((forest.leaves.size, k))
    x = A @ z
    terms = [cp.sum(cp.multiply(np.broadcast_to(b.w, b.y.shape), cp.abs(x[b.nodes] @ b.Q.T - b.y)))
             for b in blocks]
    prob = cp.Problem(cp.Minimize(cp.sum(terms)), [z >= 0])
    prob.solve(solver=cp.HIGHS)
    assert prob.status == cp.OPTIMAL
    return prob.value


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("leaf_rows", [True, False])
def test_bound_holds_at_any_multiplier_in_the_box(seed, leaf_rows):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 4))
    forest = random_tree(rng)
    blocks = random_blocks(rng, forest, k, leaf_rows)
    opt = lp_optimum(forest, k, blocks)
    F = l1_objective(blocks, np.zeros((forest.n, k)))          # x = 0 is feasible
    rows = IdentityRows(blocks, forest, k)
    finite = 0
    for _ in range(20):
        scale = rng.choice([0.05, 0.5, 1.0])
        mus = [rng.uniform(-1, 1, b.y.shape) * b.w * scale for b in blocks]
        before = [m.copy() for m in mus]
        bound = lower_bound(forest, k, blocks, mus, rows, F)
        assert bound <= opt + 1e-9 * max(1.0, abs(opt)), (bound, opt)
        finite += np.isfinite(bound)
        for m, m0 in zip(mus, before):
            np.testing.assert_array_equal(m, m0)            # the caller's multipliers untouched
    # the lift makes p >= 0 wherever a row on the path has room: with the internal rows
    # present, random multipliers give a finite bound in most draws
    assert finite >= 10


@pytest.mark.parametrize("seed", range(6))
def test_leaves_without_rows_are_lifted_and_certified(seed):
    """Leaves measured only through their parents' rows and an aggregate: the box there is
    infinite, so without the lift no multiplier with a negative leaf sum bounds anything."""
    rng = np.random.default_rng(100 + seed)
    k = 2
    forest = random_tree(rng, 6, 30)
    blocks = random_blocks(rng, forest, k, leaf_rows=False)
    res = solve_l1(forest, k, blocks, NonnegSettings(eps_rel=1e-6, max_iters=20000))
    opt = lp_optimum(forest, k, blocks)
    assert res.status == "optimal", (res.status, res.gap)
    assert res.gap <= 1e-6
    assert res.lower_bound <= opt + 1e-9 * max(1.0, opt)
    assert res.objective == pytest.approx(opt, rel=2e-6, abs=1e-9)


def test_the_bound_is_the_optimum_at_a_converged_dual():
    """On a random tree the ADMM's certified bound reaches the LP optimum to 1e-8."""
    rng = np.random.default_rng(7)
    forest = random_tree(rng, 20, 40)
    blocks = random_blocks(rng, forest, 3)
    res = solve_l1(forest, 3, blocks, NonnegSettings(eps_rel=1e-9, max_iters=50000))
    opt = lp_optimum(forest, 3, blocks)
    assert res.lower_bound <= opt + 1e-9 * opt
    assert res.lower_bound >= opt * (1 - 1e-8)


def test_wrong_number_of_multipliers_is_refused():
    rng = np.random.default_rng(1)
    forest = random_tree(rng)
    blocks = random_blocks(rng, forest, 2)
    rows = IdentityRows(blocks, forest, 2)
    with pytest.raises(ValueError, match="multipliers"):
        lower_bound(forest, 2, blocks, [np.zeros(b.y.shape) for b in blocks[:-1]], rows, 1.0)


def test_a_parent_row_lifts_its_leaves_exactly():
    """Root measured ``|x_root - 5|``, two leaves without rows: at ``mu_root = -0.5`` both leaf
    sums are negative and their box is infinite; the root's row lifted to 0 gives the exact
    optimum 0 (the old leaf-only repair gave ``-inf``)."""
    forest = Forest(np.array([-1, 0, 0]))
    blocks = [Block(np.array([0]), np.eye(1), 1.0, np.array([[5.0]]))]
    rows = IdentityRows(blocks, forest, 1)
    assert lower_bound(forest, 1, blocks, [np.array([[-0.5]])], rows, 10.0) == 0.0


def test_what_no_row_can_lift_is_mixed_with_the_feasible_point():
    """Cell 1's identity row at its upper end and a difference row pulling its sum to -1: no
    row can lift it.  The box (from the identity row, ``x <= y + F / w``) would give
    ``-5 - 2 * 15 = -35``; step 5 mixes with the point with every identity row at ``w``
    (``p0 = 1``) at ``theta = 1/2``: dual feasible, value -7.5."""
    forest = Forest(np.array([-1, 0, 0]))
    blocks = [Block(np.array([0]), np.eye(2), 1.0, np.array([[5.0, 5.0]])),
              Block(np.array([0]), np.array([[1.0, -1.0]]), 2.0, np.array([[0.0]]))]
    rows = IdentityRows(blocks, forest, 2)
    mus = [np.array([[0.0, 1.0]]), np.array([[2.0]])]  # p = [2, -1] at both leaves
    point = dual_point(forest, 2, blocks, mus, rows, 10.0)
    assert point.value == pytest.approx(-7.5) and point.bound == pytest.approx(-7.5)
    p = leaf_sums(forest, unit_terms(forest, 2, blocks, point.mu), forest.leaves)
    assert p.min() >= 0
    assert point.bound <= lp_optimum(forest, 2, blocks)


def test_a_total_row_lifts_and_else_bounds_the_cells_below_it():
    """No identity row anywhere (``k = 2``): a total row at the root with room lifts the
    leaves' negative sums itself (exact here); at its upper end, with a difference row pulling
    cell 1 down, nothing lifts and no feasible point mixes in, and the leaves meet the box
    ``x_j <= (y + F / w) / q_j`` of the total."""
    forest = Forest(np.array([-1, 0, 0]))
    total = Block(np.array([0]), np.array([[1.0, 1.0]]), 1.0, np.array([[4.0]]))
    rows = IdentityRows([total], forest, 2)
    assert lower_bound(forest, 2, [total], [np.array([[-0.5]])], rows, 4.0) == 0.0
    blocks = [total, Block(np.array([0]), np.array([[1.0, -1.0]]), 2.0, np.array([[0.0]]))]
    rows = IdentityRows(blocks, forest, 2)
    point = dual_point(forest, 2, blocks, [np.array([[1.0]]), np.array([[2.0]])], rows, 4.0)
    # p = [3, -1] at both leaves: -mu^T y = -4, two leaves x (-1) x (4 + 4 / 1)
    assert point.mu is None and point.bound == pytest.approx(-20.0)
    assert point.bound <= lp_optimum(forest, 2, blocks)


def test_internal_rows_with_non_positive_answers_go_to_their_upper_end():
    """Step 1: an internal row with ``y <= 0`` is set to ``w`` (free, and it lifts below)."""
    forest = Forest(np.array([-1, 0, 0]))
    blocks = [Block(np.array([0]), np.eye(1), 2.0, np.array([[-3.0]])),
              Block(np.array([1, 2]), np.eye(1), 1.0, np.array([[1.0], [0.5]]))]
    rows = IdentityRows(blocks, forest, 1)
    # the root's row goes to w = 2 (-mu y = 6); each leaf's row then goes as low as its box
    # allows, -1 (p = 2 - 1 >= 0), earning y: 1 and 0.5
    bound = lower_bound(forest, 1, blocks, [np.array([[0.0]]), np.zeros((2, 1))], rows, 10.0)
    # -mu^T y = 6 + 1 + 0.5 = 7.5, the LP optimum (x = 0 costs 2*3 + 1 + 0.5)
    assert bound == pytest.approx(7.5)
    assert bound <= lp_optimum(forest, 1, blocks) + 1e-12

"""The O(n) tree projection and the forest pattern: identities and dense references."""
import numpy as np
import pytest
import scipy.sparse as sp

from cvxdp.solvers.tree.forest import Forest, TreeLSQ, forest_from_rows, hay_projection
from conftest import complete_parent, random_forest


def dense_projection(C, weights, v, b, fixed=None):
    """argmin sum w (x - v)^2 s.t. C x = b (and x_fixed = v_fixed) by a dense KKT solve."""
    n = C.shape[1]
    fixed = np.zeros(n, bool) if fixed is None else fixed
    free = ~fixed
    Cf = C[:, free]
    rhs = b - C[:, fixed] @ v[fixed]
    m = C.shape[0]
    K = np.block([[np.diag(2 * weights[free]), Cf.T], [Cf, np.zeros((m, m))]])
    sol = np.linalg.lstsq(K, np.r_[2 * weights[free] * v[free], rhs], rcond=None)[0]
    x = v.copy()
    x[free] = sol[: free.sum()]
    return x


@pytest.mark.parametrize("seed", range(5))
def test_weighted_projection_matches_dense_kkt(seed):
    rng = np.random.default_rng(seed)
    parent = random_forest(60, rng)
    f = Forest(parent)
    C = f.consistency_matrix().toarray()
    w = rng.uniform(0.1, 3.0, f.n)
    v = rng.normal(size=f.n) * 10
    offsets = rng.normal(size=f.n) * f.is_internal
    x = TreeLSQ(f, w).project(v, offsets)
    ref = dense_projection(C, w, v, offsets[f.is_internal])
    np.testing.assert_allclose(x, ref, atol=1e-10)
    np.testing.assert_allclose(f.residual(x, offsets), 0, atol=1e-10)


@pytest.mark.parametrize("k,h", [(2, 1), (2, 5), (3, 3), (4, 2)])
def test_unit_projection_is_hay_two_pass_and_idempotent(k, h):
    rng = np.random.default_rng(k * 10 + h)
    f = Forest(complete_parent(k, h))
    P = TreeLSQ(f)
    v = rng.normal(size=f.n)
    x = P.project(v)
    np.testing.assert_allclose(x, hay_projection(v, k), atol=1e-12)
    np.testing.assert_allclose(P.project(x), x, atol=1e-12)
    # the projection is orthogonal: v - x is orthogonal to consistent vectors
    u = f.sum_up(rng.normal(size=f.n))
    assert abs(np.dot(v - x, u)) < 1e-9 * np.linalg.norm(u) * np.linalg.norm(v)


def test_fixed_nodes_are_kept_and_match_constrained_lsq():
    rng = np.random.default_rng(7)
    f = Forest(complete_parent(2, 4))
    C = f.consistency_matrix().toarray()
    truth = f.sum_up(rng.uniform(0, 5, f.n))
    v = truth + rng.normal(size=f.n)
    fixed = np.zeros(f.n, bool)
    fixed[[0, 3, 20]] = True          # the root and two nodes at consistent values
    v[fixed] = truth[fixed]
    w = np.where(fixed, np.inf, 1.0)
    x = TreeLSQ(f, w).project(v)
    np.testing.assert_allclose(x[fixed], truth[fixed], atol=1e-12)
    np.testing.assert_allclose(C @ x, 0, atol=1e-10)
    np.testing.assert_allclose(x, dense_projection(C, np.ones(f.n), v, np.zeros(C.shape[0]), fixed),
                               atol=1e-9)


def test_forest_pattern_recognised_in_scaled_permuted_rows():
    rng = np.random.default_rng(3)
    f = Forest(random_forest(40, rng))
    C = f.consistency_matrix()
    scale = rng.choice([-2.0, 0.5, 3.0], size=C.shape[0])
    perm = rng.permutation(C.shape[0])
    A = (sp.diags(scale) @ C)[perm]
    b = rng.normal(size=C.shape[0])
    found = forest_from_rows(A, b)
    assert found is not None
    forest, row_parent, row_scale, offsets = found
    np.testing.assert_array_equal(forest.parent, f.parent)
    np.testing.assert_allclose(row_scale, scale[perm])
    # the recognised offsets reproduce A x = b on the projection
    from cvxdp.solvers.consistency.affine import make_projector
    P = make_projector(A, b)
    x = P.project(rng.normal(size=f.n))
    np.testing.assert_allclose(A @ x, b, atol=1e-10)


@pytest.mark.parametrize("rows", [
    [[1, -1, -1, 0], [0, 1, 0, -2]],          # unequal magnitudes
    [[1, -1, -1, 0], [1, 0, -1, -1]],         # node 0 parent of two rows, node 2 child of two
    [[1, -1, 0, 0], [0, 1, -1, 0], [-1, 0, 1, 0]],   # a cycle
    [[1, 0, 0, 0]],                            # a fixing row
    [[1, 1, -1, 0]],                           # two positive, one negative: parent is x2, fine? no: x2 = x0 + x1
])
def test_non_forest_rows_rejected(rows):
    A = sp.csr_matrix(np.array(rows, dtype=float))
    res = forest_from_rows(A)
    if rows == [[1, 1, -1, 0]]:
        # -(x2 - x0 - x1): a valid tree row with negative scale
        assert res is not None and res[0].parent[0] == 2 and res[0].parent[1] == 2
    else:
        assert res is None


def test_multipliers_invert_transpose():
    rng = np.random.default_rng(11)
    f = Forest(random_forest(50, rng))
    C = f.consistency_matrix()
    lam = rng.normal(size=C.shape[0])
    g = C.T @ lam
    np.testing.assert_allclose(f.multipliers(g), lam, atol=1e-12)


def test_sum_up_and_children_sum():
    f = Forest(complete_parent(3, 2))
    leaves = np.arange(9, dtype=float)
    x = np.zeros(f.n)
    x[4:] = leaves
    s = f.sum_up(x)
    assert s[0] == leaves.sum()
    np.testing.assert_allclose(s[1:4], [0 + 1 + 2, 3 + 4 + 5, 6 + 7 + 8])
    np.testing.assert_allclose(f.children_sum(s)[:4], s[:4])


def test_forest_rejects_bad_parent_arrays():
    with pytest.raises(ValueError, match="parent"):
        Forest(np.array([0.5, -1]))
    with pytest.raises(ValueError, match="cycle"):
        Forest(np.array([1, 2, 0]))
    with pytest.raises(ValueError, match="own parent"):
        Forest(np.array([-1, 1]))


def test_single_child_rows_are_oriented():
    # x0 = x1 + x2 and x0 = x3: a valid forest once x3 is read as the parent of x0
    A = sp.csr_matrix(np.array([[1.0, -1, -1, 0], [-1, 0, 0, 1]]))
    forest, row_parent, row_scale, _ = forest_from_rows(A)
    assert forest.parent[0] == 3 and list(row_parent) == [0, 3]

"""Structure detections clean sparse matrices in place (sum duplicates, drop explicit zeros):
they must do it on copies.  ``sp.csr_matrix(A)`` of a CSR matrix shares its arrays, and an
in-place clean-up through it left the caller's matrix with ``indptr`` shorter than its
``indices`` -- scipy then read past its buffers (a heap corruption found by the stress kind
``histogram``: a ``HierarchicalHistogram`` with a total invariant whose row had an explicit
zero, solved by the general ADMM and polished)."""
from __future__ import annotations

import numpy as np
import cvxpy as cp
import scipy.sparse as sp

import cvxdp
from cvxdp.solvers.tree.forest import forest_from_queries, forest_from_rows


def _arrays(M):
    return M.data.copy(), M.indices.copy(), M.indptr.copy()


def _unchanged(M, saved):
    for a, b in zip((M.data, M.indices, M.indptr), saved):
        np.testing.assert_array_equal(a, b)
    M.check_format(full_check=True)


def _with_zeros_and_duplicates():
    """Rows ``x0 - x1 - x2`` and ``x1 - x3 - x4`` with an explicit zero and a split entry."""
    data = np.array([1.0, -0.5, -0.5, -1.0, 0.0, 1.0, -1.0, -1.0])
    indices = np.array([0, 1, 1, 2, 3, 1, 3, 4])
    indptr = np.array([0, 5, 8])
    return sp.csr_matrix((data, indices, indptr), shape=(2, 5))


def test_forest_from_rows_does_not_touch_its_argument():
    A = _with_zeros_and_duplicates()
    saved = _arrays(A)
    assert forest_from_rows(A) is not None
    _unchanged(A, saved)


def test_forest_from_queries_does_not_touch_its_argument():
    M = sp.csr_matrix((np.array([1.0, 1.0, 0.0, 1.0, 1.0]), np.array([0, 1, 2, 0, 0]),
                       np.array([0, 3, 4, 5])), shape=(3, 3))
    saved = _arrays(M)
    forest_from_queries(M)
    _unchanged(M, saved)


def test_round_consistent_does_not_touch_the_consistency_matrix():
    C = sp.csr_matrix((np.array([1.0, -1.0, -0.5, -0.5]), np.array([0, 1, 2, 2]), np.array([0, 4])),
                      shape=(1, 3))
    saved = _arrays(C)
    out = cvxdp.round_consistent(C, np.array([3.0, 1.4, 1.6]))
    assert out.sum() == 6.0 and out[0] == out[1] + out[2]
    _unchanged(C, saved)


def test_invariant_with_an_explicit_zero_solves_and_the_model_is_unchanged():
    """The stress instance, reduced: unmeasured leaves (the general ADMM runs), a total
    invariant over units given out of order (its rows carry explicit zeros), the polish on."""
    geo = cvxdp.workloads.geography(np.array([-1, 0, 0, 1, 1, 2, 2]))
    X = cp.Variable((7, 1))
    obj = cp.sum_squares(X[[0, 1, 2]] - np.array([[10.0], [6.0], [4.5]]))
    cons = [cvxdp.HierarchicalHistogram(geo, X), X >= 0,
            cp.sum(X[np.array([6, 3])][:, np.array([0])], axis=1) == np.array([2.0, 3.0])]
    prob = cp.Problem(cp.Minimize(obj), cons)
    prob.solve(method="cvxdp", solver=cvxdp.ADMM, eps_rel=1e-8)
    assert prob.status == cp.OPTIMAL
    ours = prob.value
    ref = prob.solve(solver=cp.CLARABEL)
    assert abs(ours - ref) <= 1e-6 * max(1.0, abs(ref))

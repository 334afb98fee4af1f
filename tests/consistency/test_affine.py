"""The Linearizer's direct sparse rules against cvxpy's own canonicalization backend."""
import numpy as np
import pytest
import scipy.sparse as sp
import cvxpy as cp

from cvxdp.recognise.affine import Linearizer


def _both(expr, variables):
    lin = Linearizer(variables)
    M, c = lin(expr)
    M_ref, c_ref = lin._fallback(expr)          # cvxpy's backend on the whole expression
    return M.toarray(), c, sp.csr_matrix(M_ref).toarray(), np.asarray(c_ref).ravel()


@pytest.mark.parametrize("seed", range(4))
def test_two_dimensional_products_match_cvxpy(seed):
    rng = np.random.default_rng(seed)
    X = cp.Variable((7, 4))
    z = cp.Variable(3)
    rows = rng.choice(7, 5, replace=False)
    B = rng.normal(size=(4, 3))
    A = rng.normal(size=(2, 5))
    Y0 = rng.normal(size=(5, 3))
    cases = [X[rows] @ B - Y0,                                   # Y @ B (dense)
             X[rows] @ sp.csr_matrix(B) + 1.5,                   # Y @ B (sparse), a constant
             A @ (X[rows] @ B - Y0),                             # A @ Y
             sp.csr_matrix(A) @ X[rows],                         # A @ Y (sparse)
             (2 * X[rows] + np.ones((5, 4))) @ np.eye(4),        # offset through the product
             X.T[:, rows] @ np.ones((5, 2))]                     # a transposed selection
    for e in cases:
        M, c, M_ref, c_ref = _both(e, [X, z])
        np.testing.assert_allclose(M, M_ref, atol=1e-12)
        np.testing.assert_allclose(c, c_ref, atol=1e-12)


def test_selection_of_a_variable_reads_its_offset():
    X = cp.Variable((3, 2))
    v = cp.Variable(4)
    lin = Linearizer([v, X])
    M, c = lin(X[[2, 0]])
    M_ref, c_ref = lin._fallback(X[[2, 0]])
    np.testing.assert_array_equal(M.toarray(), sp.csr_matrix(M_ref).toarray())
    assert M.shape == (4, 10) and not c.any()


def test_an_identity_factor_changes_nothing():
    X = cp.Variable((4, 3))
    lin = Linearizer([X])
    for e in (X[[1, 3]] @ np.eye(3), np.eye(2) @ X[[0, 2]] - 1.0):
        M, c = lin(e)
        M_ref, c_ref = lin._fallback(e)
        np.testing.assert_array_equal(M.toarray(), sp.csr_matrix(M_ref).toarray())
        np.testing.assert_array_equal(c, np.asarray(c_ref).ravel())


@pytest.mark.parametrize("seed", range(3))
def test_scaled_selections_match_cvxpy(seed):
    """Entrywise scalings of one whole variable plus constants (read as one CSR matrix, not
    walked node by node), against cvxpy's backend: broadcast constants, zero weights,
    matrices, parameters, nested negations; and what is not one (two variables, a
    broadcast variable) still read by the walk."""
    rng = np.random.default_rng(seed)
    x, X, u = cp.Variable(5), cp.Variable((3, 4)), cp.Variable(1)
    y, Y = rng.normal(size=5), rng.normal(size=(3, 4))
    w = rng.normal(size=5) * (rng.random(5) < 0.6)
    p = cp.Parameter(5, value=rng.normal(size=5))
    cases = [x - y, -x, 0 - x, 3.0 + x, cp.multiply(w, x - y), -(2.0 * (y - x)),
             cp.multiply(Y, X - Y) + 1.0, X - rng.normal(size=(1, 4)), X + rng.normal(size=(3, 1)),
             cp.multiply(p, x) - p, x - x[::-1] + y, u + y, cp.multiply(rng.normal(size=(3, 4)), X)]
    for e in cases:
        M, c, M_ref, c_ref = _both(e, [u, x, X])
        np.testing.assert_allclose(M, M_ref, atol=1e-12, err_msg=str(e))
        np.testing.assert_allclose(c, c_ref, atol=1e-12, err_msg=str(e))

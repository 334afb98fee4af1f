"""The independent-set levels of the general route's dense Newton solves
(:mod:`cvxdp.solvers._level_cholesky`): exact factors of every pattern kind (random
0/1 rows, a path, a star, a diagonal, a dense block), against numpy; the levels really taken;
matrices that are not positive definite refused; the caller's arrays untouched."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from cvxdp.solvers import _level_cholesky as level_cholesky
from cvxdp.solvers.consistency.dense_kkt import DenseKKT
from cvxdp.solvers._level_cholesky import LevelCholesky, _independent_set


def random_rows(n, seed):
    rng = np.random.default_rng(seed)
    R = sp.csr_matrix((np.ones(3 * n), (rng.integers(0, n, 3 * n), rng.integers(0, n, 3 * n))),
                      shape=(n, n))
    phi = rng.random(n) * 10 + 0.1
    return (R.T @ sp.diags(phi) @ R + sp.diags(rng.random(n) + 1e-3)).tocsc()


def path(n, seed):
    rng = np.random.default_rng(seed)
    D = sp.diags([np.ones(n - 1), -np.ones(n - 1)], [0, 1], shape=(n - 1, n))
    return (D.T @ sp.diags(rng.random(n - 1) + 0.5) @ D + 1e-2 * sp.identity(n)).tocsc()


def star(n, seed):
    rng = np.random.default_rng(seed)
    H = sp.lil_matrix((n, n))
    H[0, 1:] = 1.0
    H[1:, 0] = 1.0
    H.setdiag(np.r_[2.0 * n, rng.random(n - 1) + 1.0])
    return sp.csc_matrix(H)


def diagonal(n, seed):
    return sp.diags(np.random.default_rng(seed).random(n) + 0.1, format="csc")


def dense_block(n, seed):
    B = np.random.default_rng(seed).standard_normal((n, n))
    return sp.csc_matrix(B @ B.T + n * np.eye(n))


KINDS = {"random_rows": random_rows, "path": path, "star": star, "diagonal": diagonal,
         "dense": dense_block}


@pytest.fixture
def always_levels(monkeypatch):
    monkeypatch.setattr(level_cholesky, "_MIN_SAVED_FLOPS", 0.0)


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("n", [1, 2, 7, 120])
def test_factors_are_exact(always_levels, kind, n):
    if kind == "path" and n == 1:
        pytest.skip("a path needs two nodes")
    H = KINDS[kind](n, n)
    chol = LevelCholesky(H)
    assert chol.factor(H)
    rng = np.random.default_rng(0)
    Hd = H.toarray()
    for v in (rng.standard_normal(n), rng.standard_normal((n, 3))):
        v0 = v.copy()
        u = chol.forward(v)
        z = chol.backward(u)
        np.testing.assert_array_equal(v, v0)
        np.testing.assert_allclose(Hd @ z, v, atol=1e-9 * max(1.0, np.abs(v).max()) * np.linalg.cond(Hd))
        # u = L^{-1} v: ||u||^2 = v^T H^{-1} v
        quad = np.einsum("i...,i...->...", u, u)
        np.testing.assert_allclose(quad, np.einsum("i...,i...->...", v, np.linalg.solve(Hd, v)), rtol=1e-8)


@pytest.mark.parametrize("kind,most", [("path", 16), ("diagonal", 0), ("random_rows", 90), ("star", 1)])
def test_levels_take_out_independent_sets(always_levels, kind, most):
    """A path halves each level until what is left is a tenth dense (15 of 120 nodes), a
    diagonal leaves nothing dense, a star its centre; random rows most of them (their fill)."""
    H = KINDS[kind](120, 3)
    chol = LevelCholesky(H)
    assert chol.tail <= most
    if kind == "random_rows":
        assert chol.tail < 120
    assert chol.factor(H)


def test_independent_set_is_independent_and_maximal():
    H = random_rows(300, 5).tocsr()
    I = _independent_set(H)
    inI = np.zeros(300, dtype=bool)
    inI[I] = True
    G = H.tocoo()
    off = G.row != G.col
    assert not np.any(inI[G.row[off]] & inI[G.col[off]])
    blocked = inI.copy()
    blocked[G.col[off & inI[G.row]]] = True
    assert blocked.all()


def test_not_positive_definite_refused(always_levels):
    H = random_rows(60, 1)
    chol = LevelCholesky(H)
    assert not chol.factor(-H)
    H2 = H.tolil()
    H2[5, 5] = -1.0                  # an eliminated level's pivot, or the dense tail's
    assert not chol.factor(sp.csc_matrix(H2))
    assert chol.factor(H)


def test_small_matrices_skip_the_levels():
    """Below the flop saving that pays for them, the whole matrix goes to LAPACK."""
    H = random_rows(100, 2)
    assert LevelCholesky(H).tail == 100


@pytest.mark.parametrize("p", [0, 5])
def test_dense_kkt_with_levels(always_levels, p):
    n = 150
    H = random_rows(n, 4)
    H.sort_indices()
    A = sp.random(p, n, density=0.1, random_state=p, format="csr")
    d = 1e-9
    kkt = DenseKKT(n, A, (H.indptr, H.indices))
    assert kkt.tail < n
    assert kkt.factor(H.data.copy(), d)
    rng = np.random.default_rng(1)
    fx, fA = rng.standard_normal(n), rng.standard_normal(p)
    dx, dy = kkt.solve(fx, fA)
    K = np.block([[-H.toarray(), A.T.toarray()], [A.toarray(), d * np.eye(p)]])
    want = np.linalg.solve(K, np.r_[fx, fA])
    np.testing.assert_allclose(np.r_[dx, dy], want, atol=1e-7 * np.abs(want).max())


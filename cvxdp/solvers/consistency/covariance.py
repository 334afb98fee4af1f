"""Exact variances of linear queries of an equality-constrained least-squares estimate.

Model.  Noisy answers ``a`` (independent noise, variances ``s``) enter a squared loss and
the equality constraints linearly::

    xhat = argmin_x  1/2 sum_i w_i (M_i x - y_i)^2   s.t.  A x = b,
    y = P a + p,     b = b0 - N a.

With ``H = M^T W M`` and the KKT matrix ``K = [[H, A^T], [A, 0]]`` (symmetric), the estimate
is ``[xhat; lam] = K^{-1} [M^T W y; b]``, linear in ``a``.  For a query ``q`` solve
``K [u; mu] = [q; 0]``; then ``q^T xhat = u^T M^T W (P a + p) + mu^T (b0 - N a)``, whose
gradient in ``a`` is ``g = P^T W M u - N^T mu``, and

    Var(q^T xhat) = sum_j s_j g_j^2

(the sandwich formula: it holds whatever the weights ``w``, not only when they are the
inverse noise variances).  ``K`` is factorised once, regularised to the quasi-definite
``[[H + d1 I, A^T], [A, -d2 I]]`` (so dependent rows of ``A`` are harmless) and every solve is
refined against ``K`` itself; a query whose solve does not converge is not determined by the
data (``H`` singular on the null space of ``A``) and raises ``ValueError``.  Queries are solved
in blocks, never forming ``K^{-1}``.

Trees.  For a histogram at every unit of a tree (:mod:`.histogram_tree`) with noise
proportional to the inverse weights (``Cov(y) = c W^{-1}``, the maximum-likelihood weighting
up to one factor) the covariance of every cell is ``c`` times the GLS covariance of
:meth:`cvxdp.solvers.tree.gls.TreeGLS.variances` (``K11 H K11 = K11``): two passes over the
tree, ``O(k^3)`` per distinct unit class; one cell per unit, a few vector operations per
level (:meth:`cvxdp.solvers.tree.forest.TreeLSQ.variances`).
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from .histogram_tree import HistogramTree
from ..tree.forest import TreeLSQ
from ..tree.gls import TreeGLS

__all__ = ["KKTVariances", "tree_cell_variances", "proportional_noise"]

_BLOCK = 256            # queries per block of right-hand sides
_REFINE = 30            # refinement steps at most
_RTOL = 1e-10           # refinement stops at this residual, relative to the query


class KKTVariances:
    """Variances of queries of the estimate of the module docstring.

    ``M`` ``(m, n)``, ``w`` ``(m,)`` non-negative, ``P`` ``(m, r)``, ``s`` ``(r,)`` the noise
    variances of ``a``, ``A`` ``(e, n)`` or ``None``, ``N`` ``(e, r)`` or ``None``."""

    def __init__(self, M, w, P, s, A=None, N=None) -> None:
        self.M = sp.csr_matrix(M)
        self.n = self.M.shape[1]
        self.w = np.asarray(w, dtype=float)
        self.P = sp.csr_matrix(P)
        self.s = np.asarray(s, dtype=float)
        self.A = sp.csr_matrix((0, self.n)) if A is None else sp.csr_matrix(A)
        self.N = sp.csr_matrix((self.A.shape[0], self.P.shape[1])) if N is None else sp.csr_matrix(N)
        H = (self.M.T @ sp.diags(self.w) @ self.M).tocsc()
        e = self.A.shape[0]
        self.K = sp.bmat([[H, self.A.T], [self.A, None]], format="csc")
        hmax = max(float(np.max(np.abs(H.diagonal()), initial=0.0)), 1e-300)
        amax = float(np.max(np.abs(self.A).max(axis=1).toarray(), initial=1.0)) if e else 1.0
        d1, d2 = 1e-10 * hmax, 1e-10 * amax * amax / hmax
        reg = sp.diags(np.concatenate([np.full(self.n, d1), np.full(e, -d2)]))
        self._lu = spla.splu((self.K + reg).tocsc(), permc_spec="MMD_AT_PLUS_A",
                             options={"SymmetricMode": True}, diag_pivot_thresh=0.0)

    def _solve(self, R: np.ndarray) -> np.ndarray:
        """``K Z = R`` for a block of right-hand sides, refined; ``ValueError`` if a column
        does not converge (the query is not determined by the data)."""
        Z = self._lu.solve(R)
        scale = np.maximum(np.abs(R).max(axis=0), 1e-300)
        for _ in range(_REFINE):
            res = R - self.K @ Z
            err = np.abs(res).max(axis=0) / scale
            if np.all(err <= _RTOL):
                return Z
            Z += self._lu.solve(res)
        res = R - self.K @ Z
        err = np.abs(res).max(axis=0) / scale
        if np.any(err > 1e-6):
            raise ValueError("the estimate is not determined by the data in the direction of "
                             f"query {int(np.argmax(err > 1e-6))} (the loss and the equalities "
                             "leave it free): its error bar is infinite")
        return Z

    def estimate(self, y: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        """``xhat`` itself for loss answers ``y`` and right-hand side ``b``:
        ``K [xhat; lam] = [M^T W y; b]``, refined like the queries' solves."""
        e = self.A.shape[0]
        rhs = np.concatenate([self.M.T @ (self.w * np.asarray(y, dtype=float)),
                              np.zeros(e) if b is None else np.asarray(b, dtype=float)])
        return self._solve(rhs[:, None])[:self.n, 0]

    def variances(self, Q) -> np.ndarray:
        """``Var(q^T xhat)`` for each row ``q`` of ``Q`` ``(k, n)`` (dense or sparse)."""
        Q = sp.csr_matrix(Q)
        k, e = Q.shape[0], self.A.shape[0]
        out = np.empty(k)
        WM = sp.diags(self.w) @ self.M
        for lo in range(0, k, _BLOCK):
            hi = min(k, lo + _BLOCK)
            R = np.zeros((self.n + e, hi - lo))
            R[:self.n] = Q[lo:hi].T.toarray()
            Z = self._solve(R)
            G = self.P.T @ (WM @ Z[:self.n]) - self.N.T @ Z[self.n:]
            out[lo:hi] = self.s @ (G * G)
        return out


def proportional_noise(M, w, P, s, N=None) -> float | None:
    """``c`` when the answers' noise is ``c W^{-1}`` row by row (each row of ``M`` reads one
    noisy answer, no answer read twice, none in the constraints), else ``None``."""
    P = sp.csr_matrix(P)
    if N is not None and sp.csr_matrix(N).nnz:
        return None
    rows = np.diff(P.indptr)
    if np.any(rows > 1) or np.unique(P.indices).size != P.indices.size:
        return None
    w = np.asarray(w, dtype=float)
    var = np.zeros(P.shape[0])
    has = rows == 1
    var[has] = P.data ** 2 * np.asarray(s, dtype=float)[P.indices]
    live = w > 0
    if np.any(live & ~has) or not np.any(live):
        return None
    ratio = var[live] * w[live]
    c = float(np.median(ratio))
    if c <= 0 or np.max(np.abs(ratio - c)) > 1e-9 * c:
        return None
    return c


def tree_cell_variances(tree: HistogramTree, c: float) -> np.ndarray:
    """Each coordinate's variance (flat, column-major ``(units, cells)``), ``c`` times the
    tree GLS covariance; ``ValueError`` if a leaf is not determined (from :class:`TreeGLS`)."""
    if tree.k == 1 and not tree.invariants:
        info = np.zeros(tree.n_units)           # a_v = sum of w q^2 over v's measurements
        for b in tree.blocks:
            np.add.at(info, b.nodes, float(np.sum(b.w * b.Q[:, 0] ** 2)))
        var = TreeLSQ(tree.forest, info).variances()
        if var is not None:
            return c * var
    g = TreeGLS(tree.forest, tree.k, tree.blocks, tree.invariants)
    cells, _ = g.variances()
    return c * cells.ravel(order="F")

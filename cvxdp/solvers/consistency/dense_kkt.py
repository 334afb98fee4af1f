"""The interior point's reduced Newton system where its sparse factor fills in.

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

``L`` is :class:`~cvxdp.solvers._level_cholesky.LevelCholesky`'s: independent sets
of ``H``'s graph eliminated level by level, the rest by LAPACK's dense Cholesky in one buffer
kept for the whole solve (scipy's ``toarray`` of the sparse ``H`` took 52 ms per iteration at
n = 3,000).
"""
from __future__ import annotations

import numpy as np
from scipy.linalg import lapack
import scipy.sparse as sp

from .._blas import threads
from .._level_cholesky import LevelCholesky

__all__ = ["DenseKKT"]

# factorisations whose dense part has at least this many unknowns use every BLAS thread (the
# interior point runs on one: OpenBLAS's second thread cost more than it gained below this on
# a 2-core machine, n = 1,000-3,000 by a factor of 1.4-2, and gained 1.5x at n = 10,000,
# 6,400 of them dense)
_THREADED = 4000


class DenseKKT:
    """Factorise and solve the system above for a fixed ``A`` (sparse or dense) and ``H``
    given by its values on the CSC pattern ``pattern = (indptr, indices)`` (n x n, both
    triangles)."""

    def __init__(self, n: int, A, pattern: tuple[np.ndarray, np.ndarray]) -> None:
        self.n, self.p = n, A.shape[0]
        indptr, indices = pattern
        self._indptr, self._indices = indptr, indices
        self._chol = LevelCholesky(sp.csc_matrix((np.ones(len(indices)), indices, indptr),
                                                 shape=(n, n)))
        if self.p:
            AT = A.T.toarray() if sp.issparse(A) else np.asarray(A, dtype=float).T
            self._AT = np.asfortranarray(AT)
        self._X = self._S = None

    @property
    def tail(self) -> int:
        """Unknowns of ``H`` factorised dense (the rest were eliminated as independent sets)."""
        return self._chol.tail

    def factor(self, hdata: np.ndarray, dreg: float) -> bool:
        """``H = L L^T`` (``H`` given by its pattern's values ``hdata``) and the Schur
        complement's Cholesky factor; ``False`` when ``H`` is not numerically positive
        definite."""
        if self._chol.tail < _THREADED:
            # the interior point runs on one BLAS thread already; setting the count per call
            # cost 30 us of a 100 us factorisation at n = 100
            return self._factor(hdata, dreg)
        with threads(None):
            return self._factor(hdata, dreg)

    def _factor(self, hdata: np.ndarray, dreg: float) -> bool:
        n = self.n
        H = sp.csc_matrix((hdata, self._indices, self._indptr), shape=(n, n))
        if not self._chol.factor(H):
            return False
        if self.p:
            X = self._chol.forward(self._AT)
            if not np.all(np.isfinite(X)):
                return False
            S = X.T @ X
            S[np.diag_indices_from(S)] += dreg
            # LAPACK directly: scipy's cho_factor / cho_solve wrappers took 40 us a call
            # (array-API checks) where the work at p = 5 is a microsecond
            S, info = lapack.dpotrf(S, lower=1, clean=0, overwrite_a=1)
            if info != 0 or not np.all(np.isfinite(S.diagonal())):
                return False
            self._S, self._X = S, X
        return True

    def solve(self, fx: np.ndarray, fA: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(dx, dy)`` from the last factorisation."""
        u = self._chol.forward(fx)
        if not self.p:
            return -self._chol.backward(u), np.zeros(0)
        dy, _ = lapack.dpotrs(self._S, fA + self._X.T @ u, lower=1)
        return self._chol.backward(self._X @ dy - u), dy

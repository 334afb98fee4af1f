"""Cholesky factors of a sparse positive definite matrix: independent sets first, the rest dense.

For a set ``I`` of unknowns no two of which share an entry of ``H`` (an independent set of its
graph), ordering ``I`` first gives ``H = [[D, E^T], [E, C]]`` with ``D`` diagonal, and the block
``LDL^T`` step (Golub & Van Loan 2013, sec. 4.2)

    H = [[1, 0], [E D^{-1}, 1]] diag(D, S) [[1, D^{-1} E^T], [0, 1]],    S = C - E D^{-1} E^T,

costs one sparse product.  The same is done on ``S`` level after level (the independent sets
of Saad's multilevel ILU, ARMS, 2002, with nothing dropped, so the factors are exact) while a
level removes a fair share of what is left and the Schur complement stays sparse; the last one
is factorised by LAPACK.  ``H = L L^T`` with ``L = L_levels diag(D_1^{1/2}, ..., L_tail)``.

Why: the interior point's Newton matrix ``Hx + M^T Phi M`` of random 0/1 rows fills a sparse
factor to ~40 % of a dense one (see :mod:`cvxdp.solvers.consistency.ipm`; the marginal
family's normal equations, :mod:`cvxdp.solvers.marginal.lp`, likewise), which then is dense
work at scalar speed; the unknowns of low degree form independent sets that take a third of them out at almost no
cost.  Measured on ``M`` = identity on 5 random 0/1 entries per column, n = 10,000: three
levels leave 6,639 unknowns, one thread's factorisation 2.8 s (LAPACK) + 0.1 s (levels)
against 10.6 s for the whole matrix dense; n = 3,000: 0.16 s against 0.34 s; n = 1,000 the
same time (hence :data:`_MIN_SAVED_FLOPS`).
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.linalg import blas, lapack

__all__ = ["LevelCholesky"]

# a level must take out at least this share of what is left ...
_MIN_SHARE = 0.05
# ... of a Schur complement at most this dense (beyond it LAPACK's dense speed wins)
_MAX_DENSITY = 0.1
# levels are used when they save LAPACK at least this many multiply-adds (n^3 / 3 - t^3 / 3):
# each costs a few sparse products and index copies per factorisation and solve
_MIN_SAVED_FLOPS = 5e8


def _independent_set(G: sp.csr_matrix) -> np.ndarray:
    """A maximal independent set of ``G``'s graph, greedily by ascending degree (sorted):
    unknowns of low degree first, as minimum-degree orderings take them."""
    ip, ix = G.indptr, G.indices
    order = np.argsort(np.diff(ip), kind="stable")
    blocked = np.zeros(G.shape[0], dtype=bool)
    chosen = []
    for v in order.tolist():
        if not blocked[v]:
            chosen.append(v)
            blocked[ix[ip[v]:ip[v + 1]]] = True
    return np.sort(np.asarray(chosen, dtype=np.int64))


def _levels(pattern: sp.csr_matrix) -> list[tuple[np.ndarray, np.ndarray]]:
    """The levels' ``(I, J)``, positions in the previous level's Schur complement, from ``H``'s
    symmetric pattern (the fill of each level is ``E E^T``, no cancellation assumed)."""
    S = sp.csr_matrix(pattern, dtype=np.float64, copy=True)
    S.data[:] = 1.0
    levels = []
    while S.shape[0] and S.nnz <= _MAX_DENSITY * S.shape[0] ** 2:
        m = S.shape[0]
        I = _independent_set(S)
        if I.size < _MIN_SHARE * m:
            break
        J = np.setdiff1d(np.arange(m), I, assume_unique=True)
        SJ = S[J]
        E = SJ[:, I]
        S = (SJ[:, J] + E @ E.T).tocsr()
        S.data[:] = 1.0
        levels.append((I, J))
    return levels


class LevelCholesky:
    """``H = L L^T`` for symmetric positive definite ``H`` of a fixed sparsity pattern: the
    levels are found once from the pattern, ``factor`` takes new values, ``forward`` and
    ``backward`` apply ``L^{-1}`` and ``L^{-T}`` to a vector or the columns of a matrix."""

    def __init__(self, pattern: sp.spmatrix) -> None:
        pattern = sp.csr_matrix(pattern)
        n = pattern.shape[0]
        self.n = n
        levels = _levels(pattern)
        glob = np.arange(n)
        self._levels = []
        for I, J in levels:
            self._levels.append((I, J, glob[I], glob[J]))
            glob = glob[J]
        tail = glob.size
        if (n ** 3 - tail ** 3) / 3.0 < _MIN_SAVED_FLOPS:
            self._levels, glob = [], np.arange(n)
        self._tail = glob
        self._buffer = np.zeros(glob.size ** 2)
        self._factors: list | None = None
        self._L: np.ndarray | None = None

    @property
    def tail(self) -> int:
        """Unknowns left to the dense factorisation."""
        return int(self._tail.size)

    def factor(self, H: sp.spmatrix) -> bool:
        """Factorise ``H`` (its pattern within the one given); ``False`` when it is not
        numerically positive definite."""
        S = sp.csr_matrix(H) if self._levels else H
        self._factors, self._L = None, None
        factors = []
        for I, J, _, _ in self._levels:
            SJ = S[J]
            D = S[I][:, I].diagonal()
            if not np.all(D > 0.0) or not np.all(np.isfinite(D)):
                return False
            E = SJ[:, I].tocsr()
            S = (SJ[:, J] - E @ sp.diags(1.0 / D) @ E.T).tocsr()
            factors.append((D, np.sqrt(D), E, E.T.tocsr()))
        m = self._tail.size
        if m:
            flat = self._buffer
            flat.fill(0.0)
            C = S.tocoo()
            flat[C.row.astype(np.int64) + C.col.astype(np.int64) * m] = C.data
            F = flat.reshape((m, m), order="F")     # a view: potrf factorises in place
            L, info = lapack.dpotrf(F, lower=1, clean=0, overwrite_a=1)
            if info != 0 or not np.all(np.isfinite(L.diagonal())):
                return False
            self._L = L
        self._factors = factors
        return True

    def _tail_solve(self, B: np.ndarray, trans: int) -> np.ndarray:
        if B.ndim == 1:
            return blas.dtrsv(self._L, B, lower=1, trans=trans)
        X, info = lapack.dtrtrs(self._L, B, lower=1, trans=trans)
        return X

    def forward(self, v: np.ndarray) -> np.ndarray:
        """``L^{-1} v`` (a new array)."""
        if not self._levels:                     # all dense: no copies through the index
            return self._tail_solve(np.asarray(v, dtype=np.float64), 0)
        u = np.array(v, dtype=np.float64, copy=True)
        for (_, _, Ig, Jg), (D, sqrtD, E, _) in zip(self._levels, self._factors):
            wI = u[Ig]
            scaled = wI / (D if u.ndim == 1 else D[:, None])
            u[Jg] -= E @ scaled
            u[Ig] = wI / (sqrtD if u.ndim == 1 else sqrtD[:, None])
        if self._tail.size:
            u[self._tail] = self._tail_solve(u[self._tail], 0)
        return u

    def backward(self, u: np.ndarray) -> np.ndarray:
        """``L^{-T} u`` (a new array)."""
        if not self._levels:
            return self._tail_solve(np.asarray(u, dtype=np.float64), 1)
        z = np.array(u, dtype=np.float64, copy=True)
        if self._tail.size:
            z[self._tail] = self._tail_solve(z[self._tail], 1)
        for (_, _, Ig, Jg), (D, sqrtD, _, ET) in zip(reversed(self._levels), reversed(self._factors)):
            if z.ndim == 1:
                z[Ig] = z[Ig] / sqrtD - (ET @ z[Jg]) / D
            else:
                z[Ig] = z[Ig] / sqrtD[:, None] - (ET @ z[Jg]) / D[:, None]
        return z

"""Projection onto an affine set ``{x : A x = b}`` with a cached factorization.

``Pi(v) = v - A^T (A A^T)^+ (A v - b)``.  The Gram matrix ``K = A A^T`` (p x p)
is factorized once: dense Cholesky when p is small, sparse LU otherwise.  When
there are fewer variables than rows (n < p) the equivalent normal equations of
the null-space form would be cheaper, but the consistency constraints we meet
(trees, marginals, k-gram prefixes) always have p < n.

Redundant rows (the marginals of a contingency table all share the total) make
``K`` singular.  We factorize ``K + delta I`` with a tiny ``delta`` and refine
iteratively: errors along ``null(K) = null(A^T)`` are annihilated by ``A^T``,
and the bias on the range contracts by ``delta / (sigma_i^2 + delta)`` per step.
If ``b`` is not in the range of ``A`` the set is empty; :attr:`feasible` says so.

For forests (:mod:`cvxdp.solvers.tree.forest`) the O(n) two-pass projection replaces all this.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from .._linalg import norm as _norm
from ..tree.forest import Forest, TreeLSQ, forest_from_rows

__all__ = ["AffineProjector", "ForestProjector", "make_projector"]

# Below this many rows the Gram matrix is factorized densely.
_DENSE_ROWS = 1000
# Eigenvalues of a small Gram matrix below this fraction of the largest are treated
# as zero (redundant constraint rows).
_PINV_RTOL = 1e-12
# Largest n * p for which the dense n x p factor A^T K^+ is stored.
_DENSE_B_ENTRIES = 4_000_000
# Regularization of the Gram matrix, relative to its largest diagonal entry.
_GRAM_REG = 1e-12
# Iterative-refinement steps and their target (relative residual).
_REFINE_STEPS = 4
_REFINE_RTOL = 1e-13
# A projected point whose residual stays above this (relative) means b is not in range(A).
_INFEASIBLE_RTOL = 1e-8


class AffineProjector:
    """Euclidean projection onto ``{x : A x = b}`` for a general sparse ``A``."""

    def __init__(self, A: sp.spmatrix, b: np.ndarray) -> None:
        self.A = sp.csr_matrix(A, dtype=float)
        self.AT = self.A.T.tocsr()
        self.b = np.asarray(b, dtype=float).copy()
        p, self.n = self.A.shape
        K = (self.A @ self.AT).tocsc()
        diag = K.diagonal()
        scale = float(diag.max()) if diag.size else 1.0
        self._delta = _GRAM_REG * max(scale, 1e-300)
        self._B = None
        if p <= _DENSE_ROWS:
            # Small Gram matrix: its eigendecomposition gives the pseudo-inverse exactly,
            # redundant rows included, so a projection is one step (no refinement).
            evals, V = np.linalg.eigh(K.toarray())
            keep = evals > _PINV_RTOL * max(float(evals.max(initial=0.0)), 1e-300)
            Kpinv = (V[:, keep] / evals[keep]) @ V[:, keep].T
            self._solve = lambda r: Kpinv @ r
            if p * self.n <= _DENSE_B_ENTRIES:
                self._B = np.asarray(self.AT @ Kpinv)       # x = v - B (A v - b)
        else:
            lu = spla.splu((K + self._delta * sp.identity(p, format="csc")).tocsc())
            self._solve = lu.solve
        self._scale_A = float(np.sqrt(scale)) if p else 1.0
        x0 = self.project(np.zeros(self.n))
        r = self.A @ x0 - self.b
        self.feasible = bool(_norm(r) <= _INFEASIBLE_RTOL * (1.0 + _norm(self.b)))
        self.particular = x0

    def project(self, v: np.ndarray) -> np.ndarray:
        x = np.array(v, dtype=float, copy=True)
        if self._B is not None:
            x -= self._B @ (self.A @ x - self.b)
            return x
        target = _REFINE_RTOL * (_norm(self.b) + self._scale_A * _norm(x) + 1e-300)
        for _ in range(_REFINE_STEPS):
            r = self.A @ x - self.b
            if _norm(r) <= target:
                break
            x -= self.AT @ self._solve(r)
        return x

    def project_nullspace(self, v: np.ndarray) -> np.ndarray:
        """Projection onto ``{x : A x = 0}``."""
        x = np.array(v, dtype=float, copy=True)
        if self._B is not None:
            x -= self._B @ (self.A @ x)
            return x
        for _ in range(1 if self._solve is None else 2):
            x -= self.AT @ self._solve(self.A @ x)
        return x

    def multipliers(self, g: np.ndarray) -> np.ndarray:
        """Least-squares ``y`` with ``A^T y ~ g``."""
        return self._solve(self.A @ g)

    def residual(self, x: np.ndarray) -> np.ndarray:
        return self.A @ x - self.b


class ForestProjector:
    """Projection onto forest consistency ``s_r (x_p - sum_c x_c) = b_r`` in O(n).

    ``row_parent``/``row_scale`` map the user's rows to parents (see
    :func:`cvxdp.solvers.tree.forest.forest_from_rows`), so multipliers come back per user row.
    """

    def __init__(self, forest: Forest, row_parent: np.ndarray, row_scale: np.ndarray,
                 offsets: np.ndarray) -> None:
        self.forest = forest
        self.n = forest.n
        self.lsq = TreeLSQ(forest)
        self.offsets = None if not np.any(offsets) else np.asarray(offsets, dtype=float)
        self.row_parent = np.asarray(row_parent)
        self.row_scale = np.asarray(row_scale, dtype=float)
        self.feasible = True
        self.particular = self.project(np.zeros(self.n))

    def project(self, v: np.ndarray) -> np.ndarray:
        return self.lsq.project(v, self.offsets)

    def project_nullspace(self, v: np.ndarray) -> np.ndarray:
        return self.lsq.project(v)

    def multipliers(self, g: np.ndarray) -> np.ndarray:
        g_perp = g - self.lsq.project(g)            # the component in range(C^T)
        lam = np.zeros(self.n)
        lam[self.forest.is_internal] = self.forest.multipliers(g_perp)
        return lam[self.row_parent] / self.row_scale

    def residual(self, x: np.ndarray) -> np.ndarray:
        r = x - self.forest.children_sum(x)
        if self.offsets is not None:
            r = r - self.offsets
        return r[self.row_parent] * self.row_scale

    def feasible_from(self, x: np.ndarray) -> np.ndarray:
        """A consistent point sharing the leaves of ``x``."""
        return self.forest.sum_up(x, self.offsets)


def make_projector(A: sp.spmatrix, b: np.ndarray, forest_hint=None, *, found=False):
    """A :class:`ForestProjector` if ``A x = b`` is forest consistency, else an
    :class:`AffineProjector`.  ``forest_hint`` = ``(forest, row_parent, row_scale)``
    skips the pattern search when the caller already knows the forest; ``found``, when
    given, is that search's result (:meth:`ConsistencyData.forest_rows`)."""
    b = np.asarray(b, dtype=float)
    if forest_hint is not None:
        forest, row_parent, row_scale = forest_hint
        offsets = np.zeros(forest.n)
        offsets[row_parent] = b / row_scale
        return ForestProjector(forest, row_parent, row_scale, offsets)
    if found is False:
        found = forest_from_rows(A, b)
    if found is not None:
        return ForestProjector(*found)
    return AffineProjector(A, b)

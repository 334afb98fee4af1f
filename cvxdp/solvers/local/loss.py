"""A marginal loss read cell by cell, for the local-polytope ADMM.

A :class:`~cvxdp.solvers.marginal.loss.MarginalLoss` whose rows each touch at most one cell
(marginals measured by the identity, weighted, scaled or on a subset of cells: the Gaussian
and Laplace likelihoods of noisy marginals) is a sum of one-dimensional functions

    L(t) = K + sum_i f_i(t_i),     f_i(x) = A_i/2 (x - c_i)^2 + r_i + w_i |x - b_i|,

with ``A_i = sum w a^2``, ``C_i = sum w a y``, centre ``c_i = C_i / A_i`` and ``r_i = sum w/2
(a c_i - y)^2`` (the least value; zero for one row) over its squared rows ``w/2 (a x - y)^2``,
``K`` the rows touching no cell, and at most one absolute row ``w |a x - y| = (w |a|) |x - y/a|``
per cell.  The centred form matters: expanded (``A/2 x^2 - C x + w y^2/2``) its terms are
``w count^2`` and cancel down to the loss, which rounding loses at high signal to noise.  Everything the ADMM needs of the loss is
then closed form: the proximal step on ``x >= 0`` and the per-clique minimisation in the
lower bound (:func:`CellLoss.argmin`).  Rows touching several cells (a query matrix applied to
a marginal), or a second absolute row on one cell, are *coupled* rows: they stay in their
:class:`MarginalLoss` terms and the ADMM treats them through an extra splitting.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..marginal.loss import LossTerm, MarginalLoss

__all__ = ["CellLoss", "split_loss"]


class CellLoss:
    """``K + sum_i A_i/2 (x_i - c_i)^2 + r_i + w_i |x_i - b_i|`` over ``n`` cells (``C = A c``)."""

    def __init__(self, n: int) -> None:
        self.n = int(n)
        self.A = np.zeros(n)
        self.C = np.zeros(n)
        self.w = np.zeros(n)
        self.b = np.zeros(n)
        self.c = np.zeros(n)
        self.r = np.zeros(n)
        self.K = 0.0

    def cell_values(self, x: np.ndarray) -> np.ndarray:
        """``f_i(x_i)`` in the centred form (``inf`` where ``x`` is)."""
        with np.errstate(invalid="ignore"):
            v = 0.5 * self.A * (x - self.c) ** 2 + self.r + self.w * np.abs(x - self.b)
        return np.where(np.isinf(x), np.inf, v)

    def value(self, x: np.ndarray) -> float:
        return self.K + float(np.sum(self.cell_values(x)))

    def freeze(self) -> None:
        """Centres, and which closed form applies (after the rows are all read)."""
        curved = self.A > 0
        self.c = np.where(curved, self.C / np.where(curved, self.A, 1.0), 0.0)
        self.smooth = not np.any(self.w > 0)
        self.strict = bool(np.all(self.A > 0))

    def argmin(self, A: np.ndarray, k: np.ndarray, upper: np.ndarray | float, *,
               curved: bool | None = None) -> np.ndarray:
        """Minimiser of ``A/2 x^2 - k x + w |x - b|`` over ``[0, upper]``, cell by cell (``A``
        may be zero: the function is then piecewise linear; ``upper`` may be ``inf``).
        ``curved``: every ``A`` is positive (default: as for the loss's own ``A``)."""
        if curved is None:
            curved = self.strict
        if self.smooth and curved:
            # squared rows only and every cell curved: the clipped stationary point
            out = k / A
            return np.clip(out, 0.0, upper, out=out)
        w, b = self.w, self.b
        with np.errstate(divide="ignore", invalid="ignore"):
            right = (k - w) / A                  # stationary point right of b
            left = (k + w) / A                   # ... left of b
            quad = np.where(right > b, right, np.where(left < b, left, b))
        lin = np.where(w - k < 0, np.inf, np.where(-k - w > 0, 0.0, b))
        x = np.where(A > 0, quad, lin)
        return np.clip(x, 0.0, upper)

    def prox(self, v: np.ndarray, rho: float) -> np.ndarray:
        """``argmin_{x >= 0} f(x) + rho/2 ||x - v||^2``."""
        return self.argmin(self.A + rho, self.C + rho * v, np.inf, curved=True)


def split_loss(loss: MarginalLoss) -> tuple[CellLoss, MarginalLoss]:
    """``(cells, coupled)``: the rows of ``loss`` that touch one cell, read as a
    :class:`CellLoss`, and the other rows as a :class:`MarginalLoss` (module docstring);
    ``coupled.origin[j] = (i, rows)``: coupled term ``j`` is rows ``rows`` of term ``i``."""
    cells = CellLoss(loss.n)
    cells.K = loss.constant
    coupled: list[LossTerm] = []
    squared = []
    origin: list[tuple[int, np.ndarray]] = []
    for i, t in enumerate(loss.terms):
        if isinstance(t.A, slice) and (t.kind == "l2" or not np.any(cells.w[t.A] > 0)):
            # the identity on a slice (the common case): read without index arrays, which
            # cost O(n) per term (31 s for Adult's 364 three-way cliques)
            _add_slice(cells, t, squared)
            continue
        if isinstance(t.A, slice):
            idx = np.arange(t.A.start, t.A.stop)
            coef = np.ones(idx.size)
            single = np.ones(idx.size, dtype=bool)
            empty = np.zeros(idx.size, dtype=bool)
        else:
            A = t.A.tocsr()
            nnz = np.diff(A.indptr)
            single, empty = nnz == 1, nnz == 0
            idx = np.zeros(A.shape[0], dtype=np.int64)
            coef = np.zeros(A.shape[0])
            idx[single] = A.indices[A.indptr[:-1][single]]
            coef[single] = A.data[A.indptr[:-1][single]]
            single &= coef != 0
            empty |= (nnz == 1) & (coef == 0)
        w, y = t.w, t.b
        if t.kind == "l2":
            cells.K += 0.5 * float(np.dot(w[empty], y[empty] ** 2))
            cells.A += np.bincount(idx[single], w[single] * coef[single] ** 2, minlength=loss.n)
            cells.C += np.bincount(idx[single], w[single] * coef[single] * y[single], minlength=loss.n)
            squared.append((idx[single], w[single], coef[single], y[single]))
        else:
            cells.K += float(np.dot(w[empty], np.abs(y[empty])))
            # one absolute row per cell; a second one on the same cell is a coupled row
            rows = np.flatnonzero(single)
            first = np.zeros(rows.size, dtype=bool)
            _, pos = np.unique(idx[rows], return_index=True)
            first[pos] = True
            taken = cells.w[idx[rows[first]]] > 0
            first[np.flatnonzero(first)[taken]] = False
            keep = rows[first]
            cells.w[idx[keep]] = w[keep] * np.abs(coef[keep])
            cells.b[idx[keep]] = y[keep] / coef[keep]
            single = np.zeros_like(single)
            single[keep] = True
        rest = ~(single | empty)
        if np.any(rest):
            sub = np.flatnonzero(rest)
            A = (sp.identity(loss.n, format="csr")[idx[sub]] if isinstance(t.A, slice)
                 else t.A.tocsr()[sub])
            coupled.append(LossTerm(t.kind, A, y[sub], w[sub]))
            origin.append((i, sub))
    cells.freeze()
    for idx, w, a, y in squared:            # r_i: the least value of the cell's squared rows
        if isinstance(idx, slice):
            cells.r[idx] += 0.5 * w * (cells.c[idx] - y) ** 2
        else:
            cells.r += np.bincount(idx, 0.5 * w * (a * cells.c[idx] - y) ** 2, minlength=loss.n)
    out = MarginalLoss(coupled, loss.n, 0.0)
    out.origin = origin
    return cells, out


def _add_slice(cells: CellLoss, t: LossTerm, squared: list) -> None:
    """Rows ``w (x_i - y_i)`` on the cells of the slice ``t.A`` (no absolute row there yet
    for an absolute term)."""
    sl = t.A
    if t.kind == "l2":
        cells.A[sl] += t.w
        cells.C[sl] += t.w * t.b
        squared.append((sl, t.w, None, t.b))
    else:
        cells.w[sl] = t.w
        cells.b[sl] = t.b

"""The interior point's Newton matrices on a pattern fixed once
(:mod:`cvxdp.solvers.consistency.ipm`).

Each iteration of the interior point changes only the weights ``phi`` (one per loss or order
row) and the bounds' curvature ``Hx``: ``H = Hx + R^T Phi R`` keeps its pattern, and so does
the KKT matrix ``[-H  A^T; A  d I]``.  :class:`NewtonAssembly` finds the patterns once and then
writes the values into known slots.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

__all__ = ["NewtonAssembly"]

# the pattern-fixed assembly of H from row pairs, when the pairs number at most this many times
# H's entries (or at most _PAIRS_MIN); else the sparse product each iteration
_PAIRS_RATIO = 4
_PAIRS_MIN = 200_000


class NewtonAssembly:
    """The Newton matrices' values on a pattern fixed once (an interior-point iteration only
    changes the weights): ``H = Hx + R^T Phi R`` as ``H.data = T phi`` plus its diagonal, and
    the KKT matrix ``[-H  A^T; A  d I]`` with ``-H``'s and ``d``'s slots of its data known.
    Assembling them with scipy's sparse products each iteration was most of a small
    problem's time (2.4 ms of 2.5 per iteration at n = 100)."""

    def __init__(self, R: sp.csr_matrix, A: sp.csr_matrix) -> None:
        n, p = R.shape[1], A.shape[0]
        self.n, self.p = n, p
        R = sp.csr_matrix(R, copy=True)
        R.sum_duplicates()
        R.eliminate_zeros()
        lens = np.diff(R.indptr).astype(np.int64)
        # H's pattern: |R|^T |R| (no cancellation) and the diagonal, as keys col * n + row
        S = (abs(R).T @ abs(R)).tocoo()
        uniq = np.unique(np.r_[S.col.astype(np.int64) * n + S.row, np.arange(n) * (n + 1)])
        self.h_indptr = np.searchsorted(uniq // n, np.arange(n + 1)).astype(np.int32)
        self.h_indices = (uniq % n).astype(np.int32)
        self.h_diag = np.searchsorted(uniq, np.arange(n) * (n + 1))
        self._uniq, self._R, self._RT = uniq, R, R.T.tocsr()
        self.T = None
        if int(lens @ lens) <= max(_PAIRS_MIN, _PAIRS_RATIO * uniq.size):
            # every pair of entries (a, b) of one row of R: H[col a, col b] += R_a R_b phi_row.
            # Rows with many entries (a dense query matrix) make the pairs outnumber H's
            # entries by a factor of the row length: those keep the sparse product
            # (measured: a 400 x 400 Gaussian query matrix, 6.4e7 pairs, 24 s and 5 GB)
            row = np.repeat(np.arange(R.shape[0]), lens)
            first = np.repeat(np.arange(R.nnz), lens[row])
            start = np.repeat(np.cumsum(lens[row]) - lens[row], lens[row])
            second = R.indptr[row[first]] + (np.arange(first.size) - start)
            keys = R.indices[second].astype(np.int64) * n + R.indices[first]
            pos = np.minimum(np.searchsorted(uniq, keys), uniq.size - 1)
            if np.array_equal(uniq[pos], keys):      # else a product underflowed out of S
                self.T = sp.csr_matrix((R.data[first] * R.data[second], (pos, row[first])),
                                       shape=(uniq.size, R.shape[0]))
        # the KKT pattern, built once from markers saying which slot holds what: H's entry k
        # as k + 1, A's entry j (in both blocks) as -(3 + j), the dual regularisation as -2
        # (the whole matrix for SuperLU only, built when first asked: QDLDL reads the upper
        # triangle, [triu(H) A^T; 0 d I], and the dense path neither)
        self._A = sp.csr_matrix(A)
        self._Hm = sp.csc_matrix((np.arange(1.0, uniq.size + 1), self.h_indices, self.h_indptr),
                                 shape=(n, n))
        self._slots: dict = {}
        self._upper: sp.csc_matrix | None = None

    def _marker(self, upper: bool) -> sp.csc_matrix:
        """The KKT matrix of markers, from coordinates (scipy's ``bmat`` took 1.3 ms of a
        2 ms start at n = 100)."""
        Hm, p, n = self._Hm, self.p, self.n
        H = Hm.tocoo()
        keep = H.row <= H.col if upper else np.ones(H.nnz, dtype=bool)
        A = self._A.tocoo()
        ka = -(3.0 + np.arange(A.nnz))      # A's CSR order: the coo keeps it
        rows = [H.row[keep], A.col, np.arange(n, n + p)]
        cols = [H.col[keep], n + A.row, np.arange(n, n + p)]
        vals = [H.data[keep], ka, np.full(p, -2.0)]
        if not upper:
            rows.append(n + A.row)
            cols.append(A.col)
            vals.append(ka)
        size = n + p
        return sp.csc_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                             shape=(size, size))

    def _slots_of(self, marker: sp.csc_matrix) -> tuple:
        marker.sort_indices()
        m = marker.data
        from_h = np.flatnonzero(m > 0)
        base = np.zeros(m.size)
        in_a = np.flatnonzero(m <= -3.0)
        if in_a.size:
            base[in_a] = self._A.data[(-m[in_a] - 3.0).astype(np.int64)]
        return (marker.indptr, marker.indices, from_h, (m[from_h] - 1.0).astype(np.int64),
                np.flatnonzero(m == -2.0), base)

    def h_values(self, phi: np.ndarray, Hx: np.ndarray) -> np.ndarray:
        """``H``'s entries on the fixed pattern."""
        if self.T is not None:
            hdata = self.T @ phi
        else:
            P = (self._RT @ sp.diags(phi) @ self._R).tocoo()
            keys = P.col.astype(np.int64) * self.n + P.row
            pos = np.minimum(np.searchsorted(self._uniq, keys), self._uniq.size - 1)
            ok = self._uniq[pos] == keys      # entries of |R|^T |R| that underflowed are ~0
            hdata = np.bincount(pos[ok], weights=P.data[ok], minlength=self._uniq.size)
        hdata[self.h_diag] += Hx
        return hdata

    def h_matrix(self, hdata: np.ndarray) -> sp.csc_matrix:
        return sp.csc_matrix((hdata, self.h_indices, self.h_indptr), shape=(self.n, self.n))

    def kkt(self, hdata: np.ndarray, dreg: float, upper: bool = False) -> sp.csc_matrix:
        """``[-H  A^T; A  d I]`` with ``H.data = hdata``; its upper triangle if ``upper``.
        The upper one is the same matrix object each call, its values overwritten (its
        pattern fixed: QDLDL's update sees the same arrays)."""
        if upper not in self._slots:
            self._slots[upper] = self._slots_of(self._marker(upper))
        indptr, indices, from_h, h_of, at_dreg, base = self._slots[upper]
        size = self.n + self.p
        if upper:
            K = self._upper
            if K is None:
                K = self._upper = sp.csc_matrix((base.copy(), indices, indptr), shape=(size, size))
            data = K.data
        else:
            data = base.copy()
        data[from_h] = -hdata[h_of]
        data[at_dreg] = dreg
        return K if upper else sp.csc_matrix((data, indices, indptr), shape=(size, size))

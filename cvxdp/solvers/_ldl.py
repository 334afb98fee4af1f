"""A QDLDL factorisation reused across matrices of one sparsity pattern.

Interior-point steps factorise a matrix whose values change every iteration and whose pattern
rarely does; QDLDL's symbolic analysis (elimination tree, column counts) is then done once and
``update`` refactors the values.  A pattern that changes (entries cancelling to structural
zeros after a sum) gets a new analysis.
"""
from __future__ import annotations

import numpy as np
import qdldl
import scipy.sparse as sp

__all__ = ["PatternLDL"]


class PatternLDL:
    """``factor(K)`` then ``solve(rhs)``; ``factor`` raises qdldl's ``ValueError`` /
    ``RuntimeError`` on a zero pivot, as ``qdldl.Solver`` does."""

    def __init__(self) -> None:
        self._solver = None
        self._pattern: tuple[bytes, bytes] | None = None
        self._arrays: tuple = (None, None)

    def factor(self, K: sp.csc_matrix, upper: bool = False) -> None:
        """``K`` whole, or its upper triangle when ``upper`` (qdldl then skips its own
        ``triu``, a third of an update's time on small systems)."""
        K.sort_indices()
        if self._solver is not None and K.indptr is self._arrays[0] and K.indices is self._arrays[1]:
            self._solver.update(K, upper=upper)     # the same pattern arrays: no comparison
            return
        pattern = (K.indptr.tobytes(), K.indices.tobytes())
        self._arrays = (K.indptr, K.indices)
        if self._solver is None or pattern != self._pattern:
            self._solver, self._pattern = None, None    # nothing stale if the analysis fails
            self._solver, self._pattern = qdldl.Solver(K, upper=upper), pattern
        else:
            self._solver.update(K, upper=upper)

    def reset(self) -> None:
        """Forget the factorisation (after a failed one)."""
        self._solver, self._pattern, self._arrays = None, None, (None, None)

    def solve(self, rhs):
        return self._solver.solve(rhs)

    def flops(self) -> float:
        """Multiply-adds of the current factorisation, ``sum_j c_j^2`` over ``L``'s column
        counts: what the fill made of the pattern."""
        L = sp.csc_matrix(self._solver.factors()[0])
        counts = np.diff(L.indptr).astype(float)
        return float(counts @ counts)

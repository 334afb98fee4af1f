"""Linear queries of a solved model's variables, as one matrix over their stacked values.

``z`` stacks the variables of the problem (``prob.variables()`` order), each in cvxpy's
column-major order (what :class:`cvxdp.recognise.affine.Linearizer` uses).  A query set is
``values = Q z + c`` with ``Q`` sparse, plus the shape the values are reported in:

* ``None``: every entry of every variable (one variable: its own shape, numpy's C order, as
  ``x.value``; several: their C-order entries one after the other);
* a matrix with one column per entry of the variables (C order, as ``x.value.ravel()`` and a
  :class:`cvxdp.Measurement`'s queries read them; several variables concatenated);
* an affine cvxpy expression of the variables (its own shape);
* a callable ``f(prob) -> array`` (bootstrap only: evaluated after every re-solve).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import cvxpy as cp
import numpy as np
import scipy.sparse as sp

from ..recognise.affine import Linearizer

__all__ = ["QuerySet", "query_set", "stacked_values"]


@dataclass
class QuerySet:
    """``Q`` ``(k, N)`` over the stacked column-major values (``None`` for a callable),
    ``c`` ``(k,)``, the reported ``shape`` and ``order``, and ``func`` for a callable."""

    Q: sp.csr_matrix | None
    c: np.ndarray
    shape: tuple
    order: str = "C"
    func: Callable | None = None
    identity: bool = False          # every entry of the variables, once each

    def values(self, prob: cp.Problem, z: np.ndarray) -> np.ndarray:
        """The query values at stacked values ``z`` (flat, in report order)."""
        if self.func is not None:
            return np.asarray(self.func(prob), dtype=float).ravel()
        return self.Q @ z + self.c

    def shaped(self, flat: np.ndarray) -> np.ndarray:
        if self.func is not None:
            return flat
        return np.asarray(flat).reshape(self.shape, order=self.order)


def stacked_values(variables: list) -> np.ndarray:
    """The variables' values, stacked column-major (``ValueError`` if one has none)."""
    parts = []
    for v in variables:
        if v.value is None:
            raise ValueError(f"error_bars: variable {v.name()} has no value: solve the problem first")
        parts.append(np.asarray(v.value, dtype=float).ravel(order="F"))
    return np.concatenate(parts) if parts else np.zeros(0)


def _c_to_f(variables: list) -> np.ndarray:
    """``idx`` with ``z_C = z_F[idx]``: C-order stacked entries in the column-major stack."""
    out, off = [], 0
    for v in variables:
        pos = np.arange(v.size).reshape(v.shape, order="F") if v.shape else np.zeros((), int)
        out.append(off + np.asarray(pos).ravel(order="C"))
        off += v.size
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def query_set(queries, variables: list) -> QuerySet:
    """The :class:`QuerySet` of the module docstring; ``ValueError`` naming what is wrong."""
    N = sum(v.size for v in variables)
    idx = _c_to_f(variables)
    if queries is None:
        Q = sp.csr_matrix((np.ones(N), (np.arange(N), idx)), shape=(N, N))
        shape = variables[0].shape if len(variables) == 1 else (N,)
        return QuerySet(Q, np.zeros(N), shape, identity=True)
    if callable(queries) and not isinstance(queries, cp.Expression):
        return QuerySet(None, np.zeros(0), (), func=queries)
    if isinstance(queries, cp.Expression):
        if not queries.is_affine():
            raise ValueError(f"error_bars: queries must be affine in the variables, got {queries}")
        known = {v.id for v in variables}
        stray = [v.name() for v in queries.variables() if v.id not in known]
        if stray:
            raise ValueError(f"error_bars: queries read variable {stray[0]}, which is not in "
                             "the problem")
        M, c = Linearizer(variables)(queries)
        return QuerySet(sp.csr_matrix(M), c, queries.shape, order="F")
    if sp.issparse(queries):
        Qc = sp.csr_matrix(queries, dtype=float, copy=True)
    else:
        try:
            arr = np.asarray(queries, dtype=float)
        except (TypeError, ValueError):
            raise ValueError("error_bars: queries must be None, a matrix, an affine cvxpy "
                             f"expression or a callable, got {type(queries).__name__}") from None
        if arr.ndim == 1:
            arr = arr[None, :]
        if arr.ndim != 2:
            raise ValueError(f"error_bars: a query matrix must be 2-D, got shape {arr.shape}")
        Qc = sp.csr_matrix(arr)
    if Qc.shape[1] != N:
        raise ValueError(f"error_bars: the query matrix has {Qc.shape[1]} columns; the "
                         f"variables have {N} entries")
    if not np.all(np.isfinite(Qc.data)):
        bad = int(np.flatnonzero(~np.isfinite(Qc.data))[0])
        raise ValueError(f"error_bars: the query matrix has a non-finite entry (stored entry {bad})")
    Qf = Qc.copy()
    Qf.indices = idx[Qf.indices].astype(Qf.indices.dtype)
    Qf = sp.csr_matrix(Qf)
    Qf.sort_indices()
    return QuerySet(Qf, np.zeros(Qc.shape[0]), (Qc.shape[0],))

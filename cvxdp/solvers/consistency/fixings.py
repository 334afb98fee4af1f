"""Equality rows that fix one coordinate each, solved as bounds beside a forest.

A row ``a_r x_j = b_r`` is the bound ``b_r / a_r <= x_j <= b_r / a_r``.  When the other rows
of ``A x = b`` state forest consistency, moving the fixing rows into the bounds lets the
separable splitting project onto the forest in ``O(n)`` (:class:`~.affine.ForestProjector`)
instead of factorising ``A A^T``.  The case that needs it: OpenDP's b-ary tree
(``cvxdp.workloads.hierarchy(n, k, layout="opendp")``) keeps every internal level complete,
so a node of the level above the leaves right of the last cell has no children and its
consistency row is ``x_p = 0``.

Multipliers.  In cvxpy's Lagrangian ``y^T (A x - b) + s_lo^T (l - x) + s_up^T (x - u)`` the
coordinate ``j`` sees ``a_r y_r - s_lo_j + s_up_j`` from the fixing row and its bounds, so
``y_r = (s_up_j - s_lo_j) / a_r`` with both bound multipliers set to zero is a multiplier of
the original problem (stationarity, complementarity and the Lagrangian's value unchanged);
a second row fixing the same coordinate gets zero.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
import scipy.sparse as sp

from .. import result as R
from ..result import SolverResult
from ..tree.forest import forest_from_rows
from .problem import ConsistencyData, memoised

__all__ = ["Fixings", "find", "solve"]


@dataclass
class Fixings:
    """The rows of ``A`` that fix one coordinate (``rows``, their coordinate ``cols`` and
    coefficient ``coef``) and the others (``keep``, forest consistency)."""

    rows: np.ndarray
    cols: np.ndarray
    coef: np.ndarray
    keep: np.ndarray


def find(data: ConsistencyData) -> Fixings | None:
    """The fixing rows when ``A x = b`` is not a forest but is one without them (and some
    row is left), else ``None``; read once per problem."""
    if not data.has_eq or data.has_chains or data.forest_rows() is not None:
        return None
    return memoised(data, "fixings", _find)


def _find(data: ConsistencyData) -> Fixings | None:
    A = sp.csr_matrix(data.A, copy=True)     # cleaned in place: never the caller's arrays
    A.sum_duplicates()
    A.eliminate_zeros()
    nnz = np.diff(A.indptr)
    one = nnz == 1
    keep = np.flatnonzero(~one)
    if not one.any() or keep.size == 0 or np.any(nnz == 0):
        return None
    if forest_from_rows(A[keep], np.asarray(data.b, dtype=float)[keep]) is None:
        return None
    rows = np.flatnonzero(one)
    start = A.indptr[rows]
    return Fixings(rows, A.indices[start], A.data[start], keep)


def solve(data: ConsistencyData, fx: Fixings, settings, x0, state,
          inner: Callable[..., SolverResult]) -> SolverResult:
    """Solve ``data`` with the fixing rows as bounds by ``inner`` (the ADMM's ``solve``),
    the multipliers mapped back to the rows (module docstring)."""
    value = np.asarray(data.b, dtype=float)[fx.rows] / fx.coef
    lower, upper = data.lower.copy(), data.upper.copy()
    np.maximum.at(lower, fx.cols, value)
    np.minimum.at(upper, fx.cols, value)
    if np.any(lower > upper):
        j = int(np.flatnonzero(lower > upper)[0])
        return SolverResult(x=None, status=R.INFEASIBLE, objective=math.inf,
                            info={"reason": f"equality rows fix coordinate {j} outside its "
                                            f"bounds [{data.lower[j]}, {data.upper[j]}] (or at "
                                            "two values)", "route": "none (fixings)"})
    reduced = replace(data, A=data.A[fx.keep], b=np.asarray(data.b, dtype=float)[fx.keep],
                      lower=lower, upper=upper, forest_hint=None)
    res = inner(reduced, settings, x0=x0, state=state)
    if res.duals and "eq" in res.duals:
        res.duals = _row_multipliers(data, fx, res.duals)
    return res


def _row_multipliers(data: ConsistencyData, fx: Fixings, duals: dict) -> dict:
    """The reduced problem's multipliers as the original's (module docstring)."""
    out = dict(duals)
    y = np.zeros(data.A.shape[0])
    y[fx.keep] = np.asarray(duals["eq"], dtype=float)
    s_lo = np.array(duals["lower"], dtype=float)
    s_up = np.array(duals["upper"], dtype=float)
    cols, first = np.unique(fx.cols, return_index=True)
    y[fx.rows[first]] = (s_up[cols] - s_lo[cols]) / fx.coef[first]
    s_lo[cols] = 0.0
    s_up[cols] = 0.0
    out["eq"], out["lower"], out["upper"] = y, s_lo, s_up
    return out

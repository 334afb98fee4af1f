"""Equality rows that fix coordinates, substituted out before a forest is solved.

A row of ``A x = b`` with one entry ``a_r x_j = b_r`` fixes ``x_j = b_r / a_r``; so does a
bound ``l_j = u_j``.  Substituting the fixed values (``b -= A_F v``, ``y -= M_F v``) may leave
further rows with one entry (a parent all of whose children were fixed) or none (``0 = 0``):
the substitution is repeated until every row left has two entries or more.  When those rows
are forest consistency and the loss is separable, the problem left is a forest over the free
coordinates, which the ADMM's O(n) tree projection solves in tens of iterations.  The case
that needs it: OpenDP's b-ary tree (``cvxdp.workloads.hierarchy(n, k, layout="opendp")``)
keeps every internal level complete, so nodes right of the last leaf have no children
(``x_p = 0``), and above them nodes all of whose children are such nodes.  With 10,000
leaves and branching 4 that is 1,596 rows; held as bounds ``l = u`` beside the forest
(:mod:`~cvxdp.solvers.consistency.fixings`) they took a squared loss's ADMM 2,611
iterations, where the same tree without them takes 41.

Multipliers, in cvxpy's Lagrangian ``phi(M x - y) + y_A^T (A x - b) + s_lo^T (l - x) +
s_up^T (x - u)``: stationarity at a coordinate ``j`` reads ``(M^T w)_j + (A^T y_A)_j - s_lo_j
+ s_up_j = 0``.  The rows left keep the small problem's multipliers, a row left empty gets 0,
and a row that fixed ``x_j`` (free in the multiplier's sign) takes what stationarity at ``j``
leaves, ``y_r = -((M^T w)_j + sum_{r' != r} A_r'j y_r') / a_r``, with ``s = 0`` at ``j``: the
rows are visited from the last substitution back to the first, so every other row through
``j`` is known by then (a row fixed in an earlier round holds no coordinate fixed later).
A coordinate fixed by its bounds keeps ``s_lo - s_up`` of stationarity.  ``w`` on the rows
of fixed coordinates is the loss's slope there (a separable loss: those rows read no other
coordinate).  The result is then certified on the whole problem
(:func:`~cvxdp.solvers.consistency.certify.certify`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
import scipy.sparse as sp

from .. import result as R
from ..result import SolverResult
from .certify import certify
from .problem import ConsistencyData

__all__ = ["Substitution", "substitute", "solve"]


@dataclass
class Substitution:
    """The fixed coordinates (``fixed``, their values ``value``), the rows that fixed them
    by rounds (``rounds``: ``(rows, cols, coef)`` each), the rows left empty (``empty``) and
    those left (``rows``) with their right-hand side ``b`` after substitution."""

    fixed: np.ndarray
    value: np.ndarray
    rounds: list
    empty: np.ndarray
    rows: np.ndarray
    b: np.ndarray


def substitute(data: ConsistencyData, tol: float) -> Substitution | None:
    """The substitution of the module docstring, or ``None`` when a row fixes a coordinate
    outside its bounds or two rows disagree by more than ``tol`` (the caller's route says
    so), or nothing is fixed."""
    A = sp.csr_matrix(data.A, copy=True)        # cleaned in place: never the caller's arrays
    A.sum_duplicates()
    A.eliminate_zeros()
    b = np.asarray(data.b, dtype=float)
    fixed = data.lower == data.upper
    value = np.where(fixed, data.lower, 0.0)
    alive = np.ones(A.shape[0], dtype=bool)
    pattern = A.copy()
    pattern.data[:] = 1.0
    rounds = []
    while True:
        free_count = pattern @ (~fixed).astype(float)
        rest = b - A @ value
        one = np.flatnonzero(alive & (free_count == 1))
        if one.size == 0:
            break
        Af = A[one].multiply((~fixed)[None, :]).tocsr()
        Af.eliminate_zeros()
        cols = Af.indices[Af.indptr[:-1]]
        coef = Af.data[Af.indptr[:-1]]
        cols, first = np.unique(cols, return_index=True)   # two rows fixing one: the 2nd checks
        one, coef = one[first], coef[first]
        v = rest[one] / coef
        if np.any(v < data.lower[cols] - tol) or np.any(v > data.upper[cols] + tol):
            return None
        fixed[cols] = True
        value[cols] = v
        alive[one] = False
        rounds.append((one, cols, coef))
    empty = np.flatnonzero(alive & (free_count == 0))
    if np.any(np.abs(rest[empty]) > tol * (1.0 + np.abs(b[empty]))) or not fixed.any():
        return None
    alive[empty] = False
    rows = np.flatnonzero(alive)
    return Substitution(fixed, value, rounds, empty, rows, rest[rows])


def solve(data: ConsistencyData, settings, x0, state,
          inner: Callable[..., SolverResult]) -> SolverResult | None:
    """Solve ``data`` by ``inner`` (the ADMM's ``solve``) on the coordinates the
    substitution leaves free, when the loss is separable and the rows left are a forest;
    ``None`` when that does not apply."""
    if data.separable_loss() is None or not data.has_eq or data.has_chains:
        return None
    sub = substitute(data, settings.eps_abs)
    if sub is None or sub.rows.size == 0 or sub.fixed.all():
        return None
    free = np.flatnonzero(~sub.fixed)
    M = data.M.tocsc()
    v = sub.value[sub.fixed]
    small = replace(data, n=free.size, M=M[:, free].tocsr(), y=data.y - M[:, sub.fixed] @ v,
                    lower=data.lower[free], upper=data.upper[free],
                    A=data.A.tocsr()[sub.rows][:, free], b=sub.b,
                    forest_hint=None, lift=None, lazy_lift=False, shape=None)
    if small.forest_rows() is None:            # (memoised: the ADMM's projection reads it)
        return None
    res = inner(small, settings, x0=None if x0 is None else np.asarray(x0, float)[free],
                state=state)
    if res.x is None:
        return res
    x = sub.value.copy()
    x[free] = res.x
    res.x = x
    if res.duals and "eq" in res.duals:
        res.duals = _multipliers(data, sub, free, res.duals)
    res.info["substituted"] = int(sub.fixed.sum())
    if res.status in R.SOLUTION_PRESENT:
        res = certify(data, res, settings, None)
    return res


def _multipliers(data: ConsistencyData, sub: Substitution, free: np.ndarray, duals: dict) -> dict:
    """The small problem's multipliers as ``data``'s (module docstring)."""
    out = dict(duals)
    A = data.A.tocsr()
    y = np.zeros(A.shape[0])
    y[sub.rows] = np.asarray(duals["eq"], dtype=float)
    s_lo, s_up = np.zeros(data.n), np.zeros(data.n)
    s_lo[free] = np.asarray(duals["lower"], dtype=float)
    s_up[free] = np.asarray(duals["upper"], dtype=float)
    M = data.M.tocsr()
    r = M @ sub.value - data.y                # right on the rows of fixed coordinates
    g = M.T @ (data.w2 * r + data.w1 * np.sign(r))
    AT = A.T.tocsr()
    for rows, cols, coef in reversed(sub.rounds):
        y[rows] = -(g[cols] + AT[cols] @ y) / coef
    by_bounds = data.lower == data.upper
    c = g[by_bounds] + AT[by_bounds] @ y
    s_lo[by_bounds], s_up[by_bounds] = np.maximum(c, 0.0), np.maximum(-c, 0.0)
    out["eq"], out["lower"], out["upper"] = y, s_lo, s_up
    return out

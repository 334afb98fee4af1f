"""Exact checks of the consistency problem by linear programs (HiGHS).

* :func:`constraints_feasible`: are ``A x = b``, the bounds and the order chains
  feasible at all (an LP with zero cost)?
* :func:`kkt_dual_lp`: multipliers satisfying the KKT conditions of
  :mod:`cvxdp.solvers.consistency.kkt` at a given ``x`` (a feasibility LP over the
  multipliers, active sets read off ``x``).
* :func:`dual_bound_lp`: the best Lagrangian lower bound with the multipliers of the
  smooth loss rows fixed at their gradient at ``x`` (an LP over the rest).

Each returns ``None`` when the LP is too large or HiGHS is inconclusive.
"""
from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp

from .kkt import (constraint_gradient, has_chains, has_eq, kkt_scale, lagrangian_bound,
                       loss_intervals, order_matrix, split_order)

__all__ = ["lp_size", "LP_MAX_NNZ", "constraints_feasible", "kkt_dual_lp", "dual_bound_lp"]

# Exact checks with HiGHS (feasibility of the constraints alone; KKT multipliers for a
# given point) are run on problems up to this many nonzeros.
LP_MAX_NNZ = 2_000_000
# Largest LP (rows + columns) solved to find certified multipliers for a given x.
_KKT_LP_MAX = 100_000
# HiGHS feasibility tolerances: the multipliers must be stationary to rounding error.
_HIGHS_OPTIONS = {"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10}
# A bound LP solution counts only if stationary to this (relative to the slopes).
_BOUND_LP_STATIONARITY = 1e-8


def lp_size(data) -> int:
    """Nonzeros of the constraint data, the measure :data:`LP_MAX_NNZ` limits."""
    nnz = data.M.nnz + data.n
    if data.A is not None:
        nnz += data.A.nnz
    return nnz


def _linprog(*args, **kwargs):
    """HiGHS, or ``None`` when scipy refuses the LP (too large, malformed bounds)."""
    from scipy.optimize import linprog

    try:
        return linprog(*args, method="highs", **kwargs)
    except (ValueError, MemoryError):
        return None


def constraints_feasible(data) -> bool | None:
    """Exact feasibility of the constraints alone (``A x = b``, bounds, order chains) by
    HiGHS: ``True``/``False``, or ``None`` when the LP is too large or inconclusive."""
    if lp_size(data) > LP_MAX_NNZ:
        return None
    eq = has_eq(data)
    lo = np.where(np.isfinite(data.lower), data.lower, None)
    hi = np.where(np.isfinite(data.upper), data.upper, None)
    D = order_matrix(data.chains, data.n) if has_chains(data) else None
    res = _linprog(np.zeros(data.n), A_eq=data.A if eq else None, b_eq=data.b if eq else None,
                   A_ub=D, b_ub=np.zeros(D.shape[0]) if D is not None else None,
                   bounds=list(zip(lo.tolist(), hi.tolist())))
    if res is None:
        return None
    return {2: False, 0: True}.get(res.status)


def _bound_columns(n: int, idx: np.ndarray, sign: float) -> sp.csr_matrix:
    """``n x |idx|`` columns ``sign * e_i`` for the bound multipliers of ``idx``."""
    return sp.csr_matrix((sign * np.ones(idx.size), (idx, np.arange(idx.size))), shape=(n, idx.size))


def kkt_dual_lp(data, x: np.ndarray, eps_abs: float):
    """Multipliers satisfying the KKT conditions at ``x`` exactly (to the LP's
    tolerance) with the active sets read off ``x`` (within ``eps_abs``); ``None`` if
    there are none (``x`` is not optimal to this accuracy) or the LP is too large.
    Returns ``(duals, w)``; the LP is scaled by the loss slopes."""
    n = data.n
    M = data.M.tocsr()
    m = M.shape[0]
    A = data.A if has_eq(data) else sp.csr_matrix((0, n))
    p = A.shape[0]
    at_lo = np.flatnonzero(np.isfinite(data.lower) & (x <= data.lower + eps_abs))
    at_up = np.flatnonzero(np.isfinite(data.upper) & (x >= data.upper - eps_abs))
    D = order_matrix(data.chains, n) if has_chains(data) else sp.csr_matrix((0, n))
    tight = np.flatnonzero(-(D @ x) <= eps_abs)
    nv = m + p + at_lo.size + at_up.size + tight.size
    if nv + n > _KKT_LP_MAX:
        return None
    scale = kkt_scale(data, x)
    lo, hi = loss_intervals(data, x, eps_abs)
    Aeq = sp.hstack([M.T, A.T, _bound_columns(n, at_lo, -1.0), _bound_columns(n, at_up, 1.0),
                     D[tight].T]).tocsc()
    bounds = np.empty((nv, 2))
    bounds[:m, 0], bounds[:m, 1] = lo / scale, hi / scale
    bounds[m:m + p] = (-np.inf, np.inf)
    bounds[m + p:] = (0.0, np.inf)
    bounds = np.where(np.isinf(bounds), None, bounds)
    res = _linprog(np.zeros(nv), A_eq=Aeq, b_eq=np.zeros(n), bounds=bounds.tolist(),
                   options=_HIGHS_OPTIONS)
    if res is None or res.status != 0 or res.x is None:
        return None
    z = res.x * scale
    w = np.clip(z[:m], lo, hi)
    duals = {"lower": np.zeros(n), "upper": np.zeros(n)}
    k = m + p
    duals["lower"][at_lo] = np.maximum(z[k:k + at_lo.size], 0.0)
    k += at_lo.size
    duals["upper"][at_up] = np.maximum(z[k:k + at_up.size], 0.0)
    k += at_up.size
    if p:
        duals["eq"] = z[m:m + p]
    if has_chains(data):
        o = np.zeros(D.shape[0])
        o[tight] = np.maximum(z[k:], 0.0)
        duals["order"] = split_order(data.chains, o)
    return duals, w


def dual_bound_lp(data, x: np.ndarray, eps_abs: float):
    """A certified lower bound from an LP over the multipliers, for a near-optimal ``x``.

    The loss multipliers of smooth rows are fixed at the gradient at ``x`` (elastic-net
    and squared rows away from their kink); those of pure-L1 rows and of elastic-net
    rows at a kink are LP variables in ``[-w1, w1]``, where ``phi^*`` vanishes.  Over
    these, ``yA``, ``o >= 0`` and the bound multipliers, HiGHS maximizes the Lagrangian
    dual value subject to exact stationarity.  Any feasible point is a lower bound
    (weak duality); at the LP optimum it is the best one with the fixed part.
    Returns ``(bound, duals, w)`` or ``None``."""
    n = data.n
    M = data.M.tocsr()
    r = M @ x - data.y
    w1, w2 = data.w1, data.w2
    rowsum = np.asarray(abs(M).sum(axis=1)).ravel()
    kink = (w1 > 0) & (np.abs(r) <= eps_abs * np.maximum(rowsum, 1.0))
    var = (w1 > 0) & ((w2 == 0) | kink)
    u_fix = np.where(~var, w2 * r + w1 * np.sign(r), 0.0)
    A = data.A if has_eq(data) else sp.csr_matrix((0, n))
    D = order_matrix(data.chains, n) if has_chains(data) else sp.csr_matrix((0, n))
    i_lo = np.flatnonzero(np.isfinite(data.lower))
    i_up = np.flatnonzero(np.isfinite(data.upper))
    iv = np.flatnonzero(var)
    sizes = (iv.size, A.shape[0], D.shape[0], i_lo.size, i_up.size)
    if sum(sizes) + n > _KKT_LP_MAX:
        return None
    scale = kkt_scale(data, x)
    Aeq = sp.hstack([M.T[:, iv] if iv.size else sp.csr_matrix((n, 0)), A.T, D.T,
                     _bound_columns(n, i_lo, -1.0), _bound_columns(n, i_up, 1.0)]).tocsc()
    beq = -(M.T @ u_fix) / scale
    # maximize -u_v^T y_v - b^T yA + l^T s_lo - u^T s_up  ->  minimize the negative
    cost = np.r_[data.y[iv], data.b if sizes[1] else np.zeros(0), np.zeros(sizes[2]),
                 -data.lower[i_lo], data.upper[i_up]]
    bounds = [(-w1[i] / scale, w1[i] / scale) for i in iv] + [(None, None)] * sizes[1] \
        + [(0, None)] * (sizes[2] + sizes[3] + sizes[4])
    res = _linprog(cost, A_eq=Aeq, b_eq=beq, bounds=bounds, options=_HIGHS_OPTIONS)
    if res is None or res.status != 0 or res.x is None:
        return None
    duals, w = _bound_lp_multipliers(data, res.x * scale, u_fix, iv, sizes, i_lo, i_up)
    bound = lagrangian_bound(data, duals, w)
    stat = float(np.max(np.abs(M.T @ w + constraint_gradient(data, duals)), initial=0.0)) / scale
    if not math.isfinite(bound) or stat > _BOUND_LP_STATIONARITY:
        return None
    return bound, duals, w


def _bound_lp_multipliers(data, z, u_fix, iv, sizes, i_lo, i_up):
    """Unpack the LP solution ``z`` of :func:`dual_bound_lp` into ``(duals, w)``."""
    n = data.n
    n_var, p, k = sizes[0], sizes[1], sizes[2]
    w = u_fix.copy()
    w[iv] = np.clip(z[:n_var], -data.w1[iv], data.w1[iv])
    j = n_var
    duals = {"lower": np.zeros(n), "upper": np.zeros(n)}
    if p:
        duals["eq"] = z[j:j + p]
    j += p
    if k:
        duals["order"] = split_order(data.chains, np.maximum(z[j:j + k], 0.0))
    j += k
    duals["lower"][i_lo] = np.maximum(z[j:j + i_lo.size], 0.0)
    j += i_lo.size
    duals["upper"][i_up] = np.maximum(z[j:j + i_up.size], 0.0)
    return duals, w

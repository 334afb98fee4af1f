"""KKT conditions of the consistency problem and the Lagrangian bound of multipliers.

Multipliers are those of cvxpy's Lagrangian
    phi(M x - y) + yA^T (A x - b) + s_lo^T (l - x) + s_up^T (x - u) + o^T (D x)
(``D x <= 0`` the order edges ``x[c_j] - x[c_{j+1}] <= 0``); with the loss multiplier
``w`` (one per loss row) stationarity reads
    M^T w + A^T yA - s_lo + s_up + D^T o = 0,   w_i in d phi_i((M x - y)_i),
plus s, o >= 0 and complementarity.  Weak duality then gives the lower bound
    -sum phi_i^*(w_i) - w^T y - yA^T b + s_lo^T l - s_up^T u .

These are what :func:`cvxdp.solvers.consistency.admm.solve` certifies before it returns ``duals``.
"""
from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from ..result import ROUNDING
from .losses import SeparableLoss

__all__ = ["kkt_scale", "loss_intervals", "order_matrix", "split_order", "has_eq", "has_chains",
           "constraint_gradient", "separable_loss_multiplier", "kkt_check", "lagrangian_bound",
           "exact_dual_point"]

# A residual within this many eps_abs (times the row's 1-norm) counts as a kink, a
# coordinate within eps_abs of a bound as on it.
_KINK_FACTOR = 1.0
# Stationarity is required to this accuracy, relative to the size of the multipliers.
_STATIONARITY_RTOL = 1e-7
# A stationarity residual this small (relative to the multipliers) on a coordinate without
# bounds is rounding, not a direction along which the Lagrangian falls.
_ROUNDING_RESIDUAL = 1e-12
# The multipliers' Lagrangian bound may trail the objective by this many eps_rel: one, the
# contract (duals are written only if they certify the gap eps_rel themselves).
_LAGRANGIAN_GAP_FACTOR = 1.0
# A pure-L1 row's multiplier may move when this far (relative) inside [-w1, w1].
_L1_INTERIOR = 1e-9
# LSQR iterations for the loss multipliers' correction (it removes a rounding residual).
_LSQR_ITERS = 500


def kkt_scale(data, x) -> float:
    """Size of the multipliers: the loss slopes at ``x``."""
    r = data.M @ x - data.y
    slopes = np.abs(data.w1) + np.abs(data.w2 * r)
    return max(float(np.max(slopes, initial=0.0)), 1e-300)


def loss_intervals(data, x, tau: float):
    """``[lo_i, hi_i]``: the subdifferential of ``phi_i`` at ``r_i = (M x - y)_i``, a
    residual within ``tau * |M_i|_1`` of zero counting as a kink."""
    M = data.M.tocsr()
    r = M @ x - data.y
    rowsum = np.asarray(abs(M).sum(axis=1)).ravel()
    kink = (data.w1 > 0) & (np.abs(r) <= _KINK_FACTOR * tau * np.maximum(rowsum, 1.0))
    smooth = data.w2 * r + data.w1 * np.sign(r)
    lo = np.where(kink, data.w2 * r - data.w1, smooth)
    hi = np.where(kink, data.w2 * r + data.w1, smooth)
    return lo, hi


def order_matrix(chains, n):
    """``D`` with one row per order edge ``x[c_j] - x[c_{j+1}] <= 0`` (chain by chain)."""
    rows, cols, vals = [], [], []
    k = 0
    for c in chains.chains:
        e = c.size - 1
        idx = np.arange(k, k + e)
        rows += [idx, idx]
        cols += [c[:-1], c[1:]]
        vals += [np.ones(e), -np.ones(e)]
        k += e
    if k == 0:
        return sp.csr_matrix((0, n))
    return sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(k, n))


def split_order(chains, o):
    out, k = [], 0
    for c in chains.chains:
        out.append(o[k:k + c.size - 1])
        k += c.size - 1
    return out


def has_eq(data) -> bool:
    return data.A is not None and data.A.shape[0] > 0


def has_chains(data) -> bool:
    return data.chains is not None and bool(data.chains.chains)


def constraint_gradient(data, duals):
    """``A^T yA - s_lo + s_up + D^T o`` (``None`` if a needed key is missing)."""
    n = data.n
    c = np.zeros(n)
    if has_eq(data):
        if "eq" not in duals:
            return None
        c += data.A.T @ np.asarray(duals["eq"], float)
    if "lower" not in duals or "upper" not in duals:
        return None
    c -= np.asarray(duals["lower"], float)
    c += np.asarray(duals["upper"], float)
    if has_chains(data):
        if "order" not in duals:
            return None
        c += order_matrix(data.chains, n).T @ np.concatenate(
            [np.asarray(o, float) for o in duals["order"]] or [np.zeros(0)])
    return c


def separable_loss_multiplier(data, c):
    """``w`` with ``M^T w = -c`` when every loss row has one entry and no column two.

    A row without an entry (a query that counts nothing, e.g. an empty node of OpenDP's
    tree) is absent from ``M^T w``; its ``w`` is the loss's gradient at the residual
    ``-y``, which the subgradient condition asks for."""
    M = data.M.tocsr()
    nnz = np.diff(M.indptr)
    r = -np.asarray(data.y, dtype=float)
    w = data.w2 * r + data.w1 * np.sign(r)
    rows = np.flatnonzero(nnz == 1)
    cols = M.indices[M.indptr[rows]]
    w[rows] = -c[cols] / M.data[M.indptr[rows]]
    return w


def kkt_check(data, x, duals, w, eps_abs: float, eps_rel: float) -> dict:
    """Largest violation of each KKT condition at ``x`` for ``(duals, w)``, relative
    to the multipliers' size, and whether all are within tolerance (``ok``)."""
    out = {"ok": False}
    c = constraint_gradient(data, duals)
    if c is None or w is None or not np.all(np.isfinite(c)) or not np.all(np.isfinite(w)):
        out["reason"] = "missing or non-finite multipliers"
        return out
    scale = max(kkt_scale(data, x), float(np.max(np.abs(c), initial=0.0)))
    # a residual is known to eps_abs and to its rounding (the contract's floor, 1e-12 of its
    # terms): at counts of 4e10 the residuals' rounding, 4e-6, put kinks "off" by 2e-6 and
    # left a certified answer without duals (the stress set's seed 29)
    tau = eps_abs + ROUNDING * max(float(np.max(np.abs(x), initial=0.0)),
                                          float(np.max(np.abs(data.y), initial=0.0)))
    lo, hi = loss_intervals(data, x, tau)
    stat = float(np.max(np.abs(data.M.T @ w + c), initial=0.0)) / scale
    sub = float(np.max(np.maximum(lo - w, w - hi), initial=0.0)) / scale
    s_lo, s_up = np.asarray(duals["lower"], float), np.asarray(duals["upper"], float)
    neg = float(max(np.max(-s_lo, initial=0.0), np.max(-s_up, initial=0.0)))
    off_lo = s_lo[(x > data.lower + tau) | np.isinf(data.lower)]
    off_up = s_up[(x < data.upper - tau) | np.isinf(data.upper)]
    comp = float(max(np.max(np.abs(off_lo), initial=0.0), np.max(np.abs(off_up), initial=0.0)))
    if has_chains(data):
        o = np.concatenate([np.asarray(v, float) for v in duals["order"]] or [np.zeros(0)])
        D = order_matrix(data.chains, data.n)
        slack = -(D @ x)
        neg = max(neg, float(np.max(-o, initial=0.0)))
        comp = max(comp, float(np.max(np.abs(o[slack > tau]), initial=0.0)))
    out.update(stationarity=stat, subdifferential=sub, sign=neg / scale, complementarity=comp / scale)
    # a residual known to eps_abs gives a squared loss's multiplier to w2 eps_abs |M_i|_1
    rowsum = np.asarray(abs(data.M).sum(axis=1)).ravel()
    floor = tau * float(np.max(data.w2 * rowsum, initial=0.0)) / scale
    tol = max(_STATIONARITY_RTOL, eps_rel)
    # and the multipliers must certify: the Lagrangian bound of an exactly dual-feasible
    # version of them (residual absorbed by the bound multipliers) closes the gap at x
    f = data.objective(x)
    exact = exact_dual_point(data, duals, w) if stat <= tol + floor else None
    lb = lagrangian_bound(data, exact[0], exact[1]) if exact is not None else -math.inf
    lgap = (f - lb) / max(1.0, abs(f)) if math.isfinite(lb) else math.inf
    out["lagrangian_gap"] = lgap
    out["ok"] = bool(stat <= tol + floor and sub <= tol + floor and neg / scale <= tol
                     and comp / scale <= tol and lgap <= _LAGRANGIAN_GAP_FACTOR * max(eps_rel, 1e-9))
    if exact is not None:
        out["duals"], out["w"] = exact
    return out


def exact_dual_point(data, duals, w):
    """``(duals, w)`` made exactly dual feasible, or ``None``.

    Weak duality needs ``M^T w + A^T y - s_lo + s_up + D^T o = 0`` exactly and ``|w| <= w1``
    on pure-L1 rows; multipliers that meet these only to a tolerance bound nothing (the
    Lagrangian is unbounded along the residual).  Pure-L1 ``w`` is clipped to its interval,
    and the remaining residual ``r`` is absorbed coordinate by coordinate into the bound
    multipliers (``s_lo += r`` where a lower bound exists, else ``s_up -= r`` while it stays
    non-negative, and symmetrically); a coordinate that can take neither leaves ``None``
    unless its residual is rounding (``_ROUNDING_RESIDUAL``)."""
    w = np.asarray(w, dtype=float)
    flat = data.w2 == 0
    w = np.where(flat, np.clip(w, -data.w1, data.w1), w)
    c = constraint_gradient(data, duals)
    if c is None:
        return None
    r = data.M.T @ w + c
    if _needs_loss_correction(data, duals, r, c):
        w, duals = _loss_correction(data, duals, w, r)
        c = constraint_gradient(data, duals)
        r = data.M.T @ w + c
    s_lo = np.asarray(duals["lower"], float).copy()
    s_up = np.asarray(duals["upper"], float).copy()
    lo_f, up_f = np.isfinite(data.lower), np.isfinite(data.upper)
    pos, neg = r > 0, r < 0
    take_lo = pos & lo_f                         # raise s_lo by r
    take_up = pos & ~lo_f & up_f & (s_up >= r)   # lower s_up by r
    s_lo[take_lo] += r[take_lo]
    s_up[take_up] -= r[take_up]
    give_up = neg & up_f                         # raise s_up by |r|
    give_lo = neg & ~up_f & lo_f & (s_lo >= -r)  # lower s_lo by |r|
    s_up[give_up] -= r[give_up]
    s_lo[give_lo] += r[give_lo]
    left = (pos & ~take_lo & ~take_up) | (neg & ~give_up & ~give_lo)
    scale = max(1.0, float(np.max(np.abs(c), initial=0.0)))
    if np.any(np.abs(r[left]) > _ROUNDING_RESIDUAL * scale):
        return None
    fixed = dict(duals, lower=s_lo, upper=s_up)
    return fixed, w


def _unabsorbable(data, duals, r) -> np.ndarray:
    """Coordinates whose stationarity residual ``r`` no bound multiplier can take: no
    bound on the needed side, and the other side's multiplier too small to give it up."""
    s_lo, s_up = np.asarray(duals["lower"], float), np.asarray(duals["upper"], float)
    lo_f, up_f = np.isfinite(data.lower), np.isfinite(data.upper)
    pos, neg = r > 0, r < 0
    ok_pos = lo_f | (up_f & (s_up >= r))
    ok_neg = up_f | (lo_f & (s_lo >= -r))
    return (pos & ~ok_pos) | (neg & ~ok_neg)


#: largest stationarity residual (relative) the least-norm loss correction is tried on
_CORRECTABLE_RESIDUAL = 1e-7


def _needs_loss_correction(data, duals, r, c) -> bool:
    """Is some residual beyond rounding left where no bound multiplier can take it?"""
    left = _unabsorbable(data, duals, r)
    scale = max(1.0, float(np.max(np.abs(c), initial=0.0)))
    worst = float(np.max(np.abs(r[left]), initial=0.0))
    # only a residual near rounding: an iterate far from stationary (the checks during the
    # iterations) is not worth a least-norm solve (LSQR's iter_lim of sparse products, seconds
    # on a 10^4-node tree at every check), and its correction would not certify anyway
    return _ROUNDING_RESIDUAL * scale < worst <= _CORRECTABLE_RESIDUAL * scale


def _loss_correction(data, duals, w, r):
    """``(w + dw, duals with yA + dy)`` removing the residual ``r`` where bounds cannot:
    ``M_F^T dw + A^T dy + sum_{i active} e_i t_i = -r`` in least norm (LSQR), ``F`` the rows
    whose multiplier may move (squared rows, where ``phi^*`` is finite everywhere, and
    pure-L1 rows strictly inside ``[-w1, w1]``), the ``e_i`` those of coordinates whose bound
    multiplier is positive (the absorption after takes ``t_i`` either way).  A coordinate
    without an active bound and a stationarity residual of 1e-11 (an LP's or a polish's
    rounding) makes the Lagrangian unbounded; the loss and equality multipliers of a coupled
    problem (the matrix mechanism) can take it instead, at a cost of order
    ``|dw| |residual|`` to the bound."""
    flat = data.w2 == 0
    free = ~flat | (np.abs(w) < data.w1 * (1.0 - _L1_INTERIOR))
    s_lo, s_up = np.asarray(duals["lower"], float), np.asarray(duals["upper"], float)
    active = np.flatnonzero((s_lo > 0) | (s_up > 0))
    n = data.n
    blocks = [data.M.tocsr()[free].T]
    if has_eq(data):
        blocks.append(data.A.T)
    blocks.append(sp.csr_matrix((np.ones(active.size), (active, np.arange(active.size))),
                                shape=(n, active.size)))
    K = sp.hstack(blocks).tocsr()
    dz = spla.lsqr(K, -r, atol=0.0, btol=0.0, conlim=0.0, iter_lim=_LSQR_ITERS)[0]
    k = int(free.sum())
    out = w.copy()
    out[free] += dz[:k]
    fixed = dict(duals)
    if has_eq(data):
        fixed["eq"] = np.asarray(duals["eq"], float) + dz[k:k + data.A.shape[0]]
    return np.where(flat, np.clip(out, -data.w1, data.w1), out), fixed


def lagrangian_bound(data, duals, w) -> float:
    """The weak-duality lower bound of ``(duals, w)`` (exact stationarity assumed)."""
    m = w.size
    conj = SeparableLoss(np.zeros(m), data.w1, data.w2, np.full(m, -np.inf),
                         np.full(m, np.inf)).conjugate_sum(w)
    if not math.isfinite(conj):
        # rounding just past |w| = w1 on a pure-L1 row: pull it back onto the edge
        flat = data.w2 == 0
        w = np.where(flat, np.clip(w, -data.w1, data.w1), w)
        conj = SeparableLoss(np.zeros(m), data.w1, data.w2, np.full(m, -np.inf),
                             np.full(m, np.inf)).conjugate_sum(w)
        if not math.isfinite(conj):
            return -math.inf
    s_lo, s_up = np.asarray(duals["lower"], float), np.asarray(duals["upper"], float)
    lo_f, up_f = np.isfinite(data.lower), np.isfinite(data.upper)
    if np.any(s_lo[~lo_f] != 0) or np.any(s_up[~up_f] != 0):
        return -math.inf
    val = -conj - float(w @ data.y) + float(s_lo[lo_f] @ data.lower[lo_f]) \
        - float(s_up[up_f] @ data.upper[up_f]) + data.constant
    if has_eq(data):
        val -= float(np.asarray(duals["eq"], float) @ data.b)
    return val

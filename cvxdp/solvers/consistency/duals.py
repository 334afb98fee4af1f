"""Dual points of the separable splitting ``min f(x) + I_C(x)``.

``f`` is separable (loss plus box, :class:`~cvxdp.solvers.consistency.losses.SeparableLoss`), ``C``
an affine set ``A x = b`` (general or a forest) or an order cone.  The Fenchel dual is

    D(lam) = -f*(-lam) - sigma_C(lam),   sigma_C(lam) = lam^T x_0  for lam in range(A^T)
                                        (x_0 any point of C; 0 on the polar cone of chains),

and any ``lam`` in the domain is a certified lower bound.  An ADMM multiplier is moved
into ``dom sigma_C`` by projection, then into ``dom f*`` either by scaling
(``theta lam``) or, on forests and chains, coordinate-wise: ``-lam_v`` must lie in the
interval ``dom f*_v`` (or, for exact multipliers at a point ``x``, in ``df_v(x_v)``),
which on a forest are difference constraints solved by interval propagation
(:meth:`cvxdp.solvers.tree.forest.Forest.interval_multipliers`) and on chains by
:func:`cvxdp.solvers.consistency.isotonic.chain_dual`.
"""
from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp

from .._linalg import dot as _dot
from .affine import AffineProjector, ForestProjector
from .isotonic import Chains, chain_dual
from .losses import SeparableLoss

__all__ = ["forest_dual", "affine_dual", "subdifferential_box", "separable_dual_value", "separable_multipliers",
           "exact_separable_multipliers"]

# Intervals of the forest dual may conflict by this much (relative to their span).
_INTERVAL_SLACK = 1e-9

# Up to this many coordinates a general affine set's dual point is repaired by an LP, when
# scaling would keep less than this share of it (a sign no scaling mends gives theta = 0;
# near convergence theta is close to 1 and the LP, about ten times an ADMM step on a 4,096-cell
# table, would not pay)
_LP_REPAIR_MAX_N = 5000
_LP_REPAIR_BELOW = 0.5

# HiGHS's feasibility tolerances for that LP (its default 1e-7 would be the rounding of the
# bound: the result is clipped into the domain, leaving range(A^T) by as much)
_LP_TOLERANCES = {"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10}

# Below this scale factor the dual point is repaired coordinate-wise instead: scaling
# by even 0.999 costs 1e-3 of the objective, ten times a 1e-4 target.
_REPAIR_BELOW = 1.0


def forest_dual(proj: ForestProjector, L: np.ndarray, U: np.ndarray, lam_ref: np.ndarray):
    """``lam = C^T y in [L, U]`` on the projector's forest, closest (level by level) to
    the multipliers of ``lam_ref`` projected onto ``range(C^T)``; ``None`` if none.
    The user's rows may be scaled; ``C^T y`` is invariant to that."""
    F = proj.forest
    lam_r = lam_ref - proj.project_nullspace(lam_ref)
    y_ref = np.zeros(F.n)
    y_ref[F.is_internal] = F.multipliers(lam_r)
    span = float(np.max(np.abs(np.r_[L[np.isfinite(L)], U[np.isfinite(U)]]), initial=1.0))
    return F.interval_multipliers(L, U, y_ref, _INTERVAL_SLACK * span)


def subdifferential_box(f: SeparableLoss, x: np.ndarray, tol: float = 0.0):
    """Interval ``[L, U]`` that ``lam_i`` must lie in for ``-lam_i`` to be in
    ``df_i(x_i)`` (loss plus the normal cone of the box).  With ``tol > 0`` a
    residual within ``tol`` of zero counts as a kink and a coordinate within ``tol``
    of a bound as on it, which widens the intervals."""
    r = x - f.y
    smooth = f.w2 * r + f.w1 * np.sign(r)
    kink = (f.w1 > 0) & (np.abs(r) <= tol)
    lo = np.where(kink, f.w2 * r - f.w1, smooth)
    hi = np.where(kink, f.w2 * r + f.w1, smooth)
    lo = np.where(x <= f.lower + tol, -np.inf, lo)
    hi = np.where(x >= f.upper - tol, np.inf, hi)
    return -hi, -lo


def separable_dual_value(f: SeparableLoss, proj, chains: Chains | None, lam: np.ndarray,
                         constant: float) -> tuple[float, np.ndarray | None]:
    """``(D(lam'), lam')`` for ``lam'`` the repair of ``lam`` described above;
    ``lam'`` is returned only when repaired coordinate-wise (else ``None``)."""
    if proj is not None:
        lam = lam - proj.project_nullspace(lam)      # into range(A^T)
        support = float(_dot(lam, proj.particular))
    elif chains is not None:
        lam = lam - chains.project(lam)              # into the polar cone
        support = 0.0
    else:
        lam = np.zeros_like(lam)
        support = 0.0
    theta = f.max_dual_scale(-lam)
    if theta < _REPAIR_BELOW:
        repaired = _repair_coordinatewise(f, proj, chains, lam, theta)
        if repaired is not None:
            val, lam_r = repaired
            return val + constant, lam_r
    val = f.conjugate_sum(-theta * lam)
    if not math.isfinite(val):
        return -math.inf, None
    return -val - theta * support + constant, None


def _repair_coordinatewise(f: SeparableLoss, proj, chains, lam, theta: float):
    """``(D(lam') - constant, lam')`` with ``-lam'`` in ``dom f*`` found on chains or a
    forest (or, when scaling keeps less than ``_LP_REPAIR_BELOW`` of ``lam``, by an LP on a
    small general affine set), or ``None``: scaling the whole vector would lose too much."""
    lo, hi = f.dual_domain()
    if chains is not None and proj is None:
        lam_c = chain_dual(chains, lo, hi, lam)
        if lam_c is not None:
            val = f.conjugate_sum(-lam_c)
            if math.isfinite(val):
                return -val, lam_c
    if isinstance(proj, ForestProjector):
        lam_f = forest_dual(proj, lo, hi, lam)
        if lam_f is not None:
            val = f.conjugate_sum(-lam_f)
            if math.isfinite(val):
                return -val - float(_dot(lam_f, proj.particular)), lam_f
    elif isinstance(proj, AffineProjector) and chains is None and proj.n <= _LP_REPAIR_MAX_N \
            and theta < _LP_REPAIR_BELOW:
        lam_a = affine_dual(proj, lo, hi, lam)
        if lam_a is not None:
            val = f.conjugate_sum(-lam_a)
            if math.isfinite(val):
                return -val - float(_dot(lam_a, proj.particular)), lam_a
    return None


def affine_dual(proj: AffineProjector, L: np.ndarray, U: np.ndarray, lam_ref: np.ndarray):
    """``lam = A^T y`` in ``[L, U]`` nearest ``lam_ref`` in the 1-norm (an LP in ``y`` and the
    deviations ``t``: ``min 1^T t`` s.t. ``|A^T y - lam_ref| <= t``, ``L <= A^T y <= U``); the
    general-``A`` counterpart of :func:`forest_dual`, for small ``n``.  ``None`` if none."""
    from scipy.optimize import linprog

    AT = proj.AT
    n, p = AT.shape
    eye = sp.identity(n, format="csr")
    rows = [sp.hstack([AT, -eye]), sp.hstack([-AT, -eye])]
    rhs = [lam_ref, -lam_ref]
    up, dn = np.isfinite(U), np.isfinite(L)
    if up.any():
        rows.append(sp.hstack([AT[up], sp.csr_matrix((int(up.sum()), n))]))
        rhs.append(U[up])
    if dn.any():
        rows.append(sp.hstack([-AT[dn], sp.csr_matrix((int(dn.sum()), n))]))
        rhs.append(-L[dn])
    sol = linprog(np.r_[np.zeros(p), np.ones(n)], A_ub=sp.vstack(rows).tocsr(), b_ub=np.concatenate(rhs),
                  bounds=[(None, None)] * p + [(0, None)] * n, method="highs", options=_LP_TOLERANCES)
    if sol.status != 0:
        return None
    return np.clip(AT @ sol.x[:p], L, U)       # rounding of the LP's feasibility tolerance


def separable_multipliers(f: SeparableLoss, proj, chains: Chains | None, x: np.ndarray,
                          lam: np.ndarray, eps_abs: float) -> dict:
    """cvxpy's multipliers from ``lam in N_C`` with ``-lam in df(x)``.

    cvxpy's Lagrangian is ``loss + y^T (A x - b) + s_lo^T (l - x) + s_up^T (x - u)``
    (plus ``o^T D x`` for order edges); stationarity with ``-lam`` in ``d loss`` gives
    ``A^T y = lam`` (resp. ``D^T o = lam``), the rest is the bounds' share."""
    out = {}
    n = x.size
    if proj is not None:
        lam_c = lam - proj.project_nullspace(lam)
        out["eq"] = proj.multipliers(lam_c)
        g_total = -lam_c
    elif chains is not None:
        lam_c = lam - chains.project(lam)
        out["order"] = [np.maximum(o, 0.0) for o in chains.multipliers(lam_c)]
        g_total = -lam_c
    else:
        g_total = np.zeros(n)
    out["lower"], out["upper"] = f.subgradient_at(x, g_total, eps_abs)
    return out


def exact_separable_multipliers(f: SeparableLoss, proj, chains: Chains | None, x: np.ndarray,
                                lam: np.ndarray, eps_abs: float) -> dict:
    """:func:`separable_multipliers`, made exact for ``x`` where the constraint set
    allows it: on a forest and on order chains, the multiplier closest to ``lam`` whose
    negative is a subgradient of ``f`` at ``x`` (kinks and bounds within ``eps_abs``)."""
    if isinstance(proj, ForestProjector) or (proj is None and chains is not None):
        L, U = subdifferential_box(f, x, eps_abs)
        if proj is not None:
            exact = forest_dual(proj, L, U, lam)
        else:
            exact = chain_dual(chains, L, U, lam - chains.project(lam))
        if exact is not None:
            return separable_multipliers(f, proj, chains, x, exact, eps_abs)
    return separable_multipliers(f, proj, chains, x, lam, eps_abs)

"""Active-set polish for the separable ADMM splitting.

At an ADMM iterate ``x = prox_f(z - u)`` the soft threshold and the clip return
*exact* zeros: coordinates whose residual ``x_i - y_i`` is exactly zero, or that
sit exactly on a bound, are the identified active set ``S``.  On the rest (``F``)
the residual's sign ``sigma_i`` is known, so the loss is smooth there:
``sigma_i w1_i r_i + (w2_i/2) r_i^2``.  Fixing ``x_S`` and minimizing the smooth
remainder subject to the equality constraints is a weighted projection

    minimize  sum_F (h_i/2) (x_i - t_i)^2   s.t.  A x = b,  x_S fixed,
    h_i = w2_i + delta_i,   t_i = (w2_i y_i - sigma_i w1_i + delta_i xhat_i) / h_i,

where a tiny ``delta`` (only where ``w2_i = 0``) selects, among the optimal points
of a degenerate face, the one closest to the ADMM iterate ``xhat``.  On a forest
this is one O(n) pass of :class:`cvxdp.solvers.tree.TreeLSQ` with infinite weights on
``S``.  The polished point is accepted only if it is feasible and keeps the signs.

The matching dual (the certificate) is found by *interval propagation*: every
node's multiplier ``lam_v = (C^T y)_v`` must lie in ``-df_v(x_v)``, an interval
(a point where the loss is smooth).  On a forest these are difference
constraints ``y_v - y_parent(v) in [L_v, U_v]``: bottom up each ``y_v`` gets the
interval its subtree allows, top down we pick the value closest to the ADMM
multiplier.  Then primal and dual objectives agree to rounding error.
"""
from __future__ import annotations

import math

import numpy as np

from .affine import AffineProjector, ForestProjector
from .losses import SeparableLoss
from .tree import TreeLSQ

# Curvature added on pure-L1 free coordinates, relative to rho.
_DELTA_REL = 1e-7
# Slack (relative to the data scale) when testing signs, bounds and intervals.
_SLACK = 1e-9
# Weight (relative to rho) that holds identified zero residuals in the first stage.
_HEAVY = 1e7
# A held residual that moves by more than this (relative to max |y|) is released.
_MOVE_RTOL = 1e-12
# A held residual that moves by this fraction of the conflict it resolves is released.
_CONFLICT_FRACTION = 1e-3
# Relative distance from +-w within which a dual value counts as on the edge.
_DUAL_MARGIN = 1e-3
# Active-set correction rounds before giving up on this iterate.
_ROUNDS = 6


def polish_separable(solver, x_admm: np.ndarray, lam_admm: np.ndarray):
    """Returns ``(objective, x, duals, lower_bound)`` or ``None`` if the identified
    active set does not give a feasible, sign-consistent point."""
    f = solver.f
    proj = solver.proj
    data = solver.data
    y, w1, w2 = f.y, f.w1, f.w2
    r = x_admm - y
    at_lo = x_admm <= f.lower
    at_hi = x_admm >= f.upper
    zero_res = (w1 > 0) & (r == 0) & ~(at_lo | at_hi)
    sigma = np.sign(r)
    lam_dual = getattr(solver, "last_dual_point", None)
    if lam_dual is not None:
        _identify_from_dual(f, -lam_dual, at_lo, at_hi, zero_res, sigma)
    delta = _DELTA_REL * solver.rho
    h = np.where(w2 > 0, w2, delta)
    scale = 1.0 + float(np.max(np.abs(y), initial=0.0))
    tight = _MOVE_RTOL * scale
    feas_tol = solver.s.eps_abs

    def solve_with(zero_weight):
        on_bound = at_lo | at_hi
        fixed = on_bound | (zero_res & np.isinf(zero_weight))
        q = w2 * y - sigma * w1 + np.where(w2 > 0, 0.0, delta * x_admm)
        bound_val = np.where(at_lo, f.lower, f.upper)
        target = np.where(on_bound, bound_val, np.where(zero_res, y, q / h))
        weights = np.where(on_bound, np.inf, np.where(zero_res, zero_weight, h))
        if isinstance(proj, ForestProjector):
            return TreeLSQ(proj.forest, weights).project(target, proj.offsets)
        return _weighted_affine_projection(proj, target, weights, fixed)

    x = None
    for _ in range(_ROUNDS):
        x = solve_with(np.where(zero_res, np.inf, 0.0))
        if x is None:
            return None
        resid = float(np.max(np.abs(proj.residual(x)), initial=0.0))
        if resid > feas_tol and zero_res.any():
            # The fixed values conflict: a node with tiny |y| next to a bound can look
            # like a zero residual while the optimum has it on the bound.  Holding the
            # zero residuals by a heavy but finite weight lets the conflict resolve;
            # nodes that move by a good fraction of the conflict are released.
            xs = solve_with(np.where(zero_res, _HEAVY * solver.rho, 0.0))
            if xs is None:
                return None
            move = np.abs(xs - y)
            moved = zero_res & (move > max(tight, _CONFLICT_FRACTION * resid))
            sigma = np.where(moved, np.sign(xs - y), sigma)
            zero_res &= ~moved
            x = solve_with(np.where(zero_res, np.inf, 0.0))
            if x is None:
                return None
        free = ~(at_lo | at_hi | zero_res)
        if not _correct_active_set(solver, x, free, free & (w1 > 0), sigma * (x - y),
                                   f.lower, f.upper, feas_tol, tight, at_lo, at_hi, zero_res):
            break
    else:
        return None
    resid = float(np.max(np.abs(proj.residual(x)), initial=0.0))
    if resid > feas_tol:
        solver.polish_reason = f"fixed values inconsistent (residual {resid:.1e})"
        return None
    solver.polish_reason = "ok"
    x = f.clip(x)
    obj = f.value(x) + data.constant
    lam = _certify_dual(solver, x, lam_admm)
    lower = solver._dual_value(lam)
    if not math.isfinite(lower):
        lower = solver._dual_value(lam_admm)
    duals = solver._duals_from(x, lam)
    return obj, x, duals, lower


def _identify_from_dual(f, s, at_lo, at_hi, zero_res, sigma) -> None:
    """Refine the active-set guess of the pure-L1 coordinates from a (repaired,
    near-optimal) dual point ``s = -lam`` by complementary slackness: ``s`` strictly
    inside ``(-w, w)`` means a zero residual (or, when ``y`` lies outside the bounds, the
    nearest bound); beyond ``w`` in absolute value means the bound on that side; at
    ``+-w`` the residual is free with that sign.  Coordinates near a threshold keep
    the primal guess.  Arrays are updated in place."""
    l1 = (f.w1 > 0) & (f.w2 == 0)
    if not l1.any():
        return
    w = f.w1
    margin = _DUAL_MARGIN * w
    inside = l1 & (np.abs(s) < w - margin)
    below = l1 & (s < -w - margin)          # pushed down beyond the L1 slope: lower bound
    above = l1 & (s > w + margin)
    y_lo = f.y <= f.lower
    y_hi = f.y >= f.upper
    new_lo = below | (inside & y_lo)
    new_hi = above | (inside & y_hi)
    new_zero = inside & ~y_lo & ~y_hi
    on_edge = l1 & ~inside & ~below & ~above
    decided = new_lo | new_hi | new_zero
    at_lo[decided] = new_lo[decided]
    at_hi[decided] = new_hi[decided]
    zero_res[decided] = new_zero[decided]
    edge = on_edge & ~at_lo & ~at_hi
    zero_res[edge] = False
    sigma[edge] = np.sign(s[edge])


def _correct_active_set(solver, x, free, signed_rows, signed_res, lower, upper, feas_tol, tight,
                        at_lo, at_hi, zero) -> bool:
    """One round of active-set corrections, in place: free coordinates past a bound
    join it; L1 residuals whose sign flipped (``signed_res < 0`` on ``signed_rows``)
    are zero at the optimum.  Returns False when nothing changed (the set is final)."""
    new_lo = free & (x < lower - feas_tol)
    new_hi = free & (x > upper + feas_tol)
    flipped = signed_rows & (signed_res < -tight)
    if flipped.size == new_lo.size:
        flipped &= ~new_lo & ~new_hi
    if not (new_lo.any() or new_hi.any() or flipped.any()):
        return False
    solver.polish_reason = (f"active set changed: {int(new_lo.sum() + new_hi.sum())} bounds, "
                            f"{int(flipped.sum())} sign flips")
    at_lo |= new_lo
    at_hi |= new_hi
    zero |= flipped
    return True


def _weighted_affine_projection(proj: AffineProjector, target, weights, fixed):
    """``argmin sum_F w (x - t)^2`` s.t. ``A x = b``, ``x_S = t_S`` for general ``A``."""
    A = proj.A.tocsc()
    free = ~fixed
    wf = weights[free]
    Af = A[:, free]
    rhs = proj.b - A[:, fixed] @ target[fixed]
    scale = 1.0 / np.sqrt(wf)
    try:
        sub = AffineProjector(Af.multiply(scale[None, :]).tocsr(), rhs)
    except (np.linalg.LinAlgError, RuntimeError, ValueError):
        return None
    if not sub.feasible:
        return None
    xt = sub.project(target[free] / scale)
    x = target.copy()
    x[free] = xt * scale
    return x


def subdifferential_box(f, x, tol: float = 0.0):
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


def _certify_dual(solver, x, lam_admm):
    """A multiplier ``lam in range(A^T)`` with ``-lam in df(x)``, close to ``lam_admm``."""
    f, proj = solver.f, solver.proj
    L, U = subdifferential_box(f, x)         # lam_v must lie in [L_v, U_v]
    if isinstance(proj, ForestProjector):
        lam = forest_dual(proj, L, U, lam_admm)
        if lam is not None:
            return lam
        return lam_admm
    # general A: least-squares multipliers for the clipped target
    target = np.clip(lam_admm, L, U)
    y = proj.multipliers(target)
    return proj.A.T @ y


def forest_dual(proj: ForestProjector, L, U, lam_admm):
    """Solve ``lam = C^T y in [L, U]`` on a forest by interval propagation."""
    F = proj.forest
    order = F.order
    Lp, Up = L[order], U[order]
    lam_ref = lam_admm - proj.project_nullspace(lam_admm)
    y_ref = np.zeros(F.n)
    y_ref[F.is_internal] = F.multipliers(lam_ref)
    y_ref = y_ref[order]
    span = float(np.max(np.abs(np.r_[L[np.isfinite(L)], U[np.isfinite(U)]]), initial=1.0))
    slack = _SLACK * span
    # bottom up: interval I_v of y_v allowed by v's subtree (BFS positions)
    Ilo = np.full(F.n, -np.inf)
    Ihi = np.full(F.n, np.inf)
    internal = F._n_children_pos > 0
    for d in range(F.n_levels - 1, 0, -1):
        s, e = F.level_bounds[d], F.level_bounds[d + 1]
        par = F._parent_slices[d]
        kid_int = internal[s:e]
        # constraint on the parent's y from each child: y_p in [y_c - U_c, y_c - L_c]
        jlo = np.where(kid_int, Ilo[s:e] - Up[s:e], -Up[s:e])
        jhi = np.where(kid_int, Ihi[s:e] - Lp[s:e], -Lp[s:e])
        Ilo[par] = F._block_reduce(d, jlo, np.maximum)
        Ihi[par] = F._block_reduce(d, jhi, np.minimum)
    roots = slice(F.level_bounds[0], F.level_bounds[1])
    rlo = np.maximum(Ilo[roots], Lp[roots])
    rhi = np.minimum(Ihi[roots], Up[roots])
    Ilo[roots] = np.where(internal[roots], rlo, Ilo[roots])
    Ihi[roots] = np.where(internal[roots], rhi, Ihi[roots])
    if np.any(Ilo[internal] > Ihi[internal] + slack):
        return None
    yv = np.zeros(F.n)
    yv[roots] = np.clip(y_ref[roots], Ilo[roots], Ihi[roots])
    for d in range(1, F.n_levels):
        s, e = F.level_bounds[d], F.level_bounds[d + 1]
        ypar = F._expand(d, yv[F._parent_slices[d]])
        lo = np.maximum(Ilo[s:e], ypar + Lp[s:e])
        hi = np.minimum(Ihi[s:e], ypar + Up[s:e])
        hi = np.maximum(hi, lo)            # within slack: collapse
        yv[s:e] = np.where(internal[s:e], np.clip(y_ref[s:e], lo, hi), 0.0)
    # lam = C^T y in BFS positions, then back to original order
    lam_p = np.where(internal, yv, 0.0)
    for d in range(1, F.n_levels):
        s, e = F.level_bounds[d], F.level_bounds[d + 1]
        lam_p[s:e] -= F._expand(d, yv[F._parent_slices[d]])
    lam = np.empty(F.n)
    lam[order] = lam_p
    # the user's rows may be scaled; C^T y is invariant to that (y is per canonical row)
    return lam


# ---------------------------------------------------------------------------
def polish_general(solver):
    """Active-set polish for the general splitting (any ``M``; bounds and ``A x = b``).

    Rows whose residual the prox set exactly to zero are held at zero, coordinates the
    bounds block clipped are fixed, the remaining residual signs are known; the rest
    is the equality-constrained quadratic program

        min  sum_{i not in R0} sigma_i w1_i r_i + (1/2) r^T W2 r + (delta/2)|x_F - xhat_F|^2
        s.t. r = M x - y,  r_R0 = 0,  A x = b,  x_S = bounds,

    solved through its KKT system.  The multipliers are then recomputed with
    ``delta = 0`` by least squares (exact stationarity on the free coordinates) and
    the dual value is evaluated; a wrong active set shows up as a sign or bound
    violation, or as a gap, and the ADMM iterations continue.
    """
    import scipy.linalg as la
    import scipy.sparse as sp
    import scipy.sparse.linalg as spla

    d = solver.data
    if solver.chains is not None:
        return None
    Mx = d.M.tocsr()               # the loss rows only (the penalty split appends A)
    w1, w2, yobs = d.w1, d.w2, d.y
    lower, upper = d.lower, d.upper
    n, m = solver.n, Mx.shape[0]
    r_admm = solver.r[:m]
    xb = solver.xs[[nm for nm, _ in solver.blocks].index("bounds")] if "bounds" in [nm for nm, _ in solver.blocks] else solver.x
    at_lo = xb <= lower
    at_hi = xb >= upper
    zero = (w1 > 0) & (r_admm == 0)
    sigma = np.sign(r_admm)
    A = d.A if d.A is not None and d.A.shape[0] > 0 else None
    delta = _DELTA_REL * solver.rho
    scale = 1.0 + float(np.max(np.abs(yobs), initial=0.0))
    feas_tol = solver.s.eps_abs
    tight = _MOVE_RTOL * scale
    x = None
    for _ in range(_ROUNDS):
        S = at_lo | at_hi
        F = ~S
        xS = np.where(at_lo, lower, upper)[S]
        MF, MS = Mx[:, F], Mx[:, S]
        ytil = yobs - MS @ xS
        W2 = sp.diags(w2)
        H = (MF.T @ W2 @ MF).tocsc() + delta * sp.identity(int(F.sum()), format="csc")
        q = MF.T @ (w2 * ytil - np.where(zero, 0.0, sigma * w1)) + delta * solver.x[F]
        rows = [MF[zero]]
        rhs = [ytil[zero]]
        if A is not None:
            rows.append(A[:, F])
            rhs.append(d.b - A[:, S] @ xS)
        E = sp.vstack(rows).tocsc()
        e = np.concatenate(rhs)
        k = E.shape[0]
        K = sp.bmat([[H, E.T], [E, -1e-12 * scale * sp.identity(k, format="csc")]], format="csc")
        try:
            sol = spla.splu(K).solve(np.r_[q, e]) if K.shape[0] > 2000 else la.solve(K.toarray(), np.r_[q, e])
        except (RuntimeError, la.LinAlgError):
            solver.polish_reason = "singular KKT system"
            return None
        xF = sol[: F.sum()]
        x = np.empty(n)
        x[F] = xF
        x[S] = xS
        r = Mx @ x - yobs
        eq_res = float(np.max(np.abs(E @ xF - e), initial=0.0))
        if eq_res > feas_tol:
            moved = zero & (np.abs(r) > max(tight, _CONFLICT_FRACTION * eq_res))
            if not moved.any():
                solver.polish_reason = f"fixed residuals inconsistent ({eq_res:.1e})"
                return None
            sigma = np.where(moved, np.sign(r), sigma)
            zero &= ~moved
            continue
        if not _correct_active_set(solver, x, F, ~zero & (w1 > 0), sigma * r, lower, upper,
                                   feas_tol, tight, at_lo, at_hi, zero):
            break
    else:
        return None
    x = np.clip(x, lower, upper)
    r = Mx @ x - yobs
    obj = float(np.dot(w1, np.abs(r)) + 0.5 * np.dot(w2, r * r)) + d.constant
    # exact multipliers (delta = 0): u_i = sigma w1 + w2 r off R0; (u_R0, y_A) by least squares
    S = at_lo | at_hi
    F = ~S
    u = np.where(zero, 0.0, sigma * w1) + w2 * r
    cols = [Mx[zero][:, F].T]
    if A is not None:
        cols.append(A[:, F].T)
    B = sp.hstack(cols).tocsr()
    target = -(Mx[:, F].T @ u)
    if B.shape[1]:
        zsol = spla.lsqr(B, target, atol=1e-14, btol=1e-14, iter_lim=10 * B.shape[1])[0] \
            if B.shape[0] > 3000 else np.linalg.lstsq(B.toarray(), target, rcond=None)[0]
    else:
        zsol = np.zeros(0)
    nz = int(zero.sum())
    u[zero] += zsol[:nz]
    yA = zsol[nz:] if A is not None else np.zeros(0)
    g = Mx.T @ u + (A.T @ yA if A is not None else 0.0)       # = s_lo - s_up
    gtol = 1e-9 * max(1.0, float(np.max(np.abs(u), initial=0.0)))
    g = np.where(np.abs(g) <= gtol, 0.0, g)
    lower_bound = _general_dual_value(solver, u, yA, g)
    solver.polish_reason = "ok"
    duals = {"lower": np.where(at_lo, np.maximum(g, 0.0), 0.0),
             "upper": np.where(at_hi, np.maximum(-g, 0.0), 0.0)}
    if A is not None:
        duals["eq"] = yA
    return obj, x, duals, lower_bound


def _general_dual_value(solver, u, yA, g) -> float:
    """``-sum phi*(u) - u^T y - yA^T b + min_{l <= x <= u} g^T x`` with ``g = M^T u + A^T yA``."""
    d = solver.data
    m = u.size
    conj = SeparableLoss(np.zeros(m), d.w1, d.w2, np.full(m, -np.inf), np.full(m, np.inf)).conjugate_sum(u)
    if not math.isfinite(conj):
        return -math.inf
    with np.errstate(invalid="ignore"):
        box = np.where(g > 0, g * d.lower, np.where(g < 0, g * d.upper, 0.0))
    if not np.all(np.isfinite(box)):
        return -math.inf
    val = -conj - float(u @ d.y) + float(box.sum()) + d.constant
    if yA.size:
        val -= float(yA @ d.b)
    return val

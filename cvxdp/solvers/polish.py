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
import scipy.sparse as sp

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
# Above this many coordinates only the first two polish candidates are tried (each
# costs a few tree passes; the others matter on small, degenerate trees).
_POLISH_VARIANTS_MAX_N = 10_000_000
# Active-set correction rounds before giving up on this iterate.
_ROUNDS = 6


def polish_separable(solver, x_admm: np.ndarray, lam_admm: np.ndarray):
    """Returns ``(objective, x, duals, lower_bound)`` or ``None`` if the identified
    active set does not give a feasible, sign-consistent point.

    Two candidates: the regularized weighted projection described above, and (when it
    does not certify) the *face projection*: on the optimal face of a pure-L1 problem
    the linear part ``sigma w1`` is constant, so its free coordinates are simply moved
    as little as possible from the ADMM iterate onto ``A x = b`` with the active set
    fixed.  The first amplifies a slightly wrong sign by ``1/delta`` (it can collapse
    every coordinate onto a bound); the second does not.  The certificate decides."""
    has_l1 = bool(np.any(solver.f.pure_l1 & (solver.f.w1 > 0)))
    # (use the dual's complementary slackness to identify the active set, face projection);
    # the dual point's accuracy can misplace a coordinate on a bound, the primal's a sign
    variants = [(True, False), (True, True), (False, True), (False, False)] if has_l1 else [(True, False), (False, False)]
    if solver.n > _POLISH_VARIANTS_MAX_N:
        variants = variants[:2]
    best, reason = None, None
    for use_dual, face in variants:
        pol = _polish_separable_once(solver, x_admm, lam_admm, face=face, use_dual=use_dual)
        if reason is None or pol is not None:
            reason = getattr(solver, "polish_reason", None)
        if pol is not None and (best is None or _certified_gap(pol) < _certified_gap(best)):
            best = pol
        if best is not None and _certified_gap(best) <= solver.s.eps_rel:
            break
    solver.polish_reason = reason
    return best


def _certified_gap(pol) -> float:
    obj, _, _, lb = pol
    if not math.isfinite(lb):
        return math.inf
    return (obj - lb) / max(1.0, abs(obj))


def _polish_separable_once(solver, x_admm, lam_admm, face: bool, use_dual: bool = True):
    f = solver.f
    proj = solver.proj
    data = solver.data
    y, w1, w2 = f.y, f.w1, f.w2
    r = x_admm - y
    at_lo = x_admm <= f.lower
    at_hi = x_admm >= f.upper
    zero_res = (w1 > 0) & (r == 0) & ~(at_lo | at_hi)
    sigma = np.sign(r)
    lam_dual = getattr(solver, "last_dual_point", None) if use_dual else None
    if lam_dual is not None:
        _identify_from_dual(f, -lam_dual, at_lo, at_hi, zero_res, sigma)
    delta = _DELTA_REL * solver.rho
    if face:
        delta = solver.rho                   # any positive weight: no linear term below
    h = np.where(w2 > 0, w2, delta)
    scale = 1.0 + float(np.max(np.abs(y), initial=0.0))
    tight = _MOVE_RTOL * scale
    feas_tol = solver.s.eps_abs

    def solve_with(zero_weight):
        on_bound = at_lo | at_hi
        fixed = on_bound | (zero_res & np.isinf(zero_weight))
        q = w2 * y - sigma * w1 + np.where(w2 > 0, 0.0, delta * x_admm)
        if face:
            q = np.where(w2 > 0, q, delta * x_admm)
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
    duals["_w"] = u
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


# ---------------------------------------------------------------------------
# KKT certification of multipliers (what ``solve`` returns as ``duals``).
#
# Multipliers are those of cvxpy's Lagrangian
#     phi(M x - y) + yA^T (A x - b) + s_lo^T (l - x) + s_up^T (x - u) + o^T (D x)
# (``D x <= 0`` the order edges ``x[c_j] - x[c_{j+1}] <= 0``); with the loss multiplier
# ``w`` (one per loss row) stationarity reads
#     M^T w + A^T yA - s_lo + s_up + D^T o = 0,   w_i in d phi_i((M x - y)_i),
# plus s, o >= 0 and complementarity.  Weak duality then gives the lower bound
#     -sum phi_i^*(w_i) - w^T y - yA^T b + s_lo^T l - s_up^T u .

# A residual within this many eps_abs (times the row's 1-norm) counts as a kink, a
# coordinate within eps_abs of a bound as on it.
_KINK_FACTOR = 1.0
# Stationarity is required to this accuracy, relative to the size of the multipliers.
_STATIONARITY_RTOL = 1e-7
# The multipliers' Lagrangian bound may trail the objective by this many eps_rel.
_LAGRANGIAN_GAP_FACTOR = 10.0
# Largest LP (rows + columns) solved to find certified multipliers for a given x.
_KKT_LP_MAX = 100_000


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


def _order_matrix(chains, n):
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


def _split_order(chains, o):
    out, k = [], 0
    for c in chains.chains:
        out.append(o[k:k + c.size - 1])
        k += c.size - 1
    return out


def _has_eq(data) -> bool:
    return data.A is not None and data.A.shape[0] > 0


def _has_chains(data) -> bool:
    return data.chains is not None and bool(data.chains.chains)


def _constraint_gradient(data, duals):
    """``A^T yA - s_lo + s_up + D^T o`` (``None`` if a needed key is missing)."""
    n = data.n
    c = np.zeros(n)
    if _has_eq(data):
        if "eq" not in duals:
            return None
        c += data.A.T @ np.asarray(duals["eq"], float)
    if "lower" not in duals or "upper" not in duals:
        return None
    c -= np.asarray(duals["lower"], float)
    c += np.asarray(duals["upper"], float)
    if _has_chains(data):
        if "order" not in duals:
            return None
        c += _order_matrix(data.chains, n).T @ np.concatenate(
            [np.asarray(o, float) for o in duals["order"]] or [np.zeros(0)])
    return c


def separable_loss_multiplier(data, c):
    """``w`` with ``M^T w = -c`` when every loss row has one entry and no column two."""
    M = data.M.tocsr()
    nnz = np.diff(M.indptr)
    w = np.zeros(M.shape[0])
    rows = np.flatnonzero(nnz == 1)
    cols = M.indices[M.indptr[rows]]
    w[rows] = -c[cols] / M.data[M.indptr[rows]]
    return w


def kkt_check(data, x, duals, w, eps_abs: float, eps_rel: float) -> dict:
    """Largest violation of each KKT condition at ``x`` for ``(duals, w)``, relative
    to the multipliers' size, and whether all are within tolerance (``ok``)."""
    out = {"ok": False}
    c = _constraint_gradient(data, duals)
    if c is None or w is None or not np.all(np.isfinite(c)) or not np.all(np.isfinite(w)):
        out["reason"] = "missing or non-finite multipliers"
        return out
    scale = max(kkt_scale(data, x), float(np.max(np.abs(c), initial=0.0)))
    tau = eps_abs
    lo, hi = loss_intervals(data, x, tau)
    stat = float(np.max(np.abs(data.M.T @ w + c), initial=0.0)) / scale
    sub = float(np.max(np.maximum(lo - w, w - hi), initial=0.0)) / scale
    s_lo, s_up = np.asarray(duals["lower"], float), np.asarray(duals["upper"], float)
    neg = float(max(np.max(-s_lo, initial=0.0), np.max(-s_up, initial=0.0)))
    off_lo = s_lo[(x > data.lower + tau) | np.isinf(data.lower)]
    off_up = s_up[(x < data.upper - tau) | np.isinf(data.upper)]
    comp = float(max(np.max(np.abs(off_lo), initial=0.0), np.max(np.abs(off_up), initial=0.0)))
    if _has_chains(data):
        o = np.concatenate([np.asarray(v, float) for v in duals["order"]] or [np.zeros(0)])
        D = _order_matrix(data.chains, data.n)
        slack = -(D @ x)
        neg = max(neg, float(np.max(-o, initial=0.0)))
        comp = max(comp, float(np.max(np.abs(o[slack > tau]), initial=0.0)))
    out.update(stationarity=stat, subdifferential=sub, sign=neg / scale, complementarity=comp / scale)
    # a residual known to eps_abs gives a squared loss's multiplier to w2 eps_abs |M_i|_1
    rowsum = np.asarray(abs(data.M).sum(axis=1)).ravel()
    floor = eps_abs * float(np.max(data.w2 * rowsum, initial=0.0)) / scale
    tol = max(_STATIONARITY_RTOL, eps_rel)
    # and the multipliers must certify: their Lagrangian bound closes the gap at x
    f = data.objective(x)
    lb = lagrangian_bound(data, duals, w) if stat <= tol + floor else -math.inf
    lgap = (f - lb) / max(1.0, abs(f)) if math.isfinite(lb) else math.inf
    out["lagrangian_gap"] = lgap
    out["ok"] = bool(stat <= tol + floor and sub <= tol + floor and neg / scale <= tol
                     and comp / scale <= tol and lgap <= _LAGRANGIAN_GAP_FACTOR * max(eps_rel, 1e-9))
    return out


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
    if _has_eq(data):
        val -= float(np.asarray(duals["eq"], float) @ data.b)
    return val


def kkt_dual_lp(data, x, eps_abs: float, w_ref=None):
    """Multipliers satisfying the KKT conditions at ``x`` exactly (to the LP's
    tolerance), found by HiGHS on the linear feasibility problem above with the
    active sets read off ``x``; ``None`` if there are none (``x`` is not optimal to
    this accuracy) or the LP is too large.  Returns ``(duals, w)``."""
    from scipy.optimize import linprog

    n = data.n
    M = data.M.tocsr()
    m = M.shape[0]
    tau = eps_abs
    A = data.A if _has_eq(data) else sp.csr_matrix((0, n))
    p = A.shape[0]
    at_lo = np.flatnonzero(np.isfinite(data.lower) & (x <= data.lower + tau))
    at_up = np.flatnonzero(np.isfinite(data.upper) & (x >= data.upper - tau))
    D = _order_matrix(data.chains, n) if _has_chains(data) else sp.csr_matrix((0, n))
    tight = np.flatnonzero(-(D @ x) <= tau)
    nv = m + p + at_lo.size + at_up.size + tight.size
    if nv + n > _KKT_LP_MAX:
        return None
    scale = kkt_scale(data, x)
    lo, hi = loss_intervals(data, x, tau)
    E_lo = sp.csr_matrix((-np.ones(at_lo.size), (at_lo, np.arange(at_lo.size))), shape=(n, at_lo.size))
    E_up = sp.csr_matrix((np.ones(at_up.size), (at_up, np.arange(at_up.size))), shape=(n, at_up.size))
    Aeq = sp.hstack([M.T, A.T, E_lo, E_up, D[tight].T]).tocsc()
    bounds = np.empty((nv, 2))
    bounds[:m, 0], bounds[:m, 1] = lo / scale, hi / scale
    bounds[m:m + p] = (-np.inf, np.inf)
    bounds[m + p:] = (0.0, np.inf)
    bounds = np.where(np.isinf(bounds), None, bounds)
    try:
        res = linprog(np.zeros(nv), A_eq=Aeq, b_eq=np.zeros(n), bounds=bounds.tolist(),
                      method="highs", options={"primal_feasibility_tolerance": 1e-10,
                                               "dual_feasibility_tolerance": 1e-10})
    except (ValueError, MemoryError):
        return None
    if res.status != 0 or res.x is None:
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
    if _has_chains(data):
        o = np.zeros(D.shape[0])
        o[tight] = np.maximum(z[k:], 0.0)
        duals["order"] = _split_order(data.chains, o)
    return duals, w


def dual_bound_lp(data, x, eps_abs: float):
    """A certified lower bound from an LP over the multipliers, for a near-optimal ``x``.

    The loss multipliers of smooth rows are fixed at the gradient at ``x`` (elastic-net
    and squared rows away from their kink); those of pure-L1 rows and of elastic-net
    rows at a kink are LP variables in ``[-w1, w1]``, where ``phi^*`` vanishes.  Over
    these, ``yA``, ``o >= 0`` and the bound multipliers, HiGHS maximizes the Lagrangian
    dual value subject to exact stationarity.  Any feasible point is a lower bound
    (weak duality); at the LP optimum it is the best one with the fixed part.
    Returns ``(bound, duals, w)`` or ``None``."""
    from scipy.optimize import linprog

    n = data.n
    M = data.M.tocsr()
    m = M.shape[0]
    r = M @ x - data.y
    w1, w2 = data.w1, data.w2
    rowsum = np.asarray(abs(M).sum(axis=1)).ravel()
    kink = (w1 > 0) & (np.abs(r) <= eps_abs * np.maximum(rowsum, 1.0))
    var = (w1 > 0) & ((w2 == 0) | kink)
    fixed = ~var
    u_fix = np.where(fixed, w2 * r + w1 * np.sign(r), 0.0)
    conj_fixed = SeparableLoss(np.zeros(m), w1, w2, np.full(m, -np.inf), np.full(m, np.inf)).conjugate(u_fix)
    const = -float(np.sum(conj_fixed[fixed])) - float(u_fix[fixed] @ data.y[fixed]) + data.constant
    A = data.A if _has_eq(data) else sp.csr_matrix((0, n))
    p = A.shape[0]
    D = _order_matrix(data.chains, n) if _has_chains(data) else sp.csr_matrix((0, n))
    k = D.shape[0]
    i_lo = np.flatnonzero(np.isfinite(data.lower))
    i_up = np.flatnonzero(np.isfinite(data.upper))
    iv = np.flatnonzero(var)
    nv = iv.size + p + k + i_lo.size + i_up.size
    if nv + n > _KKT_LP_MAX:
        return None
    scale = kkt_scale(data, x)
    E_lo = sp.csr_matrix((-np.ones(i_lo.size), (i_lo, np.arange(i_lo.size))), shape=(n, i_lo.size))
    E_up = sp.csr_matrix((np.ones(i_up.size), (i_up, np.arange(i_up.size))), shape=(n, i_up.size))
    Aeq = sp.hstack([M.T[:, iv] if iv.size else sp.csr_matrix((n, 0)), A.T, D.T, E_lo, E_up]).tocsc()
    beq = -(M.T @ u_fix) / scale
    # maximize -u_v^T y_v - b^T yA + l^T s_lo - u^T s_up  ->  minimize the negative
    cost = np.r_[data.y[iv], data.b if p else np.zeros(0), np.zeros(k), -data.lower[i_lo], data.upper[i_up]]
    bounds = [(-w1[i] / scale, w1[i] / scale) for i in iv] + [(None, None)] * p + [(0, None)] * (k + i_lo.size + i_up.size)
    try:
        res = linprog(cost, A_eq=Aeq, b_eq=beq, bounds=bounds, method="highs",
                      options={"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10})
    except (ValueError, MemoryError):
        return None
    if res.status != 0 or res.x is None:
        return None
    z = res.x * scale
    w = u_fix.copy()
    w[iv] = np.clip(z[:iv.size], -w1[iv], w1[iv])
    j = iv.size
    duals = {"lower": np.zeros(n), "upper": np.zeros(n)}
    if p:
        duals["eq"] = z[j:j + p]
    j += p
    if k:
        duals["order"] = _split_order(data.chains, np.maximum(z[j:j + k], 0.0))
    j += k
    duals["lower"][i_lo] = np.maximum(z[j:j + i_lo.size], 0.0)
    j += i_lo.size
    duals["upper"][i_up] = np.maximum(z[j:j + i_up.size], 0.0)
    bound = lagrangian_bound(data, duals, w)
    stat = float(np.max(np.abs(M.T @ w + _constraint_gradient(data, duals)), initial=0.0)) / scale
    if not math.isfinite(bound) or stat > 1e-8:
        return None
    del const
    return bound, duals, w

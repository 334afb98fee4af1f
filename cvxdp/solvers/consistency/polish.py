"""Active-set polish of an ADMM iterate (separable and general splittings).

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
this is one O(n) pass of :class:`cvxdp.solvers.tree.forest.TreeLSQ` with infinite weights on
``S``.  The polished point is accepted only if it is feasible and keeps the signs.

The matching dual (the certificate) is found by *interval propagation*
(:func:`cvxdp.solvers.consistency.duals.forest_dual`): every node's multiplier must lie in
``-df_v(x_v)``, an interval; then primal and dual objectives agree to rounding error.

Both polishes take arrays and return a :class:`PolishResult`; they never touch the
solver that calls them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import scipy.linalg as la
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from ..result import ROUNDING
from .duals import forest_dual, separable_dual_value, separable_multipliers, subdifferential_box
from .affine import AffineProjector, ForestProjector
from .losses import SeparableLoss
from ..tree.forest import TreeLSQ

__all__ = ["PolishResult", "polish_separable", "polish_general"]

# Curvature added on pure-L1 free coordinates, relative to rho.
_DELTA_REL = 1e-7
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
#: candidate order ``(use_dual, face)`` with pure-L1 coordinates (:func:`polish_separable`)
#: and without (both orders measured alike there)
_ORDER_L1 = ((False, True), (True, False), (False, False), (True, True))
#: ... with smooth coordinates beside the pure-L1 ones (the face candidates certified none
#: of 56 such polishes; the regularised ones 13)
_ORDER_MIXED = ((True, False), (False, False), (False, True), (True, True))
_ORDER_SMOOTH = ((True, False), (False, False))
# Regularization of the KKT system of the general polish, relative to max |y|.
_KKT_REG = 1e-12
# Above this size the general polish's KKT system is factorized sparse.
_DENSE_KKT_MAX = 2000
# Least-squares multipliers of the general polish: dense up to this many rows.
_DENSE_LSQ_MAX = 3000
# A constraint-gradient entry below this (relative to the loss multipliers) is rounding.
_GRADIENT_ZERO_RTOL = 1e-9


@dataclass
class PolishResult:
    """What a polish attempt gives: ``x is None`` when it failed (``reason`` says why).
    ``duals`` are cvxpy's multipliers (``lower``, ``upper``, ``eq``), ``w`` the loss
    multipliers when known, ``lower_bound`` the dual value certifying ``x``."""

    x: np.ndarray | None = None
    objective: float = math.inf
    duals: dict = field(default_factory=dict)
    lower_bound: float = -math.inf
    reason: str | None = None
    rounds: int = 0
    w: np.ndarray | None = None
    #: the separable polish's candidate that gave ``x``, and those that failed
    #: (``(use_dual, face)`` pairs, :func:`polish_separable`)
    variant: tuple | None = None
    failed: tuple = ()

    @property
    def ok(self) -> bool:
        return self.x is not None

    @property
    def certified_gap(self) -> float:
        """``(objective - lower_bound) / max(1, |objective|)``, ``inf`` when failed."""
        if self.x is None or not math.isfinite(self.lower_bound):
            return math.inf
        return (self.objective - self.lower_bound) / max(1.0, abs(self.objective))


def _failed(reason: str | None, rounds: int = 0) -> PolishResult:
    return PolishResult(reason=reason, rounds=rounds)


# ---------------------------------------------------------------------------
# separable splitting
@dataclass
class SeparablePoint:
    """The inputs of :func:`polish_separable`: the loss ``f`` (with bounds), the
    projector onto ``A x = b``, the ADMM point ``x`` and multiplier ``lam = rho u``,
    the last coordinate-wise repaired dual point (or ``None``), ``rho``, the objective's
    constant and the tolerances."""

    f: SeparableLoss
    proj: AffineProjector | ForestProjector
    x: np.ndarray
    lam: np.ndarray
    lam_dual: np.ndarray | None
    rho: float
    constant: float
    eps_abs: float
    eps_rel: float
    #: the candidate that gave the last polished point of this solve: tried first
    first: tuple | None = None
    #: candidates that failed last time: tried last, and only while none has given a point
    later: tuple = ()
    #: a scheduled try (the ADMM goes on): stop at the first candidate that gives a point
    scheduled: bool = False
    #: the largest coefficient of ``A``'s rows (:func:`_feasible_tol`), read once
    row_coefficient: float = field(init=False)

    def __post_init__(self) -> None:
        self.row_coefficient = _row_coefficient(self.proj)


def polish_separable(p: SeparablePoint) -> PolishResult:
    """Polish the separable splitting's iterate (needs ``A x = b``).

    Candidates: the regularized weighted projection described above, and (when it
    does not certify) the *face projection*: on the optimal face of a pure-L1 problem
    the linear part ``sigma w1`` is constant, so its free coordinates are simply moved
    as little as possible from the ADMM iterate onto ``A x = b`` with the active set
    fixed.  The first amplifies a slightly wrong sign by ``1/delta`` (it can collapse
    every coordinate onto a bound); the second does not.  Each is tried with the active
    set read off the primal and off the dual point (complementary slackness): the dual
    point's accuracy can misplace a coordinate on a bound, the primal's a sign.
    The smallest certified gap wins.

    The order (``(use_dual, face)``, :data:`_ORDER_L1`): every candidate was run at each of
    242 polishes (trees of 600-4,000 nodes with sparse counts, OpenDP's layout, tables,
    geographies, the stress set's tree kinds); no polish was certified by a dual-point
    candidate alone, 38 only by primal ones, and on pure-L1 trees the dual candidates failed
    after 5-6 rounds where the primal face certified in 1-2: primal face first took 195
    rounds where dual first took 335 (trees; OpenDP's layout 37 against 160).  A dual
    candidate stays second, the first two being all that very large problems try.  With
    smooth coordinates beside the pure-L1 ones the regularised candidates go first
    (:data:`_ORDER_MIXED`).  A scheduled try (``p.scheduled``: the ADMM goes on, and a final
    polish tries everything) stops at the first candidate that gives a point: on the pure-L1
    polishes above, when the first point was not certified no later candidate's was, and
    the trees' rounds fell from 195 to 69.

    Within one solve the same candidates tend to win and to fail (a sparse tree of
    5,000 leaves: the dual point's guesses failed after 6 rounds at each of three
    polishes, 70 % of the solve's time, while the primal's certified in 2): ``p.first``
    is tried first, and the candidates in ``p.later`` only while none has given a point."""
    f = p.f
    has_l1 = bool(np.any(f.pure_l1 & (f.w1 > 0)))
    variants = (_ORDER_MIXED if np.any(f.w2 > 0) else _ORDER_L1) if has_l1 else _ORDER_SMOOTH
    if f.y.size > _POLISH_VARIANTS_MAX_N:
        variants = variants[:2]
    variants = sorted(variants, key=lambda v: (v != p.first, v in p.later))
    best, reason, rounds, failed = None, None, 0, []
    tried: list[tuple[bool, _ActiveSet]] = []
    for use_dual, face in variants:
        if best is not None and (use_dual, face) in p.later:
            break
        act = _separable_active_set(p, use_dual)
        # the dual point may not move the guess (no pure-L1 coordinate it decides, or no
        # repaired dual point): the same inputs would repeat the same rounds
        if any(face == f0 and act.same_as(a0) for f0, a0 in tried):
            continue
        tried.append((face, act.copy()))
        pol = _polish_separable_once(p, act, face)
        rounds += pol.rounds
        if reason is None or pol.ok:
            reason = pol.reason
        if not pol.ok:
            failed.append((use_dual, face))
        if pol.ok and (best is None or pol.certified_gap < best.certified_gap):
            best, best.variant = pol, (use_dual, face)
        if best is not None and (best.certified_gap <= p.eps_rel or p.scheduled):
            break
    if best is None:
        out = _failed(reason, rounds)
        out.failed = tuple(failed)
        return out
    best.reason, best.rounds, best.failed = reason, rounds, tuple(failed)
    return best


@dataclass
class _ActiveSet:
    """Guess of the optimal active set: bounds hit, zero residuals, residual signs."""

    at_lo: np.ndarray
    at_hi: np.ndarray
    zero: np.ndarray
    sigma: np.ndarray

    def copy(self) -> "_ActiveSet":
        return _ActiveSet(self.at_lo.copy(), self.at_hi.copy(), self.zero.copy(), self.sigma.copy())

    def same_as(self, other: "_ActiveSet") -> bool:
        return (np.array_equal(self.at_lo, other.at_lo) and np.array_equal(self.at_hi, other.at_hi)
                and np.array_equal(self.zero, other.zero) and np.array_equal(self.sigma, other.sigma))


def _separable_active_set(p: SeparablePoint, use_dual: bool) -> _ActiveSet:
    f = p.f
    r = p.x - f.y
    at_lo = p.x <= f.lower
    at_hi = p.x >= f.upper
    act = _ActiveSet(at_lo, at_hi, (f.w1 > 0) & (r == 0) & ~(at_lo | at_hi), np.sign(r))
    if use_dual and p.lam_dual is not None:
        _identify_from_dual(f, -p.lam_dual, act)
    return act


@dataclass
class _Targets:
    """What the weighted projections of one polish variant share: the curvature ``h``
    and the parts of ``h t`` that do not depend on the residual signs."""

    h: np.ndarray                # w2, or delta where w2 = 0
    w2y: np.ndarray              # w2 y
    extra: np.ndarray            # delta xhat where w2 = 0 (the pull towards the ADMM point)
    smooth: np.ndarray           # w2 > 0
    face: bool                   # face projection: no linear term where w2 = 0


def _targets(p: SeparablePoint, delta: float, face: bool) -> _Targets:
    f = p.f
    smooth = f.w2 > 0
    return _Targets(h=np.where(smooth, f.w2, delta), w2y=f.w2 * f.y,
                    extra=np.where(smooth, 0.0, delta * p.x), smooth=smooth, face=face)


def _fixed_projection(p: SeparablePoint, act: _ActiveSet, tg: _Targets, zero_weight):
    """The weighted projection above with the zero residuals held by ``zero_weight``
    (``inf``: fixed); ``None`` when it has no solution."""
    f = p.f
    on_bound = act.at_lo | act.at_hi
    q = tg.w2y - act.sigma * f.w1 + tg.extra
    if tg.face:
        q = np.where(tg.smooth, q, tg.extra)
    target = np.where(on_bound, np.where(act.at_lo, f.lower, f.upper), np.where(act.zero, f.y, q / tg.h))
    weights = np.where(on_bound, np.inf, np.where(act.zero, zero_weight, tg.h))
    if isinstance(p.proj, ForestProjector):
        return TreeLSQ(p.proj.forest, weights).project(target, p.proj.offsets)
    fixed = on_bound | (act.zero & np.isinf(zero_weight))
    return _weighted_affine_projection(p.proj, target, weights, fixed)


def _max_residual(proj, x) -> float:
    return float(np.max(np.abs(proj.residual(x)), initial=0.0))


def _row_coefficient(proj) -> float:
    """The largest coefficient of the rows of ``A x = b`` (at least 1)."""
    if isinstance(proj, ForestProjector):
        return max(1.0, float(np.max(np.abs(proj.row_scale), initial=1.0)))
    A = proj.A
    return max(1.0, float(abs(A).max())) if (A.nnz if sp.issparse(A) else np.size(A)) else 1.0


def _feasible_tol(p: SeparablePoint, x: np.ndarray) -> float:
    """``eps_abs`` plus the rounding floor of a residual of ``A x = b`` at ``x``: the
    contract's (:data:`cvxdp.solvers.result.ROUNDING` times the rows' largest term, here
    ``max |x|`` times the largest coefficient, read once per polish).  Without it counts of
    1e8-1e9 left the polish's exact point "inconsistent" by 2e-6 to 8e-6, rounding, and the
    answer without duals (the stress set's seed 29)."""
    return p.eps_abs + ROUNDING * p.row_coefficient * float(np.max(np.abs(x), initial=1.0))


def _polish_separable_once(p: SeparablePoint, act: _ActiveSet, face: bool) -> PolishResult:
    """Rounds of weighted projection and active-set correction from the guess ``act``
    (updated in place) until the set is final, then the certificate."""
    f = p.f
    # face: any positive weight, no linear term on the pure-L1 coordinates
    tg = _targets(p, p.rho if face else _DELTA_REL * p.rho, face)
    tight = _MOVE_RTOL * (1.0 + float(np.max(np.abs(f.y), initial=0.0)))
    reason = None
    for rnd in range(1, _ROUNDS + 1):
        x = _fixed_projection(p, act, tg, np.where(act.zero, np.inf, 0.0))
        if x is None:
            return _failed(reason or "weighted projection has no solution", rnd)
        resid = _max_residual(p.proj, x)
        if resid > _feasible_tol(p, x) and act.zero.any():
            x = _release_conflicts(p, act, tg, resid, tight)
            if x is None:
                return _failed(reason or "weighted projection has no solution", rnd)
        free = ~(act.at_lo | act.at_hi | act.zero)
        changed = _correct_active_set(x, free, free & (f.w1 > 0), act.sigma * (x - f.y),
                                      f.lower, f.upper, p.eps_abs, tight, act)
        if changed is None:
            return _certify_separable(p, x, rnd)
        reason = changed
    return _failed(reason, _ROUNDS)


def _release_conflicts(p: SeparablePoint, act: _ActiveSet, tg: _Targets, resid, tight):
    """The fixed values conflict: a node with tiny ``|y|`` next to a bound can look like
    a zero residual while the optimum has it on the bound.  Holding the zero residuals
    by a heavy but finite weight lets the conflict resolve; nodes that move by a good
    fraction of the conflict are released (in place), then the projection is redone."""
    xs = _fixed_projection(p, act, tg, np.where(act.zero, _HEAVY * p.rho, 0.0))
    if xs is None:
        return None
    moved = act.zero & (np.abs(xs - p.f.y) > max(tight, _CONFLICT_FRACTION * resid))
    act.sigma = np.where(moved, np.sign(xs - p.f.y), act.sigma)
    act.zero &= ~moved
    return _fixed_projection(p, act, tg, np.where(act.zero, np.inf, 0.0))


def _certify_separable(p: SeparablePoint, x: np.ndarray, rounds: int) -> PolishResult:
    """Feasibility, objective, exact multipliers and their dual value at ``x``."""
    resid = _max_residual(p.proj, x)
    if resid > _feasible_tol(p, x):
        return _failed(f"fixed values inconsistent (residual {resid:.1e})", rounds)
    f = p.f
    x = f.clip(x)
    lam = _exact_multiplier(f, p.proj, x, p.lam)
    lower, _ = separable_dual_value(f, p.proj, None, lam, p.constant)
    if not math.isfinite(lower):
        lower, _ = separable_dual_value(f, p.proj, None, p.lam, p.constant)
    duals = separable_multipliers(f, p.proj, None, x, lam, p.eps_abs)
    return PolishResult(x=x, objective=f.value(x) + p.constant, duals=duals, lower_bound=lower,
                        reason="ok", rounds=rounds)


def _identify_from_dual(f: SeparableLoss, s: np.ndarray, act: _ActiveSet) -> None:
    """Refine the active-set guess of the pure-L1 coordinates from a (repaired,
    near-optimal) dual point ``s = -lam`` by complementary slackness: ``s`` strictly
    inside ``(-w, w)`` means a zero residual (or, when ``y`` lies outside the bounds, the
    nearest bound); beyond ``w`` in absolute value means the bound on that side; at
    ``+-w`` the residual is free with that sign.  Coordinates near a threshold keep
    the primal guess.  ``act`` is updated in place."""
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
    act.at_lo[decided] = new_lo[decided]
    act.at_hi[decided] = new_hi[decided]
    act.zero[decided] = new_zero[decided]
    edge = on_edge & ~act.at_lo & ~act.at_hi
    act.zero[edge] = False
    act.sigma[edge] = np.sign(s[edge])


def _correct_active_set(x, free, signed_rows, signed_res, lower, upper, feas_tol, tight,
                        act: _ActiveSet) -> str | None:
    """One round of active-set corrections, in place: free coordinates past a bound
    join it; L1 residuals whose sign flipped (``signed_res < 0`` on ``signed_rows``)
    are zero at the optimum.  Returns what changed, or ``None`` (the set is final)."""
    new_lo = free & (x < lower - feas_tol)
    new_hi = free & (x > upper + feas_tol)
    flipped = signed_rows & (signed_res < -tight)
    if flipped.size == new_lo.size:
        flipped &= ~new_lo & ~new_hi
    if not (new_lo.any() or new_hi.any() or flipped.any()):
        return None
    act.at_lo |= new_lo
    act.at_hi |= new_hi
    act.zero |= flipped
    return (f"active set changed: {int(new_lo.sum() + new_hi.sum())} bounds, "
            f"{int(flipped.sum())} sign flips")


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


def _exact_multiplier(f: SeparableLoss, proj, x, lam_admm):
    """A multiplier ``lam in range(A^T)`` with ``-lam in df(x)``, close to ``lam_admm``."""
    L, U = subdifferential_box(f, x)         # lam_v must lie in [L_v, U_v]
    if isinstance(proj, ForestProjector):
        lam = forest_dual(proj, L, U, lam_admm)
        return lam_admm if lam is None else lam
    # general A: least-squares multipliers for the clipped target
    return proj.A.T @ proj.multipliers(np.clip(lam_admm, L, U))


# ---------------------------------------------------------------------------
# general splitting
@dataclass
class GeneralPoint:
    """The inputs of :func:`polish_general`: the problem (``ConsistencyData``: ``M``,
    ``y``, ``w1``, ``w2``, bounds, ``A``, ``b``, constant; no order chains), the ADMM
    point ``x``, its loss residuals ``r`` (``M x - y`` as split), the bounds block's
    copy ``x_bounds`` (``x`` when there is none), ``rho`` and ``eps_abs``."""

    data: object
    x: np.ndarray
    r: np.ndarray
    x_bounds: np.ndarray
    rho: float
    eps_abs: float


def polish_general(p: GeneralPoint) -> PolishResult:
    """Active-set polish for the general splitting (any ``M``; bounds and ``A x = b``).

    Rows whose residual the prox set exactly to zero are held at zero, coordinates the
    bounds block clipped are fixed, the remaining residual signs are known; the rest
    is the equality-constrained quadratic program

        min  sum_{i not in R0} sigma_i w1_i r_i + (1/2) r^T W2 r + (delta/2)|x_F - xhat_F|^2
        s.t. r = M x - y,  r_R0 = 0,  A x = b,  x_S = bounds,

    solved through its KKT system.  The multipliers are then recomputed with
    ``delta = 0`` by least squares (exact stationarity on the free coordinates) and
    the dual value is evaluated; a wrong active set shows up as a sign or bound
    violation, or as a gap, and the ADMM iterations continue."""
    d = p.data
    w1 = d.w1
    act = _ActiveSet(p.x_bounds <= d.lower, p.x_bounds >= d.upper, (w1 > 0) & (p.r == 0), np.sign(p.r))
    tight = _MOVE_RTOL * (1.0 + float(np.max(np.abs(d.y), initial=0.0)))
    reason = None
    for rnd in range(1, _ROUNDS + 1):
        x, eq_res = _general_kkt_solve(p, act)
        if x is None:
            return _failed("singular KKT system", rnd)
        r = d.M @ x - d.y
        if eq_res > p.eps_abs:
            moved = act.zero & (np.abs(r) > max(tight, _CONFLICT_FRACTION * eq_res))
            if not moved.any():
                return _failed(f"fixed residuals inconsistent ({eq_res:.1e})", rnd)
            act.sigma = np.where(moved, np.sign(r), act.sigma)
            act.zero &= ~moved
            continue
        free = ~(act.at_lo | act.at_hi)
        changed = _correct_active_set(x, free, ~act.zero & (w1 > 0), act.sigma * r,
                                      d.lower, d.upper, p.eps_abs, tight, act)
        if changed is None:
            return _certify_general(p, x, act, rnd)
        reason = changed
    return _failed(reason, _ROUNDS)


def _general_kkt_solve(p: GeneralPoint, act: _ActiveSet):
    """``(x, equality residual)`` of the QP above for the active set ``act``, or
    ``(None, inf)`` when its KKT system is singular."""

    d = p.data
    M = d.M.tocsr()               # the loss rows only (the penalty split appends A)
    A = d.A if d.A is not None and d.A.shape[0] > 0 else None
    scale = 1.0 + float(np.max(np.abs(d.y), initial=0.0))
    S = act.at_lo | act.at_hi
    F = ~S
    xS = np.where(act.at_lo, d.lower, d.upper)[S]
    MF, MS = M[:, F], M[:, S]
    ytil = d.y - MS @ xS
    delta = _DELTA_REL * p.rho
    H = (MF.T @ sp.diags(d.w2) @ MF).tocsc() + delta * sp.identity(int(F.sum()), format="csc")
    q = MF.T @ (d.w2 * ytil - np.where(act.zero, 0.0, act.sigma * d.w1)) + delta * p.x[F]
    rows, rhs = [MF[act.zero]], [ytil[act.zero]]
    if A is not None:
        rows.append(A[:, F])
        rhs.append(d.b - A[:, S] @ xS)
    E = sp.vstack(rows).tocsc()
    e = np.concatenate(rhs)
    K = sp.bmat([[H, E.T], [E, -_KKT_REG * scale * sp.identity(E.shape[0], format="csc")]], format="csc")
    try:
        sol = spla.splu(K).solve(np.r_[q, e]) if K.shape[0] > _DENSE_KKT_MAX \
            else la.solve(K.toarray(), np.r_[q, e])
    except (RuntimeError, la.LinAlgError):
        return None, math.inf
    xF = sol[: F.sum()]
    x = np.empty(d.n)
    x[F] = xF
    x[S] = xS
    return x, float(np.max(np.abs(E @ xF - e), initial=0.0))


def _certify_general(p: GeneralPoint, x: np.ndarray, act: _ActiveSet, rounds: int) -> PolishResult:
    """Objective at the clipped ``x`` and exact multipliers (``delta = 0``):
    ``u_i = sigma w1 + w2 r`` off the zero rows ``R0``; ``(u_R0, y_A)`` by least squares
    so that ``M_F^T u + A_F^T y_A = 0``; the rest is the bounds' share."""

    d = p.data
    M = d.M.tocsr()
    A = d.A if d.A is not None and d.A.shape[0] > 0 else None
    x = np.clip(x, d.lower, d.upper)
    r = M @ x - d.y
    obj = float(np.dot(d.w1, np.abs(r)) + 0.5 * np.dot(d.w2, r * r)) + d.constant
    F = ~(act.at_lo | act.at_hi)
    u = np.where(act.zero, 0.0, act.sigma * d.w1) + d.w2 * r
    cols = [M[act.zero][:, F].T] + ([A[:, F].T] if A is not None else [])
    B = sp.hstack(cols).tocsr()
    target = -(M[:, F].T @ u)
    if B.shape[1]:
        zsol = spla.lsqr(B, target, atol=1e-14, btol=1e-14, iter_lim=10 * B.shape[1])[0] \
            if B.shape[0] > _DENSE_LSQ_MAX else np.linalg.lstsq(B.toarray(), target, rcond=None)[0]
    else:
        zsol = np.zeros(0)
    nz = int(act.zero.sum())
    u[act.zero] += zsol[:nz]
    yA = zsol[nz:] if A is not None else np.zeros(0)
    g = M.T @ u + (A.T @ yA if A is not None else 0.0)       # = s_lo - s_up
    gtol = _GRADIENT_ZERO_RTOL * max(1.0, float(np.max(np.abs(u), initial=0.0)))
    if A is not None:
        yA, g = _settle_fixed_rows(A, F, act, yA, g, gtol)
    g = np.where(np.abs(g) <= gtol, 0.0, g)
    duals = {"lower": np.where(act.at_lo, np.maximum(g, 0.0), 0.0),
             "upper": np.where(act.at_hi, np.maximum(-g, 0.0), 0.0)}
    if A is not None:
        duals["eq"] = yA
    return PolishResult(x=x, objective=obj, duals=duals, lower_bound=_general_dual_value(d, u, yA, g),
                        reason="ok", rounds=rounds, w=u)


def _settle_fixed_rows(A: sp.spmatrix, F: np.ndarray, act: _ActiveSet, yA: np.ndarray,
                       g: np.ndarray, gtol: float) -> tuple[np.ndarray, np.ndarray]:
    """The multipliers of the equality rows that read fixed coordinates only (a chain of
    single children all at zero, say) are left at zero by the least squares, whose unknowns
    are the free coordinates' equations; the bound multipliers ``g`` may then have the wrong
    sign there although the point is optimal.  Here they are chosen so that ``g >= 0`` at
    lower bounds and ``g <= 0`` at upper ones (a feasibility LP over those rows; their
    ``b`` term in the dual value is ``y^T (A x_S - b) = 0`` at the fixed point).  Unchanged
    when nothing is violated, no such row exists, or the LP has no solution."""
    lo, hi = act.at_lo & ~act.at_hi, act.at_hi & ~act.at_lo     # l = u: any sign
    if not np.any((lo & (g < -gtol)) | (hi & (g > gtol))):
        return yA, g
    A = sp.csr_matrix(A)
    rows = np.flatnonzero(np.diff(A[:, F].tocsr().indptr) == 0)
    if rows.size == 0:
        return yA, g
    from scipy.optimize import linprog

    AT = A[rows].T.tocsr()
    A_ub = sp.vstack([-AT[lo], AT[hi]]).tocsr()
    b_ub = np.r_[g[lo], -g[hi]]
    sol = linprog(np.zeros(rows.size), A_ub=A_ub, b_ub=b_ub, bounds=(None, None), method="highs",
                  options={"primal_feasibility_tolerance": 1e-10})
    if sol.status != 0:
        return yA, g
    yA = yA.copy()
    yA[rows] += sol.x
    return yA, g + AT @ sol.x


def _general_dual_value(d, u, yA, g) -> float:
    """``-sum phi*(u) - u^T y - yA^T b + min_{l <= x <= u} g^T x`` with ``g = M^T u + A^T yA``."""
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

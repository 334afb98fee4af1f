"""The exact solution on the active set an interior-point iterate points at
(:func:`polish`, the second half of :mod:`cvxdp.solvers.consistency.ipm`'s route).

Near the optimum the interior point's iterate tells which bounds are hit and which L1 rows
sit at their kink (:class:`~cvxdp.solvers.consistency.ipm.IPMResult`); fixing them leaves an
equality-constrained QP, one quasi-definite solve, whose solution and multipliers are exact
where the interior point's are accurate only to its tolerance.  A guess the solution
contradicts is corrected and the solve repeated.
"""
from __future__ import annotations

import math

import numpy as np
import qdldl
import scipy.sparse as sp
import scipy.sparse.linalg as spla
from scipy.linalg import lapack

from .ipm import _DUAL_REG, _REFINE, IPMResult, _small
from .kkt import has_chains, has_eq

__all__ = ["polish"]


# the polish's proximal weight (relative to the Hessian's diagonal): keeps the reduced
# problem strictly convex where no squared row reaches a free coordinate
_POLISH_PROX = 1e-10
# rounds of active-set corrections, and the (relative) tolerance of their tests
_POLISH_ROUNDS = 8
_POLISH_TOL = 1e-9
# the polish's system dense (LAPACK's LU) up to this many unknowns
_POLISH_DENSE = 400
# stationarity on the free coordinates refitted (least squares, this many LSQR iterations at
# most) when the solve left it off by more than this, relative to its terms
_REFIT_RTOL = 1e-9
_REFIT_ITERS = 200


def polish(d, res: IPMResult, eps_abs: float, rounds: int | None = None):
    """The exact solution on the active set the interior point points at: bounds hit fixed,
    L1 rows at their kink held at zero residual, the other L1 rows' signs known, which
    leaves the equality-constrained QP

        min  sum_{i not kink} sigma_i w1_i r_i + (w2_i / 2) r_i^2,   r = M x - y,
        s.t. r_kink = 0,  A x = b,  x_S = bounds,

    one sparse quasi-definite solve (QDLDL), whose multipliers are the kink rows' and the
    equalities' ones; the bound multipliers are what stationarity leaves on the fixed
    coordinates.  A guess the solution contradicts (a free coordinate past a bound, a
    residual changing sign, a kink multiplier outside ``[-w1, w1]``, a bound multiplier of
    the wrong sign) is corrected and the solve repeated, ``rounds`` times at most (default
    :data:`_POLISH_ROUNDS`).
    Returns ``(x, duals, w)`` or ``None`` (order chains; no consistent active set found;
    a failed factorisation)."""
    if has_chains(d):
        return None
    at_lo, at_hi, kink = res.at_lo.copy(), res.at_hi.copy(), res.kink & (d.w1 > 0)
    M = d.M.tocsr()
    A = d.A.tocsr() if has_eq(d) else sp.csr_matrix((0, d.n))
    if _small(M.shape[0], d.n, A.shape[0]):
        # small: dense arrays (scipy's column slicing and stacking were half the polish)
        M, A = M.toarray(), A.toarray()
    sigma = np.sign(M @ res.x - d.y)
    for _ in range(_POLISH_ROUNDS if rounds is None else rounds):
        out = _polish_solve(d, M, A, res.x, at_lo, at_hi, kink, sigma)
        if out is None:
            return None
        x, duals, w, lam_k, r = out
        tol = _POLISH_TOL * max(1.0, float(np.max(np.abs(w), initial=0.0)))
        xtol = max(eps_abs * 1e-3, _POLISH_TOL * (1.0 + float(np.max(np.abs(x), initial=0.0))))
        changed = False
        free = ~(at_lo | at_hi)
        lo_bad = free & (x < d.lower - xtol)
        hi_bad = free & (x > d.upper + xtol)
        if lo_bad.any() or hi_bad.any():
            at_lo |= lo_bad
            at_hi |= hi_bad
            changed = True
        out_k = np.abs(lam_k) > d.w1[kink] + tol
        flip = ~kink & (d.w1 > 0) & (sigma * r < -xtol)
        if out_k.any():                                  # released off the kink
            idx = np.flatnonzero(kink)[out_k]
            kink[idx] = False
            sigma[idx] = np.sign(lam_k[out_k])
            changed = True
        if flip.any():                                   # the residual crossed zero: a kink
            kink |= flip
            changed = True
        bad_lo = at_lo & ~at_hi & (duals["g"] < -tol)
        bad_hi = at_hi & ~at_lo & (duals["g"] > tol)
        if bad_lo.any() or bad_hi.any():
            at_lo &= ~bad_lo
            at_hi &= ~bad_hi
            changed = True
        if not changed:
            duals.pop("g")
            return np.clip(x, d.lower, d.upper), duals, w
    return None


def _polish_solve(d, M, A, x_ipm, at_lo, at_hi, kink, sigma):
    n = d.n
    S = at_lo | at_hi
    F = ~S
    xS = np.where(at_lo, d.lower, d.upper)
    nk = ~kink
    MF = M[:, F]
    w2 = np.where(nk, d.w2, 0.0)
    x_fixed = np.where(S, xS, 0.0)
    y_eff = d.y - M @ x_fixed                              # r = M_F x_F - y_eff
    nF = int(F.sum())
    if isinstance(M, np.ndarray):
        E = np.vstack([MF[kink], A[:, F]])
    else:
        E = sp.vstack([MF[kink], A[:, F]]).tocsr()
    e = np.r_[y_eff[kink], (d.b - A @ x_fixed) if A.shape[0] else np.zeros(0)]
    small = isinstance(M, np.ndarray) or (nF + E.shape[0]) <= _POLISH_DENSE
    if small and not isinstance(M, np.ndarray):
        MF, E = MF.toarray(), E.toarray()
    H = MF.T @ (w2[:, None] * MF) if small else (MF.T @ sp.diags(w2) @ MF).tocsc()
    dscale = max(float(np.abs(H.diagonal()).max(initial=0.0)), float(np.max(d.w1, initial=0.0)), 1e-300)
    prox = _POLISH_PROX * dscale
    g0 = MF.T @ np.where(nk, np.where(d.w1 > 0, sigma * d.w1, 0.0) - w2 * y_eff, 0.0) - prox * x_ipm[F]
    sol = _polish_system(H, E, prox, dscale, np.r_[-g0, e])
    if sol is None or not np.all(np.isfinite(sol)):
        return None
    x = x_fixed.copy()
    x[F] = sol[:nF]
    r = M @ x - d.y
    nkink = int(kink.sum())
    # the KKT system says H x + g0 + E^T lam = 0, i.e. M_F^T w + A_F^T lam_A = 0 with
    # w = sigma w1 + w2 r off the kinks and lam on them (r = 0 there)
    w_nk = np.where(nk, np.where(d.w1 > 0, sigma * d.w1, 0.0) + d.w2 * r, 0.0)
    lam, w, yA, g = _refit(M, A, E, F, w_nk, kink, d.w2 * r, sol[nF:])
    lam_k = lam[:nkink]
    duals = {"lower": np.zeros(n), "upper": np.zeros(n)}
    if A.shape[0]:
        duals["eq"] = yA
    duals["lower"] = np.where(at_lo, np.maximum(g, 0.0), 0.0)
    duals["upper"] = np.where(at_hi, np.maximum(-g, 0.0), 0.0)
    duals["g"] = g
    return x, duals, w, lam_k, r


def _refit(M, A, E, F, w_nk, kink, w2r, lam: np.ndarray) -> tuple:
    """``(lam, w, yA, g)`` (:func:`_stationarity`): the multipliers ``lam`` of the kink and
    equality rows, refitted by least squares to stationarity on the free coordinates,
    ``E_F^T lam = -(M^T w)_F`` (``w_nk``: the loss multipliers off the kinks), when the solve
    left it off by more than rounding.

    The solve's right-hand side carries ``M^T W y``, which cancels against ``H x`` to the
    gradient: with answers of 1e7 under weights of 1,000 (an optimum of 0.0047, a gradient of
    97) stationarity was off by 7e-6, and that residual, read as a bound multiplier on a cell
    of 9,930, cost the Lagrangian bound 0.069.  The least-squares problem carries only the
    gradient's own magnitude."""
    first = _stationarity(M, A, w_nk, kink, w2r, lam)
    gF = first[3][F]
    off = float(np.max(np.abs(gF), initial=0.0))
    if E.shape[0] == 0 or off <= _REFIT_RTOL * float(np.max(np.abs(lam), initial=0.0)):
        return first
    terms = float(np.max(np.abs(np.asarray(M.T @ w_nk, dtype=float)[F]), initial=0.0))
    if off <= _REFIT_RTOL * terms:
        return first
    with np.errstate(all="ignore"):
        refit = lam + spla.lsqr(E.T, -gF, atol=1e-16, btol=1e-16, iter_lim=_REFIT_ITERS)[0]
    if not np.all(np.isfinite(refit)):
        return first
    second = _stationarity(M, A, w_nk, kink, w2r, refit)
    return second if float(np.max(np.abs(second[3][F]), initial=0.0)) < off else first


def _stationarity(M, A, w_nk, kink, w2r, lam: np.ndarray) -> tuple:
    """``(lam, w, yA, g)``: the loss multipliers ``w`` (``w_nk`` off the kinks, the kink
    rows' ``lam`` plus ``w2 r`` on them), the equality ones ``yA`` and ``g = M^T w + A^T yA``
    (``= s_lo - s_up``, zero on the free coordinates at stationarity)."""
    nkink = int(kink.sum())
    w = w_nk.copy()
    w[kink] = lam[:nkink] + w2r[kink]
    yA = lam[nkink:]
    g = M.T @ w + (A.T @ yA if A.shape[0] else 0.0)
    return lam, w, yA, np.asarray(g, dtype=float)


def _polish_system(H, E, prox: float, hscale: float, rhs: np.ndarray) -> np.ndarray | None:
    """``[H + prox I, E^T; E, 0] sol = rhs`` (``hscale``: ``H``'s largest diagonal entry) by
    a factorisation of the system with ``-dreg I`` in place of its zero block, refined
    against the exact one: QDLDL for sparse ``H``, ``E``, LAPACK's LU for dense ones (small
    systems, where building the sparse matrices and QDLDL's analysis took most of the
    polish's 5 ms at n = 100).

    ``E``'s rows are scaled to norm ``sqrt(hscale)`` first, so that the Schur complement
    ``E H^-1 E^T`` is of order one where ``dreg = _DUAL_REG hscale`` is compared with it: with
    ``H`` of 2e6 (weights 1,000) and ``E`` of ones, ``dreg`` had been 400 times the Schur
    complement, each refinement step gained almost nothing and the polished point missed the
    equalities by 1.5e-3."""
    nF, m_e = H.shape[0], E.shape[0]
    rs = _row_scale(E, hscale)
    E = rs[:, None] * E if isinstance(E, np.ndarray) else sp.diags(rs) @ E
    rhs = np.r_[rhs[:nF], rs * rhs[nF:]]
    dreg = _DUAL_REG * hscale
    if isinstance(H, np.ndarray):
        Kexact = np.zeros((nF + m_e, nF + m_e))
        Kexact[:nF, :nF] = H + prox * np.eye(nF)
        Kexact[:nF, nF:] = E.T
        Kexact[nF:, :nF] = E
        K = Kexact.copy()
        K[nF:, nF:] -= dreg * np.eye(m_e)
        # LAPACK directly (scipy's lu_factor / lu_solve wrappers: 40 us of checks a call)
        lu, piv, info = lapack.dgetrf(K, overwrite_a=1)
        if info != 0 or not np.all(np.isfinite(lu.diagonal())):
            return None

        def apply(v):
            return lapack.dgetrs(lu, piv, v)[0]
    else:
        Hr = H + prox * sp.identity(nF, format="csc")
        K = sp.bmat([[Hr, E.T], [E, -dreg * sp.identity(m_e)]], format="csc") if m_e else Hr
        Kexact = sp.bmat([[Hr, E.T], [E, None]], format="csc") if m_e else Hr
        try:
            solver = qdldl.Solver(K)
        except (RuntimeError, ValueError):
            return None
        apply = solver.solve
    # each block refined to rounding of its own right-hand side: the stationarity block's
    # (the loss's M^T W y, 2e10 in the case above) had set the bar for the equality rows' too,
    # which stopped 2e-8 off a total of 1e4 where a gradient of 97 made that 2e-6 of objective
    tol = 1e-15 * (1.0 + np.r_[np.full(nF, np.abs(rhs[:nF]).max(initial=0.0)),
                               np.full(m_e, np.abs(rhs[nF:]).max(initial=0.0))])
    with np.errstate(all="ignore"):
        sol = apply(rhs)
        for _ in range(_REFINE):
            resid = rhs - Kexact @ sol
            if np.all(np.abs(resid) <= tol):
                break
            sol = sol + apply(resid)
    sol[nF:] *= rs                            # the multipliers of the unscaled rows
    return sol


def _row_scale(E, hscale: float) -> np.ndarray:
    """Factors that give ``E``'s rows the norm ``sqrt(hscale)`` (zero rows kept as they are)."""
    norms = (np.sqrt(np.einsum("ij,ij->i", E, E)) if isinstance(E, np.ndarray)
             else np.sqrt(np.asarray(E.multiply(E).sum(axis=1)).ravel()))
    return np.where(norms > 0, math.sqrt(hscale) / np.where(norms > 0, norms, 1.0), 1.0)

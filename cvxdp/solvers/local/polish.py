"""Active-set polish for the local-polytope ADMM: the equality-constrained QP on a guessed face.

The ADMM's ``nu`` iterate names a face: the cells it holds at zero (``nu_i = 0``) and, for
cells with an absolute row, the cells it holds at their kink (``nu_i = b_i``).  Fixing those
(``x_Z = f_Z``) and keeping the others (``S``) where the ADMM left them leaves, when every cell
in ``S`` has a squared row (``A_i > 0``), the strictly convex program

    minimize  sum_{i in S} A_i/2 x_i^2 - k_i x_i      subject to  (I - P) x = c,   x_Z = f_Z,

with ``k_i = C_i - w_i sign(nu_i - b_i)``, ``P`` the projection onto the consistent directions
(:meth:`RegionGraph.project` with total 0, or with a free total) and ``c = (I - P) U`` (``U``
the uniform tables with the total; ``0`` for a free total).  Its optimality conditions,

    x_S = (k_S - mu_S) / A_S,     (I - P) D (I - P) mu = (I - P)(E_S k_S / A_S + E_Z f_Z) - c,

``D = diag(1/A_S, 0_Z)``, are solved for ``mu`` in the range of ``I - P`` by conjugate gradients
(two projections per step).  ``mu`` is orthogonal to the consistent directions and makes
``grad L + mu`` vanish on ``S``: it is the ``lam`` of the ADMM's lower bound, exact when the face
is the optimal one (then ``grad L + mu >= 0`` on the zero cells: complementary slackness).
Nothing is trusted: the caller repairs the point into the polytope and certifies both.
"""
from __future__ import annotations

import numpy as np

from .region_graph import RegionGraph
from .loss import CellLoss

__all__ = ["polish"]

# conjugate-gradient steps and relative residual
_CG_STEPS = 100
_CG_TOL = 1e-11


def polish(G: RegionGraph, cells: CellLoss, nu: np.ndarray, total: float | None,
           mu0: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, int] | None:
    """``(x, mu, cg_steps)`` on the face named by ``nu`` (module docstring), or ``None`` when a
    free cell has no squared row (the face program is then not strictly convex)."""
    at_zero = nu <= 0
    at_kink = (cells.w > 0) & (nu == cells.b) & ~at_zero
    fixed = at_zero | at_kink
    free = ~fixed
    if np.any(cells.A[free] <= 0):
        return None
    f = np.where(at_kink, cells.b, 0.0)
    k = np.where(free, cells.C - cells.w * np.sign(nu - cells.b), 0.0)
    inv = np.where(free, 1.0 / np.where(free, cells.A, 1.0), 0.0)
    zero = 0.0 if total is not None else None

    def perp(v):                          # (I - P) v
        return v - G.project(v, zero)
    c = perp(G.uniform(total)) if total is not None else 0.0
    rhs = perp(k * inv + f) - c
    mu = np.zeros(G.n) if mu0 is None else perp(mu0)
    r = rhs - perp(inv * mu)
    d = r.copy()
    rr = float(r @ r)
    tol = _CG_TOL ** 2 * max(float(rhs @ rhs), 1e-300)
    steps = 0
    while steps < _CG_STEPS and rr > tol:
        Hd = perp(inv * d)
        dHd = float(d @ Hd)
        if not dHd > 1e-30 * rr:                  # rounding level: nothing left to gain
            break
        a = rr / dHd
        mu += a * d
        r -= a * Hd
        rr_new = float(r @ r)
        d = r + (rr_new / rr) * d
        rr = rr_new
        steps += 1
    # CG on range(I - P) drifts out of it by rounding: the bound needs mu in it exactly.
    # Twice: the drift can be many times mu itself (a total of 1e7 under weights of 1,000:
    # 1e8 against a mu of 1), and one projection leaves rounding of the drift's size, 2e-8 of
    # mu, which the bound (<mu, x - U>, x - U of 1e7) took as 0.4 % of the optimum (stress
    # set, seed 19); the second leaves rounding of mu's own size, which the bound allows for
    mu = perp(perp(mu))
    x = np.where(free, (k - mu) * inv, f)
    return G.project(x, total), mu, steps

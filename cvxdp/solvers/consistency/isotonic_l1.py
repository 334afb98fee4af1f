"""The exact path of the consistency family for L1 losses under order chains.

When every loss row is an absolute value of one coordinate (``w |x_i - y_i|``: the Laplace
likelihood of a sorted histogram or a degree sequence), the only constraints are disjoint
order chains and bounds that are the same along each chain, the problem separates into one
weighted L1 isotonic regression per chain, clipped to the chain's bounds (clipping an
isotonic regression to constant bounds solves the bounded problem: the bounded optimum is
the clip of the unbounded one for any separable convex loss), and a median per coordinate
outside the chains.  :func:`cvxdp.solvers.consistency.isotonic.l1_isotonic` solves them exactly in
``O(n log n)`` -- no ADMM iterations; the order multipliers are the lowest the subdifferential
box allows (:func:`cvxdp.solvers.consistency.isotonic.chain_dual_lowest`, vectorised), and the certificate
is the ADMM's own (:func:`cvxdp.solvers.consistency.certify.certify`).
"""
from __future__ import annotations

import time

import numpy as np

from .. import result as R
from .certify import certify
from .duals import separable_multipliers, subdifferential_box
from .kkt import constraint_gradient, lagrangian_bound, separable_loss_multiplier
from .problem import ADMMSettings, ConsistencyData
from .isotonic import chain_dual_lowest, l1_isotonic

#: what :func:`solve` reports as ``info["route"]``
ROUTE = "isotonic L1 (exact)"

__all__ = ["applies", "solve"]


def applies(data: ConsistencyData) -> bool:
    """Pure one-coordinate L1 rows, order chains, no equalities, bounds constant per chain."""
    if not data.has_chains or data.has_eq:
        return False
    f = data.separable_loss()
    if f is None or np.any(f.w2 > 0):
        return False
    for c in data.chains.chains:
        if np.any(f.lower[c] != f.lower[c[0]]) or np.any(f.upper[c] != f.upper[c[0]]):
            return False
    return True


def solve(data: ConsistencyData, settings: ADMMSettings) -> R.SolverResult:
    t0 = time.perf_counter()
    f = data.separable_loss()
    x = np.clip(f.y, f.lower, f.upper)              # coordinates outside the chains: the median
    chains = data.chains.chains
    if chains:
        idx = np.concatenate(chains)
        starts = np.r_[0, np.cumsum([c.size for c in chains])[:-1]]
        sol = l1_isotonic(f.y[idx], f.w1[idx], starts)
        x[idx] = np.clip(sol, f.lower[idx], f.upper[idx])
    fval = data.objective(x)
    L, U = subdifferential_box(f, x, settings.eps_abs)
    lam = chain_dual_lowest(data.chains, L, U)
    duals = separable_multipliers(f, None, data.chains, x, lam if lam is not None else np.zeros(data.n),
                                  settings.eps_abs)
    # the exact multipliers' own Lagrangian bound first, so that the certificate needs no LP
    w = separable_loss_multiplier(data, constraint_gradient(data, duals))
    lower = lagrangian_bound(data, duals, w)
    res = R.SolverResult(x=x, status=R.OPTIMAL, objective=fval, lower_bound=lower, duals=duals,
                         iterations=1, primal_residual=max(data.chains.violation(x), 0.0),
                         info={"route": ROUTE})
    res = certify(data, res, settings, w)
    res.solve_time = time.perf_counter() - t0
    return res

"""Multipliers that certify a marginal-polytope solution, for its cvxpy dual.

The cvxpy dual of ``MarginalPolytope`` is the multiplier ``y`` of the stacked equality
"each measured marginal is the junction-tree table's marginal".  Stationarity in the
marginals gives ``y = -grad loss``; a loss dual point ``lam`` (the gradient of the squared
terms, or the L1 multipliers of an exact finish) gives ``y = -sum_t A_t^T lam_t``, and it is a
certificate exactly when the lower bound it defines closes the gap.
"""
from __future__ import annotations

import numpy as np

from .free_total import free_lower_bound, lams_of
from .junction_tree import JunctionTree
from .loss import MarginalLoss
from .mirror_descent import MarginalProblem
from ..result import SolverResult, relative_gap

__all__ = ["certifying_multipliers"]

# an absolute row whose residual is below this (relative to ``1 + |b|``) is at its kink
_KINK = 1e-6


def _kinks_zeroed(loss: MarginalLoss, x: np.ndarray, lams: list) -> list:
    """``lams`` with the subgradient 0 on absolute rows at their kink.  Mirror descent stays
    in the polytope's interior, so a row the optimum puts at its kink keeps a residual of
    rounding size whose sign picks ``+-w``: with answers that are consistent (no noise) the
    bound of those signs missed ``eps_rel`` in 36 of the stress set's 100 solves, that of 0
    (the loss's own minimum) closes it."""
    out = []
    for t, lam in zip(loss.terms, lams):
        if t.kind == "l1":
            lam = np.where(np.abs(t.apply(x)) <= _KINK * (1.0 + np.abs(t.b)), 0.0, lam)
        out.append(lam)
    return out


def certifying_multipliers(loss: MarginalLoss, tree: JunctionTree, res: SolverResult,
                           total: float, eps_rel: float,
                           total_bound: float | None) -> np.ndarray | None:
    """The multipliers ``y = -sum_t A_t^T lam_t`` of the marginal definitions
    ``marginals == (the table's marginals)`` (flat, cliques stacked), or ``None``.

    ``lam`` is taken from the exact L1/mixed finish (its loss duals), the run's best bound
    (``duals["bound"]``) or the loss gradient at the returned point (absolute rows at their
    kink: ``sign`` or 0), and kept only if its own bound certifies the returned loss ``f``:
    the max-product bound ``min_{mu in M} <A^T lam, mu> - sum_t (lam_t^T b_t + phi_t^*(lam_t))``
    (McKenna et al. 2019, sec. 4) with the total fixed, or, with the total free, the same bound
    over the cone ``{N p : 0 <= N <= total_bound}`` (``c + min(0, m) total_bound``, see
    :mod:`cvxdp.solvers.marginal.free_total`).  Either way ``(f - L) / max(1, |f|) <= eps_rel``."""
    f = float(res.objective)
    candidates = []
    for key in ("loss", "bound"):          # the exact finish's, the run's best bound's
        if res.duals.get(key) is not None and res.duals[key].size:
            candidates.append(lams_of(loss, res.duals[key]))
    grad = loss.value_grad(res.x)[2]
    candidates.append(grad)
    if any(t.kind == "l1" for t in loss.terms):
        candidates.append(_kinks_zeroed(loss, res.x, grad))
    for lams in candidates:
        if total_bound is None:
            if not total > 0:
                continue
            bound = MarginalProblem(tree, loss, total).lower_bound(lams)
        else:
            parts = free_lower_bound(MarginalProblem(tree, loss, 1.0), loss, lams)
            if parts is None:
                continue
            bound = parts[0] + min(0.0, parts[1]) * total_bound
        if relative_gap(f, bound) <= eps_rel:
            return -loss.adjoint(lams)
    return None

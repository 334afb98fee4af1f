"""The privacy cost and the variances of a noise design on a marginal workload, in the residual
basis (ResidualPlanner, Xiao, Wang, Ding, Kifer, NeurIPS 2023; :mod:`.marginal_workload`).

For a :class:`~cvxdp.modelling.marginal_workload.MarginalWorkload` ``W`` and the residual
variances ``s`` (``cp.Variable(W.n_residuals, pos=True)``):

* ``residual_privacy_cost(W, s) = sum_A p_A / s_A``: convex and decreasing in ``s``; the
  squared L2 sensitivity of the design's Gaussian mechanism (zCDP ``rho`` is half of it);
* ``residual_variance(W, s) = V s``: affine; the variance of every cell of each workload
  marginal.

``cvxdp.privacy_cost(W, s)`` and ``cvxdp.query_variance(W, s)`` build these when their first
argument is a workload.  For standard solvers the cost canonicalises to one second-order cone
per residual, ``t_A s_A >= p_A`` written as ``||(2 sqrt(p_A), t_A - s_A)|| <= t_A + s_A``, and
the variance is a plain sparse matrix product, so ``prob.solve(solver=cp.CLARABEL)`` solves
the same model.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import cvxpy as cp
from cvxpy.constraints.constraint import Constraint
from cvxpy.reductions.dcp2cone.canonicalizers import CANON_METHODS

from .convex_atom import ConvexAtom
from .marginal_workload import MarginalWorkload

__all__ = ["ResidualPrivacyCost", "residual_privacy_cost", "residual_variance"]


def _strategy(W: MarginalWorkload, s, atom: str) -> cp.Expression:
    s = s if isinstance(s, cp.Expression) else cp.Constant(np.asarray(s, dtype=float))
    if s.shape != (W.n_residuals,):
        raise ValueError(f"{atom}: s must have shape ({W.n_residuals},), one variance per "
                         f"residual of the workload (W.residuals), got {s.shape}")
    return s


class ResidualPrivacyCost(ConvexAtom):
    """``sum_A p_A / s_A`` over the residuals of ``W`` with ``p_A > 0`` (module docstring):
    convex and decreasing in ``s``."""

    decreasing = True

    def __init__(self, s, W: MarginalWorkload) -> None:
        if not isinstance(W, MarginalWorkload):
            raise TypeError(f"privacy_cost: W must be a MarginalWorkload, got {type(W).__name__}")
        self.W = W
        super().__init__(_strategy(W, s, "privacy_cost"))

    def get_data(self):
        return [self.W]

    @property
    def weights(self) -> np.ndarray:
        return self.W.basis.p

    def numeric(self, values):
        s = np.asarray(values[0], dtype=float).ravel()
        p = self.weights
        on = p > 0
        if np.any(s[on] <= 0):
            return np.inf
        return float(np.sum(p[on] / s[on]))

    def shape_from_args(self):
        return ()

    def sign_from_args(self):
        return (True, False)

    def _domain(self) -> list[Constraint]:
        return [self.args[0] >= 0]

    def _grad(self, values):
        s = np.asarray(values[0], dtype=float).ravel()
        p = self.weights
        on = p > 0
        if np.any(s[on] <= 0):
            return [None]
        g = np.zeros(s.size)
        g[on] = -p[on] / s[on] ** 2
        return [sp.csc_array(g[:, None])]

    def name(self) -> str:
        return f"privacy_cost({self.W!r}, {self.args[0].name()})"

    __repr__ = name


def residual_privacy_cost(W: MarginalWorkload, s) -> ResidualPrivacyCost:
    """``sum_A p_A / s_A``: the squared L2 sensitivity of the design ``s`` on ``W``."""
    return ResidualPrivacyCost(s, W)


def residual_variance(W: MarginalWorkload, s) -> cp.Expression:
    """``V s``: the per-cell variance of each workload marginal under the design ``s``."""
    if not isinstance(W, MarginalWorkload):
        raise TypeError(f"query_variance: W must be a MarginalWorkload, got {type(W).__name__}")
    return cp.Constant(W.basis.V) @ _strategy(W, s, "query_variance")


def _residual_privacy_cost_canon(expr: ResidualPrivacyCost, args, solver_context=None):
    """``sum(t)`` with ``t_A s_A >= p_A`` per residual with ``p_A > 0`` (a second-order cone
    each: ``||(2 sqrt(p_A), t_A - s_A)|| <= t_A + s_A``)."""
    s = args[0]
    p = expr.weights
    on = np.flatnonzero(p > 0)
    if on.size == 0:
        return cp.Constant(0.0), []
    t = cp.Variable(on.size)
    su = s[on]
    cone = cp.SOC(t + su, cp.vstack([cp.Constant(2.0 * np.sqrt(p[on]))[None, :],
                                     cp.reshape(t - su, (1, on.size), order="F")]), axis=0)
    return cp.sum(t), [cone]


CANON_METHODS[ResidualPrivacyCost] = _residual_privacy_cost_canon

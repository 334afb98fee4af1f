"""``cvxdp.NEWTON_CG`` on the noise design of a marginal workload in the residual basis.

Recognised: ``minimize privacy_cost(W, s)`` subject to ``query_variance(W, s) <= c`` (and any
nonnegative affine maps of ``s`` at most constants; :mod:`cvxdp.recognise.residual`).  The
route, ``extra_stats["info"]["route"]``, is ``"residual Newton-CG"``
(:mod:`cvxdp.solvers.residual.design`): each maximal marginal's own residual is eliminated
(its target is tight at the optimum), the rest is solved by Newton-CG (primal-dual on the
targets of marginals inside others), and the Lagrange dual ``2 sum_A sqrt(p_A (V^T
lambda)_A) - c^T lambda`` certifies the gap; the multipliers are the duals of the targets.

Of ``NEWTON_CG``'s own options, ``cg_max`` applies here; ``growth`` and ``rank_rtol`` tune
the dense method only, and ``strategy`` and ``total_variance_weight`` (which change the
dense problem) are refused.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import cvxpy as cp

from ..names import NEWTON_CG
from ..recognise.residual import ResidualExtraction, recognise
from ..solvers.residual import design
from ..solvers.result import SOLUTION_PRESENT
from .base import Outcome
from .input_check import check_design_scale
from .fitness import OPTIONS
from .options import STOPPING, Settings

__all__ = ["ResidualDesign"]


class ResidualDesign:
    """``cvxdp.NEWTON_CG`` on a marginal workload's design (module docstring)."""

    name = NEWTON_CG
    family = "residual_design"
    options = OPTIONS

    def recognise(self, problem: cp.Problem) -> ResidualExtraction:
        """The problem as arrays; targets whose variances would leave float64's range refused
        here (:func:`cvxdp.methods.input_check.check_design_scale`)."""
        ext = recognise(problem)
        check_design_scale(problem, ext)
        return ext

    def cost(self, ext: ResidualExtraction) -> tuple[str, int]:
        return "residual_design", int(ext.workload.n_residuals)

    def cost_candidates(self, ext: Any) -> None:
        """One family/loss, which :meth:`cost` reads cheaply: nothing to narrow down."""
        return None

    def cost_before_recognition(self, problem: cp.Problem) -> None:
        return None

    def solve(self, problem: cp.Problem, ext: ResidualExtraction, settings: Settings, *,
              cached: Any) -> Outcome:
        for name, given in (("strategy", settings.strategy is not None),
                            ("total_variance_weight", settings.total_variance_weight != 0)):
            if given:
                raise ValueError(f"{NEWTON_CG}: option {name} does not apply to the design of a "
                                 f"MarginalWorkload (the residual basis); leave it unset")
        solver_settings = design.DesignSettings(**dict(
            settings.pick(*STOPPING, "cg_max"),
            eps_abs=min(settings.eps_abs, design.DesignSettings.eps_abs)))
        state = cached if settings.warm_start and isinstance(cached, dict) else None
        res = design.solve(ext.workload.basis.p, ext.V, ext.c, solver_settings, state=state)
        primal: dict[int, Any] = {}
        duals: dict[int, Any] = {}
        objective, lower = math.inf, -math.inf
        if res.status in SOLUTION_PRESENT and res.x is not None and ext.t is None:
            primal[ext.s.id] = res.x
            objective = ext.scale * res.objective + ext.constant
            lower = ext.scale * res.lower_bound + ext.constant
            lam = ext.scale * res.duals["variance"]
            for con, a, b in ext.blocks:
                duals[con.id] = _shape(con, lam[a:b])
        elif res.status in SOLUTION_PRESENT and res.x is not None:
            objective, lower = _privacy_first(ext, res, primal, duals)
        info = {key: res.info.get(key) for key in ("route", "eliminated", "interior_rows",
                                                   "reduced_variables", "cg_iterations",
                                                   "rel_gap", "reason")}
        return Outcome(status=res.status, primal=primal, objective=objective,
                       iterations=res.iterations, solve_time=res.solve_time,
                       setup_time=res.setup_time, lower_bound=lower, history=res.history,
                       duals=duals, duals_certified=bool(duals), state=res.state or None,
                       warm_started=bool(res.info.get("warm_start")), info=info)


def _privacy_first(ext: ResidualExtraction, res, primal: dict, duals: dict) -> tuple[float, float]:
    """Problem 2 from Problem 1's answer (the design is homogeneous: cost(t s) = cost(s) / t):
    ``t* = f / budget``, ``s* = t* s_1``.  With Problem 1's multipliers ``lambda_1``,
    ``g = c^T lambda_1`` and ``S = sum_A sqrt(p_A (V^T lambda_1)_A)``, the multipliers
    ``lambda = lambda_1 / g`` (so ``c^T lambda = 1``: stationary in ``t``) and ``nu = tau^2 /
    g``, ``tau = S / budget``, give the Lagrange dual value ``S^2 / (g budget)``, the
    certified lower bound (both scaled to the objective).  Returns ``(objective, bound)``."""
    lam1 = res.duals["variance"]
    g = float(ext.c @ lam1)
    S = float(np.sum(np.sqrt(ext.workload.basis.p * np.maximum(ext.V.T @ lam1, 0.0))))
    t, tau = res.objective / ext.budget, S / ext.budget
    primal[ext.s.id] = t * res.x
    primal[ext.t.id] = t
    lam = ext.scale * lam1 / g
    for con, a, b in ext.blocks:
        duals[con.id] = _shape(con, lam[a:b])
    duals[ext.cost_constraint.id] = ext.scale * tau * tau / g
    return ext.scale * t, ext.scale * S * S / (g * ext.budget)


def _shape(con, vals: np.ndarray):
    if con.shape == ():
        return float(vals[0])
    return np.asarray(vals).reshape(con.shape, order="F")

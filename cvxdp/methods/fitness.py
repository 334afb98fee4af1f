"""``cvxdp.NEWTON_CG`` on fitness for use: recognise -> solvers.fitness.newton_cg -> write back.

The routes, reported as ``extra_stats["info"]["route"]``: ``"closed form"`` when the
workload's exact reduction leaves rank one (:mod:`cvxdp.solvers.fitness.reduce`), else
``"Newton-CG (SM-II)"``, the soft-max smoothing solved by Newton-CG with exact
Hessian-vector products (:mod:`cvxdp.solvers.fitness.newton_cg`).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import cvxpy as cp

from ..solvers.fitness import newton_cg
from ..solvers.result import SOLUTION_PRESENT

from ..names import NEWTON_CG
from ..recognise.fitness import FitnessExtraction, recognise
from .base import Outcome
from .input_check import check_fitness_scale
from .options import STOPPING, Option, OptionSet, Settings

__all__ = ["FitnessNewtonCG", "OPTIONS"]

OPTIONS = OptionSet.build(NEWTON_CG, max_iters=newton_cg.NewtonSettings.max_iters, eps_abs=1e-6,
                          eps_rel=newton_cg.NewtonSettings.eps_rel, own=[
    Option("growth", "number", newton_cg.NewtonSettings.growth,
           "factor by which the soft-max parameters grow per stage", low=1, low_open=True,
           high=math.inf, high_open=True),
    Option("cg_max", "integer", newton_cg.NewtonSettings.cg_max,
           "conjugate-gradient iterations per Newton step at most", low=1),
    Option("total_variance_weight", "number", 0.0,
           "eta: weight of the total variance added to the objective (the paper's hybrid "
           "objective, sec. 6.1)", low=0, high=math.inf, high_open=True),
    Option("rank_rtol", "number", newton_cg.NewtonSettings.rank_rtol,
           "relative singular-value threshold below which a workload direction counts as "
           "absent (the exact rank reduction L = L' R)", low=0, high=1e-2, low_open=True),
    Option("strategy", "array", None,
           "a strategy matrix (in basis coordinates) to initialize from (sec. 6.3)",
           nullable=True),
])


class FitnessNewtonCG:
    """``cvxdp.NEWTON_CG`` on fitness for use (module docstring)."""

    name = NEWTON_CG
    family = "fitness"
    options = OPTIONS

    def recognise(self, problem: cp.Problem) -> FitnessExtraction:
        """The problem as arrays; data whose optimum or multipliers overflow float64 refused
        here (:func:`cvxdp.methods.input_check.check_fitness_scale`)."""
        ext = recognise(problem)
        check_fitness_scale(problem, ext)
        return ext

    def cost(self, ext: FitnessExtraction) -> tuple[str, int]:
        return "newton_cg", int(ext.B.shape[0])

    def cost_candidates(self, ext: Any) -> None:
        """One family/loss, which :meth:`cost` reads cheaply: nothing to narrow down."""
        return None

    def cost_before_recognition(self, problem: cp.Problem) -> None:
        return None

    def solve(self, problem: cp.Problem, ext: FitnessExtraction, settings: Settings, *,
              cached: Any) -> Outcome:
        d = newton_cg.FitnessData(ext.B, ext.L, ext.c, settings.total_variance_weight)
        # The solver's own feasibility test is stricter than the contract's eps_abs: the
        # rescale that makes X feasible is exact, so the returned point never needs slack.
        solver_settings = newton_cg.NewtonSettings(**dict(
            settings.pick(*STOPPING, "growth", "cg_max", "rank_rtol"),
            eps_abs=min(settings.eps_abs, newton_cg.NewtonSettings.eps_abs)))
        # Bad warm starts (wrong shape, not positive definite, NaN) are ignored by the solver.
        X0 = ext.X.value if settings.warm_start else None
        state = cached if settings.warm_start and isinstance(cached, dict) else None
        if ext.problem == 1:
            res = newton_cg.solve(d, solver_settings, X0=X0, strategy=settings.strategy,
                                  state=state)
        else:
            X0 = None if X0 is None or ext.s.value is None else X0
            res = newton_cg.solve_privacy_bound(d, ext.rho, solver_settings, X0=X0,
                                                strategy=settings.strategy, state=state)
        info = {"route": "closed form" if res.info.get("closed_form") else "Newton-CG (SM-II)",
                "squared_privacy_cost": res.objective if ext.problem == 1 else None}
        for key in ("stages", "cg_iterations", "rank", "rank_used", "distinct_queries",
                    "zero_rows", "null_padding", "closed_form", "warm_start"):
            info[key] = res.info.get(key)
        present = res.status in SOLUTION_PRESENT and res.x is not None
        primal: dict[int, Any] = {}
        duals: dict[int, Any] = {}
        objective, lower = math.inf, -math.inf
        if present:
            lam = res.duals["variance"]
            primal[ext.X.id] = res.x
            if ext.problem == 1:              # objective = scale * privacy cost
                objective, lower = ext.scale * res.objective, ext.scale * res.lower_bound
                for con, rows in ext.variance_constraints:
                    duals[con.id] = _shape(con, ext.scale * lam[rows])
            else:                             # objective = s
                primal[ext.s.id] = res.objective
                objective, lower = res.objective, res.lower_bound
                for con, rows in ext.variance_constraints:
                    duals[con.id] = _shape(con, lam[rows])
                duals[ext.cost_constraint.id] = float(res.duals["privacy"])
            for con in ext.psd_constraints:   # X is positive definite: the cone is inactive
                duals[con.id] = np.zeros(con.args[0].shape)
        warm = res.info.get("warm_start") in ("X0", "resumed from state")
        return Outcome(status=res.status, primal=primal, objective=objective,
                       iterations=res.iterations, solve_time=res.solve_time,
                       setup_time=res.setup_time, lower_bound=lower, history=res.history,
                       duals=duals, duals_certified=bool(duals), state=res.state or None,
                       warm_started=warm, info=info)


def _shape(con, vals: np.ndarray):
    if con.shape == ():
        return float(vals[0])
    return np.asarray(vals).reshape(con.shape)

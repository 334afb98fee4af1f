"""cvxdp.NEWTON_CG: recognise a fitness-for-use problem -> solvers.newton_cg -> write back."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import cvxpy as cp

from ..solvers import newton_cg
from ..solvers.result import SOLUTION_PRESENT

from ..recognise.fitness import FitnessExtraction, recognise
from .base import Outcome
from .options import Option, OptionSet, Settings

NAME = "CVXDP_NEWTON_CG"

OPTIONS = OptionSet.build(NAME, max_iters=newton_cg.NewtonSettings.max_iters, eps_abs=1e-6,
                          eps_rel=newton_cg.NewtonSettings.eps_rel, own=[
    Option("growth", "number", newton_cg.NewtonSettings.growth,
           "factor by which the soft-max parameters grow per stage", low=1, low_open=True,
           high=math.inf, high_open=True),
    Option("cg_max", "integer", newton_cg.NewtonSettings.cg_max,
           "conjugate-gradient iterations per Newton step at most", low=1),
    Option("total_variance_weight", "number", 0.0,
           "eta: weight of the total variance added to the objective (the paper's hybrid "
           "objective, sec. 6.1)", low=0, high=math.inf, high_open=True),
    Option("strategy", "array", None,
           "a strategy matrix (in basis coordinates) to initialize from (sec. 6.3)",
           nullable=True),
])


class NewtonCGMethod:
    name = NAME
    options = OPTIONS

    def recognise(self, problem: cp.Problem) -> FitnessExtraction:
        return recognise(problem)

    def solve(self, problem: cp.Problem, ext: FitnessExtraction, settings: Settings, *,
              cached: Any) -> Outcome:
        d = newton_cg.FitnessData(ext.B, ext.L, ext.c, settings.total_variance_weight)
        solver_settings = newton_cg.NewtonSettings(
            max_iters=settings.max_iters, eps_rel=settings.eps_rel,
            time_limit=settings.time_limit, verbose=settings.verbose,
            callback=settings.callback, growth=settings.growth, cg_max=settings.cg_max)
        X0 = None
        if settings.warm_start and ext.X.value is not None:
            X0 = np.array(ext.X.value, dtype=float)
            if X0.shape != (d.k, d.k) or not np.all(np.isfinite(X0)):
                X0 = None
            else:
                try:
                    np.linalg.cholesky((X0 + X0.T) / 2)
                except np.linalg.LinAlgError:
                    X0 = None
        res = newton_cg.solve(d, solver_settings, X0=X0, strategy=settings.strategy)
        info = {"squared_privacy_cost": res.objective, "stages": res.info.get("stages"),
                "cg_iterations": res.info.get("cg_iterations")}
        present = res.status in SOLUTION_PRESENT and res.x is not None
        primal: dict[int, Any] = {}
        duals: dict[int, Any] = {}
        objective, lower = math.inf, -math.inf
        if present:
            X = res.x
            lam = res.duals["variance"]         # Problem 1, objective = privacy cost
            if ext.problem == 1:
                primal[ext.X.id] = X
                objective, lower = ext.scale * res.objective, ext.scale * res.lower_bound
                for con, rows in ext.variance_constraints:
                    duals[con.id] = _shape(con, ext.scale * lam[rows])
            else:
                kappa = ext.rho / res.objective
                primal[ext.X.id] = kappa * X
                primal[ext.s.id] = 1.0 / kappa
                objective, lower = 1.0 / kappa, res.lower_bound / ext.rho
                a = 1.0 / float(lam @ d.c)
                for con, rows in ext.variance_constraints:
                    duals[con.id] = _shape(con, a * lam[rows])
                duals[ext.cost_constraint.id] = a / kappa ** 2
            for con in ext.psd_constraints:
                duals[con.id] = np.zeros(con.args[0].shape)
        return Outcome(status=res.status, primal=primal, objective=objective,
                       iterations=res.iterations, solve_time=res.solve_time, setup_time=0.0,
                       lower_bound=lower, history=res.history, duals=duals,
                       duals_certified=bool(duals), warm_started=X0 is not None, info=info)


def _shape(con, vals: np.ndarray):
    if con.shape == ():
        return float(vals[0])
    return np.asarray(vals).reshape(con.shape)

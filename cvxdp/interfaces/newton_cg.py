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

NAME = "CVXDP_NEWTON_CG"

EXTRA_OPTIONS = {
    "growth": "factor by which the soft-max parameters grow per stage (default 2)",
    "cg_max": "conjugate-gradient iterations per Newton step at most (default 50)",
    "total_variance_weight": "eta: weight of the total variance added to the objective "
                             "(the paper's hybrid objective, sec. 6.1)",
    "strategy": "a strategy matrix (in basis coordinates) to initialize from (sec. 6.3)",
}


class NewtonCGMethod:
    name = NAME
    extra_options = EXTRA_OPTIONS

    def recognise(self, problem: cp.Problem) -> FitnessExtraction:
        return recognise(problem)

    def solve(self, problem: cp.Problem, ext: FitnessExtraction, opts: dict[str, Any]) -> Outcome:
        d = newton_cg.FitnessData(ext.B, ext.L, ext.c, float(opts.get("total_variance_weight") or 0.0))
        settings = newton_cg.NewtonSettings(
            max_iters=int(opts.get("max_iters") or newton_cg.NewtonSettings.max_iters),
            eps_rel=float(opts.get("eps_rel") or newton_cg.NewtonSettings.eps_rel),
            time_limit=float(opts.get("time_limit") or math.inf),
            verbose=bool(opts.get("verbose", False)),
            callback=opts.get("callback"))
        if opts.get("growth") is not None:
            settings.growth = float(opts["growth"])
        if opts.get("cg_max") is not None:
            settings.cg_max = int(opts["cg_max"])
        X0 = None
        if opts.get("warm_start", True) and ext.X.value is not None:
            try:
                np.linalg.cholesky(ext.X.value)
                X0 = np.array(ext.X.value, dtype=float)
            except np.linalg.LinAlgError:
                X0 = None
        res = newton_cg.solve(d, settings, X0=X0, strategy=opts.get("strategy"))
        extra = {"method": "NEWTON_CG", "squared_privacy_cost": res.objective,
                 "lower_bound": res.lower_bound, "gap": res.gap,
                 "stages": res.info.get("stages"), "cg_iterations": res.info.get("cg_iterations"),
                 "history": res.history}
        present = res.status in SOLUTION_PRESENT and res.x is not None
        primal: dict[int, Any] = {}
        duals: dict[int, Any] = {}
        objective = math.inf
        if present:
            X = res.x
            lam = res.duals["variance"]         # Problem 1, objective = privacy cost
            if ext.problem == 1:
                primal[ext.X.id] = X
                objective = ext.scale * res.objective
                for con, rows in ext.variance_constraints:
                    duals[con.id] = _shape(con, ext.scale * lam[rows])
            else:
                kappa = ext.rho / res.objective
                primal[ext.X.id] = kappa * X
                primal[ext.s.id] = 1.0 / kappa
                objective = 1.0 / kappa
                a = 1.0 / float(lam @ d.c)
                for con, rows in ext.variance_constraints:
                    duals[con.id] = _shape(con, a * lam[rows])
                duals[ext.cost_constraint.id] = a / kappa ** 2
            for con in ext.psd_constraints:
                duals[con.id] = np.zeros(con.args[0].shape)
        return Outcome(status=res.status, primal=primal, objective=objective,
                       iterations=res.iterations, solve_time=res.solve_time, setup_time=0.0,
                       extra=extra, duals=duals)


def _shape(con, vals: np.ndarray):
    if con.shape == ():
        return float(vals[0])
    return np.asarray(vals).reshape(con.shape)

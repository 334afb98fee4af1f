"""cvxdp.MIRROR_DESCENT: recognise a MarginalPolytope problem -> solvers.mirror_descent -> write back."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import cvxpy as cp

from ..solvers.marginal import free_total
from ..solvers.marginal import mirror_descent as md
from ..solvers.marginal.duals import certifying_multipliers
from ..solvers.result import SOLUTION_PRESENT

from ..estimates.graphical_model import GraphicalModel
from ..recognise.clique_marginals import MarginalExtraction, recognise
from .base import Outcome
from .options import Option, OptionSet, Settings

NAME = "CVXDP_MIRROR_DESCENT"

OPTIONS = OptionSet.build(NAME, max_iters=md.MirrorSettings.max_iters,
                          eps_abs=1e-6, eps_rel=md.MirrorSettings.eps_rel, own=[
    Option("algorithm", "choice", md.MirrorSettings.algorithm,
           "'accelerated' (Algorithm 1's step from an extrapolated point, with restarts), "
           "'mirror_descent' (Algorithm 1 with line search) or 'dual_averaging' (Algorithm 2, "
           "with the computed Lipschitz constant)", choices=md.ALGORITHMS),
    Option("check_every", "integer", md.MirrorSettings.check_every,
           "iterations between certificate checks (one max-product pass each)", low=1),
    Option("step", "number", None, "initial mirror-descent step (default 1 / the Lipschitz "
           "bound)", low=0, low_open=True, high=math.inf, high_open=True, nullable=True),
    Option("polish", "bool", md.MirrorSettings.polish,
           "exact finish on the junction tree's local polytope: an active-set QP polish for "
           "quadratic losses, an exact LP (HiGHS) or interior-point QP for L1 and mixed losses"),
    Option("polish_start", "integer", md.MirrorSettings.polish_start,
           "iteration of the first polish attempt (a failed quadratic polish is retried at "
           "twice the iteration; the exact L1 solve is tried once; with total=None and L1 terms "
           "the exact free-total solve comes first)", low=0),
])


class MirrorDescentMethod:
    name = NAME
    options = OPTIONS

    def recognise(self, problem: cp.Problem) -> MarginalExtraction:
        return recognise(problem)

    def solve(self, problem: cp.Problem, ext: MarginalExtraction, settings: Settings, *,
              cached: Any) -> Outcome:
        mp = ext.constraint
        total = mp.known_total()
        info: dict[str, Any] = {"algorithm": settings.algorithm}
        # The solver stops on gap <= eps_abs' + eps_rel' |L|; with both set to eps_rel / 2 and
        # 0 <= L <= f (losses are non-negative) that implies (f - L) / max(1, |f|) <= eps_rel.
        half = settings.eps_rel / 2
        solver_settings = md.MirrorSettings(
            algorithm=settings.algorithm, max_iters=settings.max_iters, eps_abs=half,
            eps_rel=half, time_limit=settings.time_limit, check_every=settings.check_every,
            step=settings.step, polish=settings.polish, polish_start=settings.polish_start,
            verbose=settings.verbose, callback=settings.callback)
        theta0 = step0 = None
        # like cvxpy: clearing a variable's value (x.value = None) asks for a cold start
        warm = settings.warm_start and all(v.value is not None for v in ext.variables)
        if warm and isinstance(cached, dict) and cached.get("n") == ext.loss.n \
                and cached.get("algorithm") == settings.algorithm != "dual_averaging":
            theta0, step0 = cached["theta"], cached.get("step")
        if total is None:
            # total=None: the total is free, optimised with the marginals (the MLE; the same
            # problem the local polytope gives a standard solver)
            res = free_total.solve(mp.tree, ext.loss, solver_settings, theta0=theta0, step0=step0,
                                   total0=cached.get("total") if warm and isinstance(cached, dict)
                                   else None)
            total = res.info["total"]
            info.update(total=total, total_given=False, total_start=res.info["total_start"],
                        total_bound=res.info["total_bound"], total_steps=res.info["total_steps"],
                        total_route=res.info["route"])
        else:
            res = md.solve(md.MarginalProblem(mp.tree, ext.loss, total), solver_settings,
                           theta0=theta0, step0=step0)
            info.update(total=total, total_given=True)
        info.update(abs_gap=res.info["abs_gap"], lipschitz=res.info["lipschitz"],
                    polish=res.info["polish"], polished=res.info.get("clique_tables") is not None,
                    junction_tree=mp.describe())
        primal: dict[int, Any] = {}
        if res.status in SOLUTION_PRESENT and res.x is not None:
            for v, a, b in zip(ext.variables, ext.offsets[:-1], ext.offsets[1:]):
                primal[v.id] = res.x[a:b].reshape(v.shape)
            if not total > 0:                   # the zero table: no distribution to model
                mp.model = None
            elif res.info.get("clique_tables") is not None:
                mp.model = GraphicalModel.from_clique_tables(mp.domain, mp.tree,
                                                             res.info["clique_tables"], total)
            else:
                split = md.MarginalProblem(mp.tree, ext.loss, total).split
                mp.model = GraphicalModel(mp.domain, mp.tree, split(res.info["theta"]), total)
        duals = {}
        if primal:
            y = certifying_multipliers(ext.loss, mp.tree, res, total, settings.eps_rel,
                                 None if info["total_given"] else info.get("total_bound"))
            if y is not None:
                duals[mp.id] = y
        return Outcome(status=res.status, primal=primal, objective=res.objective,
                       iterations=res.iterations, solve_time=res.solve_time,
                       setup_time=res.setup_time, lower_bound=res.lower_bound,
                       duals=duals, duals_certified=bool(duals), history=res.history, state=dict(res.state, n=ext.loss.n, total=total,
                                                       algorithm=settings.algorithm),
                       warm_started=theta0 is not None, info=info)


"""cvxdp.MIRROR_DESCENT: recognise a MarginalPolytope problem -> solvers.mirror_descent -> write back."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import cvxpy as cp

from ..solvers import mirror_descent as md
from ..solvers.result import SOLUTION_PRESENT

from ..graphical_model import GraphicalModel
from ..recognise.marginal_polytope import MarginalExtraction, estimate_total, recognise
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
           "twice the iteration; the exact L1 solve is tried once)", low=0),
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
        if total is None:
            est = estimate_total(ext.loss, ext.offsets)
            if est is None:
                raise ValueError(
                    "MarginalPolytope: total=None, and no measurement in the objective spans the "
                    "total (appendix E.1 needs a loss term whose rows sum a whole marginal); pass "
                    "total=<number of records>")
            total = max(est[0], 1e-12)
            info["total_estimate"] = total
            info["total_variance"] = est[1]
            mp.total_estimate = total
        # The solver stops on gap <= eps_abs' + eps_rel' |L|; with both set to eps_rel / 2 and
        # 0 <= L <= f (losses are non-negative) that implies (f - L) / max(1, |f|) <= eps_rel.
        half = settings.eps_rel / 2
        solver_settings = md.MirrorSettings(
            algorithm=settings.algorithm, max_iters=settings.max_iters, eps_abs=half,
            eps_rel=half, time_limit=settings.time_limit, check_every=settings.check_every,
            step=settings.step, polish=settings.polish, polish_start=settings.polish_start,
            verbose=settings.verbose, callback=settings.callback)
        problem_data = md.MarginalProblem(mp.tree, ext.loss, total)
        theta0 = step0 = None
        # like cvxpy: clearing a variable's value (x.value = None) asks for a cold start
        warm = settings.warm_start and all(v.value is not None for v in ext.variables)
        if warm and isinstance(cached, dict) and cached.get("n") == ext.loss.n \
                and cached.get("algorithm") == settings.algorithm != "dual_averaging":
            theta0, step0 = cached["theta"], cached.get("step")
        res = md.solve(problem_data, solver_settings, theta0=theta0, step0=step0)
        info.update(abs_gap=res.info["abs_gap"], lipschitz=res.info["lipschitz"],
                    polish=res.info["polish"], polished=res.info.get("clique_tables") is not None,
                    junction_tree=mp.describe())
        primal: dict[int, Any] = {}
        if res.status in SOLUTION_PRESENT and res.x is not None:
            for v, a, b in zip(ext.variables, ext.offsets[:-1], ext.offsets[1:]):
                primal[v.id] = res.x[a:b].reshape(v.shape)
            if res.info.get("clique_tables") is not None:
                mp.model = GraphicalModel.from_clique_tables(mp.domain, mp.tree,
                                                             res.info["clique_tables"], total)
            else:
                mp.model = GraphicalModel(mp.domain, mp.tree, problem_data.split(res.info["theta"]),
                                          total)
        return Outcome(status=res.status, primal=primal, objective=res.objective,
                       iterations=res.iterations, solve_time=res.solve_time,
                       setup_time=res.setup_time, lower_bound=res.lower_bound,
                       history=res.history, state=dict(res.state, n=ext.loss.n,
                                                       algorithm=settings.algorithm),
                       warm_started=theta0 is not None, info=info)

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

NAME = "CVXDP_MIRROR_DESCENT"

EXTRA_OPTIONS = {
    "algorithm": "'accelerated' (default: Algorithm 1's step from an extrapolated point, with "
                 "restarts), 'mirror_descent' (Algorithm 1 with line search) or 'dual_averaging' "
                 "(Algorithm 2, with the computed Lipschitz constant)",
    "check_every": "iterations between certificate checks (one max-product pass each; default 10)",
    "step": "initial mirror-descent step (default 1 / the Lipschitz bound)",
    "polish": "active-set polish on the junction tree's local polytope for quadratic losses "
              "(default True): exact optimum and a tight certificate once the zero cells are found",
    "polish_start": "iteration of the first polish attempt (default 100; a failed attempt is "
                    "retried at twice the iteration)",
}


class MirrorDescentMethod:
    name = NAME
    extra_options = EXTRA_OPTIONS

    def recognise(self, problem: cp.Problem) -> MarginalExtraction:
        return recognise(problem)

    def solve(self, problem: cp.Problem, ext: MarginalExtraction, opts: dict[str, Any]) -> Outcome:
        mp = ext.constraint
        total = mp.known_total()
        extra: dict[str, Any] = {"method": "MIRROR_DESCENT"}
        if total is None:
            est = estimate_total(ext.loss, ext.offsets)
            if est is None:
                raise ValueError(
                    "MarginalPolytope: total=None, and no measurement in the objective spans the "
                    "total (appendix E.1 needs a loss term whose rows sum a whole marginal); pass "
                    "total=<number of records>")
            total = max(est[0], 1e-12)
            extra["total_estimate"] = total
            extra["total_variance"] = est[1]
            mp.total_estimate = total
        settings = md.MirrorSettings(
            algorithm=opts.get("algorithm") or md.MirrorSettings.algorithm,
            max_iters=int(opts.get("max_iters") or md.MirrorSettings.max_iters),
            eps_abs=float(opts.get("eps_abs") or md.MirrorSettings.eps_abs),
            eps_rel=float(opts.get("eps_rel") or md.MirrorSettings.eps_rel),
            time_limit=float(opts.get("time_limit") or math.inf),
            check_every=int(opts.get("check_every") or md.MirrorSettings.check_every),
            step=opts.get("step"),
            polish=bool(opts.get("polish", md.MirrorSettings.polish)),
            polish_start=int(opts.get("polish_start", md.MirrorSettings.polish_start)),
            verbose=bool(opts.get("verbose", False)),
            callback=opts.get("callback"))
        problem_data = md.MarginalProblem(mp.tree, ext.loss, total)
        theta0 = step0 = None
        cache = getattr(mp, "_md_state", None)
        # like cvxpy: clearing a variable's value (x.value = None) asks for a cold start
        warm = opts.get("warm_start", True) and all(v.value is not None for v in ext.variables)
        if warm and cache is not None and cache.get("n") == ext.loss.n \
                and cache.get("algorithm") == settings.algorithm != "dual_averaging":
            theta0, step0 = cache["theta"], cache.get("step")
        res = md.solve(problem_data, settings, theta0=theta0, step0=step0)
        mp._md_state = dict(res.state, n=ext.loss.n, algorithm=settings.algorithm)
        extra.update(lower_bound=res.lower_bound, gap=res.gap, abs_gap=res.info["abs_gap"],
                     algorithm=settings.algorithm, lipschitz=res.info["lipschitz"],
                     polish=res.info["polish"], polished=res.info.get("clique_tables") is not None,
                     junction_tree=mp.describe(), history=res.history)
        primal: dict[int, Any] = {}
        if res.status in SOLUTION_PRESENT and res.x is not None:
            for v, a, b in zip(ext.variables, ext.offsets[:-1], ext.offsets[1:]):
                flat = res.x[a:b]
                primal[v.id] = flat.reshape(v.shape) if v.ndim > 1 else flat.reshape(v.shape)
            if res.info.get("clique_tables") is not None:
                mp.model = GraphicalModel.from_clique_tables(mp.domain, mp.tree, res.info["clique_tables"], total)
            else:
                mp.model = GraphicalModel(mp.domain, mp.tree, problem_data.split(res.info["theta"]), total)
        return Outcome(status=res.status, primal=primal, objective=res.objective,
                       iterations=res.iterations, solve_time=res.solve_time,
                       setup_time=res.setup_time, extra=extra)

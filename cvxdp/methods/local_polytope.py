"""cvxdp.ADMM on a ``LocalPolytope`` problem: recognise -> solvers.local_admm -> write back.

The ADMM method takes this route when the problem has a :class:`cvxdp.LocalPolytope`; the
shared options and ``rho``, ``alpha``, ``adaptive_rho``, ``check_every`` and ``polish`` mean
what they mean for every ADMM solve, and ``dual_newton`` (the semismooth Newton method of
:mod:`cvxdp.solvers.local.newton`) applies here only (``equality_split`` has nothing to
choose here: the consistency set is always projected onto exactly).
"""
from __future__ import annotations

from typing import Any

import cvxpy as cp

from ..solvers.local import admm as local_admm
from ..solvers.result import SOLUTION_PRESENT

from ..recognise.clique_marginals import MarginalExtraction
from .base import Outcome
from .options import Settings

__all__ = ["solve_local"]


def solve_local(problem: cp.Problem, ext: MarginalExtraction, settings: Settings, *,
                cached: Any) -> Outcome:
    lp = ext.constraint
    data = local_admm.LocalProblem(lp.graph, ext.loss, lp.known_total())
    solver_settings = local_admm.LocalSettings(
        max_iters=settings.max_iters, eps_abs=settings.eps_abs, eps_rel=settings.eps_rel,
        time_limit=settings.time_limit, rho=settings.rho, alpha=settings.alpha,
        adaptive_rho=settings.adaptive_rho, check_every=settings.check_every,
        polish=settings.polish, dual_newton=settings.dual_newton, verbose=settings.verbose,
        callback=settings.callback)
    # like cvxpy: clearing a variable's value (x.value = None) asks for a cold start
    warm = settings.warm_start and all(v.value is not None for v in ext.variables)
    state = cached if warm and isinstance(cached, dict) else None
    res = local_admm.solve(data, solver_settings, state=state)
    primal: dict[int, Any] = {}
    if res.status in SOLUTION_PRESENT and res.x is not None:
        for v, a, b in zip(ext.variables, ext.offsets[:-1], ext.offsets[1:]):
            primal[v.id] = res.x[a:b].reshape(v.shape)
    y = res.duals.get("marginals")
    duals = {lp.id: y} if primal and y is not None else {}
    info = dict(res.info, local_polytope=lp.describe())
    return Outcome(status=res.status, primal=primal, objective=res.objective,
                   iterations=res.iterations, solve_time=res.solve_time,
                   setup_time=res.setup_time, lower_bound=res.lower_bound,
                   dual_residual=res.dual_residual, history=res.history, duals=duals,
                   duals_certified=bool(duals), state=res.state,
                   warm_started=state is not None, info=info)

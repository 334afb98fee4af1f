"""``cvxdp.MIRROR_DESCENT`` on a ``MarginalPolytope`` problem: recognise -> solvers.marginal -> back.

The routes, reported as ``extra_stats["info"]["route"]``: the first-order method asked for
(``algorithm``: ``"accelerated mirror descent"``, ``"mirror descent"``, ``"dual averaging"``;
:mod:`cvxdp.solvers.marginal.mirror_descent`), followed by ``" -> exact polish"`` when the
exact finish on the junction tree's local polytope returned the point (an active-set QP for
squared losses -- handing over to an interior-point QP when its active set does not settle --
an LP or interior-point QP for L1 and mixed ones); with ``total=None`` the total is optimised
too (:mod:`cvxdp.solvers.marginal.free_total`): ``"free total (<lp|ipm|qp|zero>)"`` when the
exact program over the cone (or ``mu = 0``) gave the answer before any mirror descent, else
``"free total (<ipm|qp|secant>): "`` followed by the algorithm's route.  The solve leaves a
graphical model on the constraint (``constraint.model``).
"""
from __future__ import annotations

import math
from typing import Any

import cvxpy as cp

from ..estimates.graphical_model import GraphicalModel
from ..modelling.marginal_polytope import MarginalPolytope
from ..names import MIRROR_DESCENT
from ..recognise.clique_marginals import MarginalExtraction, recognise, the_polytope
from ..recognise.losses import has_l1
from ..solvers.marginal import free_total
from ..solvers.marginal import mirror_descent as md
from ..solvers.marginal.duals import certifying_multipliers
from ..solvers.result import SOLUTION_PRESENT
from .base import Outcome
from .input_check import check_marginal_data
from .options import STOPPING, Option, OptionSet, Settings

__all__ = ["MarginalMirrorDescent", "OPTIONS"]

_ALGORITHM = {"accelerated": "accelerated mirror descent", "mirror_descent": "mirror descent",
              "dual_averaging": "dual averaging"}

OPTIONS = OptionSet.build(MIRROR_DESCENT, max_iters=md.MirrorSettings.max_iters,
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


class MarginalMirrorDescent:
    """``cvxdp.MIRROR_DESCENT`` on the marginal polytope (module docstring)."""

    name = MIRROR_DESCENT
    family = "marginal_polytope"
    options = OPTIONS

    def recognise(self, problem: cp.Problem) -> MarginalExtraction:
        """The problem as arrays; data too large for float64 refused here
        (:mod:`cvxdp.methods.input_check`)."""
        ext = recognise(problem)
        check_marginal_data(problem, ext.variables, ext.loss.terms, MIRROR_DESCENT)
        return ext

    def cost(self, ext: MarginalExtraction) -> tuple[str, int]:
        loss = "l2" if ext.loss.smooth else "l1"
        return f"marginal_polytope/{loss}", int(sum(ext.constraint.tree.cells))

    def cost_candidates(self, ext: Any) -> None:
        """One family/loss, which :meth:`cost` reads cheaply: nothing to narrow down."""
        return None

    def cost_before_recognition(self, problem: cp.Problem) -> tuple[str, int] | None:
        c = the_polytope(problem)
        if not isinstance(c, MarginalPolytope):
            return None
        loss = "l1" if has_l1(problem.objective.expr) else "l2"
        return f"marginal_polytope/{loss}", int(sum(c.tree.cells))

    def solve(self, problem: cp.Problem, ext: MarginalExtraction, settings: Settings, *,
              cached: Any) -> Outcome:
        mp = ext.constraint
        # like cvxpy: clearing a variable's value (x.value = None) asks for a cold start
        warm = settings.warm_start and all(v.value is not None for v in ext.variables)
        cached = cached if warm and isinstance(cached, dict) else None
        res, info, warmed = _run(mp, ext, settings, cached)
        total = info["total"]
        primal: dict[int, Any] = {}
        duals = {}
        if res.status in SOLUTION_PRESENT and res.x is not None:
            for v, a, b in zip(ext.variables, ext.offsets[:-1], ext.offsets[1:]):
                primal[v.id] = res.x[a:b].reshape(v.shape)
            mp.model = _model(mp, ext, res, total)
            y = certifying_multipliers(ext.loss, mp.tree, res, total, settings.eps_rel,
                                       None if info["total_given"] else info.get("total_bound"))
            if y is not None:
                duals[mp.id] = y
        state = dict(res.state, n=ext.loss.n, total=total, algorithm=settings.algorithm)
        return Outcome(status=res.status, primal=primal, objective=res.objective,
                       iterations=res.iterations, solve_time=res.solve_time,
                       setup_time=res.setup_time, lower_bound=res.lower_bound,
                       duals=duals, duals_certified=bool(duals), history=res.history,
                       state=state, warm_started=warmed, info=info)


def _run(mp: MarginalPolytope, ext: MarginalExtraction, settings: Settings,
         cached: dict | None) -> tuple[Any, dict[str, Any], bool]:
    """The numerical solve: ``(result, info, warm-started)``; the total is free when the
    constraint's is ``None`` (the MLE; the same problem the local polytope gives a standard
    solver)."""
    # The solver stops on gap <= eps_abs' + eps_rel' |L|; with both set to eps_rel / 2 and
    # 0 <= L <= f (losses are non-negative) that implies (f - L) / max(1, |f|) <= eps_rel.
    half = settings.eps_rel / 2
    solver_settings = md.MirrorSettings(**dict(
        settings.pick(*STOPPING, "algorithm", "check_every", "step", "polish", "polish_start"),
        eps_abs=half, eps_rel=half))
    theta0 = step0 = None
    if cached is not None and cached.get("n") == ext.loss.n \
            and cached.get("algorithm") == settings.algorithm != "dual_averaging":
        theta0, step0 = cached["theta"], cached.get("step")
    total = mp.known_total()
    info: dict[str, Any] = {"algorithm": settings.algorithm}
    route = _ALGORITHM[settings.algorithm]
    if total is None:
        res = free_total.solve(mp.tree, ext.loss, solver_settings, theta0=theta0, step0=step0,
                               total0=None if cached is None else cached.get("total"))
        total = res.info["total"]
        info.update(total=total, total_given=False, total_start=res.info["total_start"],
                    total_bound=res.info["total_bound"], total_steps=res.info["total_steps"],
                    total_route=res.info["route"])
        route = f"free total ({res.info['route']})" + (f": {route}" if res.info["total_steps"] else "")
    else:
        res = md.solve(md.MarginalProblem(mp.tree, ext.loss, total), solver_settings,
                       theta0=theta0, step0=step0)
        info.update(total=total, total_given=True)
    polished = res.info.get("clique_tables") is not None
    ran_md = info.get("total_steps", 1) > 0        # mirror descent ran (always, for a given total)
    info.update(route=route + (" -> exact polish" if polished and ran_md else ""),
                abs_gap=res.info["abs_gap"], lipschitz=res.info["lipschitz"],
                polish=res.info["polish"], polished=polished, junction_tree=mp.describe())
    return res, info, theta0 is not None


def _model(mp: MarginalPolytope, ext: MarginalExtraction, res, total: float):
    """The graphical model the solve leaves on the constraint (``None`` for the zero table:
    no distribution to model)."""
    if not total > 0:
        return None
    if res.info.get("clique_tables") is not None:
        return GraphicalModel.from_clique_tables(mp.domain, mp.tree, res.info["clique_tables"],
                                                 total)
    split = md.MarginalProblem(mp.tree, ext.loss, total).split
    return GraphicalModel(mp.domain, mp.tree, split(res.info["theta"]), total)

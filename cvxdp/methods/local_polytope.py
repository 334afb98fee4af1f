"""``cvxdp.ADMM`` on a ``LocalPolytope`` problem: recognise -> solvers.local.admm -> write back.

The shared options and ``rho``, ``alpha``, ``adaptive_rho``, ``check_every`` and ``polish``
mean what they mean for every ADMM solve, and ``dual_newton`` applies here only
(``equality_split`` and ``general_route`` have nothing to choose here: the consistency set is always projected onto
exactly).  The routes, reported as ``extra_stats["info"]["route"]``:

* ``"dual Newton"`` -- a loss that measures every cell with squared rows: the semismooth
  Newton method on the dual (:mod:`cvxdp.solvers.local.newton`);
* ``"proximal dual Newton"`` -- the same with absolute rows, inside proximal point steps
  (:mod:`cvxdp.solvers.local.proximal`);
* ``"ADMM"`` -- the ADMM with the exact projection onto the consistency set
  (:mod:`cvxdp.solvers.local.admm`), alone or after a Newton method that stalled
  (``"dual Newton -> ADMM"``).

Unmeasured cliques that can be eliminated exactly are removed first, whatever the route
(``info["eliminated"]``).
"""
from __future__ import annotations

from typing import Any

import cvxpy as cp

from ..modelling.local_polytope import LocalPolytope
from ..names import ADMM
from ..recognise.clique_marginals import MarginalExtraction, recognise_local, the_polytope
from ..recognise.losses import has_l1
from ..solvers.local import admm as local_admm
from ..solvers.local.problem import LocalProblem, LocalSettings
from ..solvers.result import SOLUTION_PRESENT
from .base import Outcome
from .input_check import check_marginal_data
from .consistency import OPTIONS
from .options import STOPPING, Settings

__all__ = ["LocalPolytopeADMM"]


class LocalPolytopeADMM:
    """``cvxdp.ADMM`` on the local polytope (module docstring)."""

    name = ADMM
    family = "local_polytope"
    options = OPTIONS

    def recognise(self, problem: cp.Problem) -> MarginalExtraction:
        """The problem as arrays; data too large for float64 refused here
        (:mod:`cvxdp.methods.input_check`)."""
        ext = recognise_local(problem)
        check_marginal_data(problem, ext.variables, ext.loss.terms, ADMM)
        return ext

    def cost(self, ext: MarginalExtraction) -> tuple[str, int]:
        loss = "l2" if ext.loss.smooth else "l1"
        return f"local_polytope/{loss}", int(ext.constraint.graph.n)

    def cost_candidates(self, ext: Any) -> None:
        """One family/loss, which :meth:`cost` reads cheaply: nothing to narrow down."""
        return None

    def cost_before_recognition(self, problem: cp.Problem) -> tuple[str, int] | None:
        c = the_polytope(problem)
        if not isinstance(c, LocalPolytope):
            return None
        return f"local_polytope/{'l1' if has_l1(problem.objective.expr) else 'l2'}", int(c.graph.n)

    def solve(self, problem: cp.Problem, ext: MarginalExtraction, settings: Settings, *,
              cached: Any) -> Outcome:
        lp = ext.constraint
        data = LocalProblem(lp.graph, ext.loss, lp.known_total())
        solver_settings = LocalSettings(**settings.pick(
            *STOPPING, "rho", "alpha", "adaptive_rho", "check_every", "polish", "dual_newton",
            "duals"))
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

"""The one place where cvxdp writes cvxpy's results back into a Problem.

``Problem.unpack`` is public and sets values, duals, status and the optimal
value.  ``solver_stats``, ``solve_time`` and ``compilation_time`` have no
setters, so they are written through the private attributes that cvxpy's own
``unpack_results`` uses (checked on cvxpy 1.9.0 - 1.9.3).  If a future cvxpy
renames them we fail loudly here instead of silently leaving stale statistics.
"""
from __future__ import annotations

from typing import Any

import cvxpy as cp
import cvxpy.settings as s
from cvxpy.problems.problem import SolverStats
from cvxpy.reductions.solution import Solution

__all__ = ["write_solution", "annotate_extra_stats", "set_status", "PRIVATE_ATTRIBUTES"]

#: the private attributes of ``cp.Problem`` this module writes
PRIVATE_ATTRIBUTES = ("_solver_stats", "_solve_time", "_compilation_time", "_status")


def _check_private_attributes(problem: cp.Problem) -> None:
    missing = [a for a in PRIVATE_ATTRIBUTES if not hasattr(problem, a)]
    if missing:
        raise RuntimeError(f"cvxdp cannot record solver statistics on cvxpy {cp.__version__}: "
                           f"cp.Problem has no attribute(s) {missing}. Please report this.")


def write_solution(problem: cp.Problem, *, status: str, opt_val: float,
                   primal_vars: dict[int, Any], dual_vars: dict[int, Any], solver_name: str,
                   solve_time: float, setup_time: float, num_iters: int,
                   extra_stats: dict[str, Any], compilation_time: float) -> None:
    """Unpack a solution into ``problem`` exactly as a standard cvxpy solve would.

    ``primal_vars`` maps every variable id to its value (ignored for infeasible
    statuses); ``dual_vars`` maps constraint ids to dual values.  A constraint without an
    entry gets ``dual_value = None``: ``Problem.unpack`` would otherwise leave the dual of
    an earlier solve in place, which no longer belongs to the point.
    """
    _check_private_attributes(problem)
    for c in problem.constraints:
        if c.id not in dual_vars:
            for dv in c.dual_variables:
                dv.save_value(None)
    attr = {s.SOLVE_TIME: solve_time, s.SETUP_TIME: setup_time, s.NUM_ITERS: num_iters,
            s.EXTRA_STATS: extra_stats}
    problem.unpack(Solution(status, opt_val, primal_vars, dual_vars, attr))
    problem._solver_stats = SolverStats.from_dict(attr, solver_name)
    problem._solve_time = solve_time
    problem._compilation_time = compilation_time


def set_status(problem: cp.Problem, status: str) -> None:
    """Replace the status a standard solver's own ``Problem.solve`` left (values, duals and
    statistics stay): ``solver=None`` holds the standard solver to cvxdp's ``optimal``."""
    _check_private_attributes(problem)
    problem._status = status


def annotate_extra_stats(problem: cp.Problem, extra: dict[str, Any]) -> None:
    """After a standard solver's own ``Problem.solve``: ``solver_stats.extra_stats`` becomes a
    dict with ``extra`` and, under ``"solver"``, what the solver reported there."""
    stats = problem.solver_stats
    if stats is None:
        return
    stats.extra_stats = {**extra, "solver": stats.extra_stats}

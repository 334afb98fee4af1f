"""What every numerical method in :mod:`solvers` returns.

The status strings are cvxpy's own literals, so the cvxpy-facing layer can pass
them through unchanged; this package does not import cvxpy.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

OPTIMAL = "optimal"
OPTIMAL_INACCURATE = "optimal_inaccurate"
INFEASIBLE = "infeasible"
INFEASIBLE_INACCURATE = "infeasible_inaccurate"
USER_LIMIT = "user_limit"
SOLVER_ERROR = "solver_error"

#: statuses for which ``SolverResult.x`` holds a usable point
SOLUTION_PRESENT = (OPTIMAL, OPTIMAL_INACCURATE, USER_LIMIT)


@dataclass
class SolverResult:
    """Solution, certificates and bookkeeping of one solve.

    Attributes
    ----------
    x : the primal solution (``None`` when infeasible).
    status : one of the module-level status strings.
    objective : objective value at ``x``.
    lower_bound : a certified lower bound on the optimal value (``-inf`` if none).
    gap : ``(objective - lower_bound) / max(1, |objective|)``.
    duals : multipliers keyed by constraint block (``"eq"``, ``"lower"``,
        ``"upper"``, ``"order"``), in the sign convention documented by the method.
    iterations : number of iterations run.
    primal_residual : largest constraint violation of ``x``.
    dual_residual : the method's final dual residual norm.
    setup_time, solve_time : seconds spent factorizing/preparing and iterating.
    history : per-iteration records (the verbose table).
    info : anything method specific (rho, polish outcome, certificates ...).
    state : what a warm start needs to resume.
    """

    x: np.ndarray | None
    status: str
    objective: float = float("nan")
    lower_bound: float = float("-inf")
    gap: float = float("inf")
    duals: dict[str, np.ndarray] = field(default_factory=dict)
    iterations: int = 0
    primal_residual: float = float("nan")
    dual_residual: float = float("nan")
    setup_time: float = 0.0
    solve_time: float = 0.0
    history: list[dict[str, float]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)


#: relative rounding floor of a violation or residual: about 4,500 ulps of the largest term of
#: the constraint (the contract's, :func:`cvxdp.methods.certify.check_point`; the methods'
#: own feasibility and KKT tests allow the same)
ROUNDING = 1e-12


def relative_gap(objective: float, lower_bound: float) -> float:
    """``(objective - lower_bound) / max(1, |objective|)``.

    Signed: a returned point may violate constraints by up to ``eps_abs`` and then
    sit slightly below the optimum, so the bound can exceed its objective; the
    negative value says so instead of hiding it as zero."""
    if not np.isfinite(objective) or not np.isfinite(lower_bound):
        return float("inf")
    return (objective - lower_bound) / max(1.0, abs(objective))


def check_stop(row: dict[str, Any], *, eps_rel: float, callback, time_limit: float,
               elapsed: float) -> str | None:
    """The stopping rule shared by the certified iterations, at one convergence check
    (``row`` its verbose row, with ``"rel gap"``): ``OPTIMAL`` once the certified gap is at
    most ``eps_rel``, ``USER_LIMIT`` when ``callback(row)`` asks to stop,
    ``OPTIMAL_INACCURATE`` past ``time_limit``; ``None``: go on."""
    if row["rel gap"] <= eps_rel:
        return OPTIMAL
    if callback is not None and callback(dict(row)):
        return USER_LIMIT
    if elapsed >= time_limit:
        return OPTIMAL_INACCURATE
    return None


def record_check(row: dict[str, Any], history: list, table, settings) -> str | None:
    """One convergence check of a certified iteration: ``row`` (with ``"rel gap"`` and
    ``"time [s]"``, the time since the solve began) appended to ``history`` and written to the
    verbose ``table`` (an :class:`~cvxdp.solvers._table.IterationTable`), then
    :func:`check_stop` under ``settings``' ``eps_rel``, ``callback`` and ``time_limit``."""
    history.append(row)
    table.row(row)
    return check_stop(row, eps_rel=settings.eps_rel, callback=settings.callback,
                      time_limit=settings.time_limit, elapsed=row["time [s]"])

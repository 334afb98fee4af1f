"""Statuses that are true: every method's answer is checked in cvxpy's own terms.

A method proposes a point, an objective, a certified lower bound ``L`` and a status.  Before
anything is written back, :func:`check_point` evaluates the point with cvxpy itself: the
objective ``f`` of the user's expression tree, and the violation of every constraint and
every variable attribute (``nonneg=True``, ``PSD=True``, ...).  :func:`decide` then applies
the one definition of ``optimal`` shared by all methods::

    violation <= eps_abs + ROUNDING * magnitude   and   (f - L) / max(1, |f|) <= eps_rel,

``magnitude`` being the largest absolute value among the constraint's arguments and its
variables (the terms before they cancel).  The second
term of the first test is the rounding floor of double precision: a sum of counts of 1e9
cannot be checked to 1e-6 in 16 digits.  A point that fails either test is reported as
``optimal_inaccurate`` with the measured numbers, whatever the method believed; a method
that stopped on a limit but whose point passes both tests is ``optimal``.  A point with a
NaN or inf is never written: that is a solver error.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import cvxpy as cp

from ..solvers.result import (INFEASIBLE, INFEASIBLE_INACCURATE, OPTIMAL, OPTIMAL_INACCURATE,
                              ROUNDING, relative_gap)

__all__ = ["PointCheck", "check_point", "decide", "ROUNDING"]


_ATTRIBUTES = ("nonneg", "nonpos", "pos", "neg", "PSD", "NSD", "symmetric", "boolean",
               "integer", "bounds")


@dataclass
class PointCheck:
    """The returned point, as cvxpy sees it."""

    objective: float           # the user's objective at the point
    violation: float           # largest constraint or attribute violation (absolute)
    excess: float              # largest violation beyond its rounding floor
    worst: str                 # where the largest excess is
    finite: bool               # every variable value is finite


def check_point(problem: cp.Problem, primal: dict[int, Any], *,
                objective: bool = True) -> PointCheck:
    """Load ``primal`` into the variables and evaluate objective and constraints
    (``objective=False``: the constraints only, the objective NaN; a standard solver's point,
    whose objective cvxpy has already written)."""
    finite = True
    for v in problem.variables():
        val = primal.get(v.id)
        if val is None:
            return PointCheck(math.nan, math.inf, math.inf, f"variable {v.name()} has no value",
                              False)
        arr = np.asarray(val, dtype=float)
        finite &= bool(np.all(np.isfinite(arr)))
        v.save_value(val)
    if not finite:
        return PointCheck(math.nan, math.inf, math.inf, "non-finite variable values", False)
    viol, worst, where = 0.0, 0.0, ""
    found = [(f"an attribute of variable {v.name()}", _attribute_violation(v))
             for v in problem.variables()]
    found += [(f"constraint {i} ({type(c).__name__})", _constraint_violation(c))
              for i, c in enumerate(problem.constraints)]
    for name, (raw, mag) in found:
        viol = max(viol, raw)
        excess = max(0.0, raw - ROUNDING * mag)
        if excess > worst:
            worst, where = excess, name
    f = math.nan
    if objective:
        try:
            f = float(problem.objective.value)
        except (ValueError, TypeError, np.linalg.LinAlgError, ArithmeticError):
            f = math.nan
    return PointCheck(f, viol, worst, where, True)


def _attribute_violation(v: cp.Variable) -> tuple[float, float]:
    """``(violation, magnitude)`` of a variable's attributes: distance to their set."""
    if not any(v.attributes.get(k) for k in _ATTRIBUTES):
        return 0.0, 0.0
    val = np.asarray(v.value, dtype=float)
    mag = float(np.max(np.abs(val), initial=0.0))
    try:
        proj = np.asarray(v.project(val), dtype=float)
    except (ValueError, np.linalg.LinAlgError):
        return math.inf, mag
    return float(np.max(np.abs(proj - val), initial=0.0)), mag


def _constraint_violation(con) -> tuple[float, float]:
    """``(violation, magnitude)``: cvxpy's violation and the largest |term|."""
    try:
        raw = con.violation()
    except (ValueError, TypeError, np.linalg.LinAlgError, ArithmeticError):
        return math.inf, 0.0
    if raw is None:
        return math.inf, 0.0
    viol = float(np.max(np.asarray(raw, dtype=float), initial=0.0))
    if math.isnan(viol):
        return math.inf, 0.0
    # The magnitude of the terms, not of their difference: C x == 0 cancels to ~0, but its
    # rounding error is relative to x.
    values = []
    for leaf in list(getattr(con, "args", ())) + list(con.variables()):
        try:
            values.append(leaf.value)
        except (ValueError, TypeError, np.linalg.LinAlgError, ArithmeticError):
            continue
    mag = 0.0
    for val in values:
        if val is not None:
            arr = val.toarray() if hasattr(val, "toarray") else np.asarray(val, dtype=float)
            mag = max(mag, float(np.max(np.abs(arr), initial=0.0)))
    return viol, mag


#: the largest relative amount by which a lower bound may exceed a point's objective and still
#: certify it (a point within eps_abs of the constraints can undercut the optimum: by at most
#: 2.5e-8 in the test suite, never by more than 1e-6 over seed 19's 4,200 stress instances)
UNDERCUT = 1e-4


def decide(status: str, check: PointCheck | None, lower_bound: float, *, eps_abs: float,
           eps_rel: float) -> tuple[str, float, str]:
    """``(status, gap, reason)`` under the shared definition of ``optimal``."""
    if status in (INFEASIBLE, INFEASIBLE_INACCURATE) or check is None:
        return status, math.inf, ""
    gap = relative_gap(check.objective, lower_bound)
    feasible = check.excess <= eps_abs
    # a bound above the objective by more than UNDERCUT (or eps_rel) certifies nothing: it was
    # spoiled by rounding (a local polytope with a total of 1e7 under weights of 1,000, terms
    # of 1e20: a "bound" of 248 at an objective of 4.23).  Smaller negative gaps are a point
    # that undercuts the optimum through a violation within eps_abs, which is allowed
    certified = -max(eps_rel, UNDERCUT) <= gap <= eps_rel
    if status == OPTIMAL and not (feasible and certified):
        why = []
        if not feasible:
            why.append(f"the point violates {check.worst} by {check.excess:.3g} more than "
                       f"eps_abs {eps_abs:.3g} allows")
        if gap > eps_rel:
            why.append(f"the certified gap {gap:.3g} > eps_rel {eps_rel:.3g}")
        elif gap < -max(eps_rel, UNDERCUT):
            why.append(f"the lower bound {lower_bound:.10g} is above the objective "
                       f"{check.objective:.10g} by more than a violation within eps_abs "
                       f"explains (gap {gap:.3g}): no certificate")
        return OPTIMAL_INACCURATE, gap, "; ".join(why)
    if status == OPTIMAL_INACCURATE and feasible and certified:
        return OPTIMAL, gap, "the point meets eps_abs and eps_rel"
    return status, gap, ""

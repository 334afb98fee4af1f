"""Certify what the ADMM solver returns.

* :func:`certify`: the multipliers must satisfy the KKT conditions at the returned
  ``x`` (:func:`cvxdp.solvers.consistency.kkt.kkt_check`; when the ADMM ones do not, exact ones
  are sought by an LP), else they are dropped; ``optimal`` needs the violation within
  ``eps_abs`` and a certified relative gap ``(f - L) / max(1, |f|)`` within ``eps_rel``,
  the bound ``L`` from the ADMM dual, the polish, the certified multipliers or an LP over
  the multipliers; a run that did not reach ``optimal`` is checked for infeasibility of
  the constraints alone.
* :func:`separating_hyperplane`: an infeasibility certificate between a box and an
  affine set.
"""
from __future__ import annotations

import math

import numpy as np

from .. import result as R
from .._linalg import dot as _dot, norm as _norm
from .kkt import constraint_gradient, kkt_check, lagrangian_bound, separable_loss_multiplier
from .lp import LP_MAX_NNZ, constraints_feasible, dual_bound_lp, kkt_dual_lp, lp_size
from ..result import SolverResult, relative_gap

__all__ = ["certify", "separating_hyperplane"]

# A Lagrangian bound certifies x only from multipliers stationary to this (relative).
_EXACT_STATIONARITY = 1e-9
# The box and the affine set are separated when the levels differ by this (relative).
_SEPARATION_RTOL = 1e-7


def certify(data, res: SolverResult, s, w: np.ndarray | None) -> SolverResult:
    """Certify ``res`` (in place, returned) for ``data`` under settings ``s``; ``w`` the
    loss multipliers that go with ``res.duals`` when known."""
    if res.x is None or res.status not in R.SOLUTION_PRESENT:
        return res
    if not s.duals:
        # no multipliers wanted (a bootstrap's re-solves): the gap alone decides
        return _certify_gap_only(data, res, s)
    duals, w, chk, source = _certified_multipliers(data, res.x, res.duals or {}, w, s)
    db = _lp_bound(data, res, s)
    if db is not None and not chk["ok"]:
        chk3 = kkt_check(data, res.x, db[1], db[2], s.eps_abs, s.eps_rel)
        if chk3["ok"]:
            duals, w, chk, source = db[1], db[2], chk3, "lp bound"
    res.info["kkt"] = {k: v for k, v in chk.items() if k != "ok"}
    _record_multipliers(data, res, duals, w, chk, source)
    _set_status(data, res, s)
    return res


def _lp_bound(data, res: SolverResult, s):
    """When the ADMM dual point does not certify the gap: the best dual with the smooth loss
    multipliers fixed at ``x`` (an LP) usually does; its bound raises ``res.lower_bound`` and
    ``(bound, duals, w)`` is returned (``None`` when not tried or not found)."""
    if not (relative_gap(res.objective, res.lower_bound) > s.eps_rel
            and res.primal_residual <= s.eps_abs and lp_size(data) <= LP_MAX_NNZ):
        return None
    db = dual_bound_lp(data, res.x, s.eps_abs)
    if db is not None:
        res.info["lp_lower_bound"] = db[0]
        res.lower_bound = max(res.lower_bound, db[0])
    return db


def _certify_gap_only(data, res: SolverResult, s) -> SolverResult:
    """``duals=False``: the status from the violation and the gap, the LP over the
    multipliers raising the bound only when the ADMM dual point does not certify."""
    _lp_bound(data, res, s)
    res.duals = {}
    res.info["duals_certified"] = False
    res.info["duals_source"] = "not computed (duals=False)"
    _set_status(data, res, s)
    return res


def _certified_multipliers(data, x, duals, w, s):
    """``(duals, w, check, source)``: the given multipliers, or when they fail the KKT
    check, exact ones from an LP if those pass."""
    if w is None and data.separable_loss() is not None:
        c = constraint_gradient(data, duals)
        w = None if c is None else separable_loss_multiplier(data, c)
    chk = kkt_check(data, x, duals, w, s.eps_abs, s.eps_rel)
    if chk["ok"] or lp_size(data) > LP_MAX_NNZ:
        return duals, w, chk, "admm"
    lp = kkt_dual_lp(data, x, s.eps_abs)
    if lp is not None:
        chk2 = kkt_check(data, x, lp[0], lp[1], s.eps_abs, s.eps_rel)
        if chk2["ok"]:
            return lp[0], lp[1], chk2, "lp"
    # the feasibility LP reads the active sets off x and can miss (a kink or a bound within
    # rounding of eps_abs, or its own tolerance); the bound LP fixes only the smooth rows'
    # multipliers and maximises the Lagrangian, so at an optimal x its multipliers close
    # the gap and pass the check (a warm start at the optimum leaves ADMM multipliers that
    # are nowhere near, issue 26)
    db = dual_bound_lp(data, x, s.eps_abs)
    if db is not None:
        chk3 = kkt_check(data, x, db[1], db[2], s.eps_abs, s.eps_rel)
        if chk3["ok"]:
            return db[1], db[2], chk3, "lp bound"
    return duals, w, chk, "admm"


def _record_multipliers(data, res: SolverResult, duals, w, chk, source) -> None:
    """Return the multipliers only if they passed; their Lagrangian bound raises the
    certified lower bound when they are stationary to rounding error."""
    if not chk["ok"]:
        res.duals = {}
        res.info["duals_certified"] = False
        return
    duals, w = chk.get("duals", duals), chk.get("w", w)      # the exactly dual-feasible ones
    res.duals = duals
    res.info["duals_certified"] = True
    res.info["duals_source"] = source
    lb = lagrangian_bound(data, duals, w)
    res.info["duals_lower_bound"] = lb
    if math.isfinite(lb) and chk.get("stationarity", 1.0) <= _EXACT_STATIONARITY:
        res.lower_bound = max(res.lower_bound, lb)


def _set_status(data, res: SolverResult, s) -> None:
    """``optimal`` iff certified; otherwise an LP on the constraints alone may prove
    them infeasible."""
    res.gap = relative_gap(res.objective, res.lower_bound)
    # a gap below -eps_rel means the point undercuts the optimum through its violation
    certified = res.primal_residual <= s.eps_abs and -s.eps_rel <= res.gap <= s.eps_rel
    if res.status == R.OPTIMAL and not certified:
        res.status = R.OPTIMAL_INACCURATE
    elif res.status == R.OPTIMAL_INACCURATE and certified:
        res.status = R.OPTIMAL
    if res.status != R.OPTIMAL and constraints_feasible(data) is False:
        res.info["reason"] = "the constraints have no solution (HiGHS, constraints alone)"
        res.info["certificate"] = "lp"
        res.status = R.INFEASIBLE
        res.x = None
        res.objective = math.inf
        res.duals = {}


def separating_hyperplane(direction: np.ndarray, lower: np.ndarray, upper: np.ndarray, proj,
                          x_norm: float) -> dict | None:
    """A hyperplane separating the box ``[lower, upper]`` from the affine set of
    ``proj``: ``direction`` (ADMM's ``z - x``) projected onto ``range(A^T)`` and
    normalized is a certificate when ``sup_box lam^T x < lam^T x_0`` (the level of the
    affine set), with a margin relative to the sizes involved (``x_norm``: the iterate's)."""
    lam = direction - proj.project_nullspace(direction)
    nrm = _norm(lam)
    if nrm == 0:
        return None
    lam /= nrm
    with np.errstate(invalid="ignore"):
        sup_box = np.where(lam > 0, lam * upper, np.where(lam < 0, lam * lower, 0.0))
    if not np.all(np.isfinite(sup_box)):
        return None
    sup = float(sup_box.sum())
    level = float(_dot(lam, proj.particular))
    scale = 1.0 + _norm(proj.particular) + x_norm
    if sup < level - _SEPARATION_RTOL * scale:
        return {"direction": lam, "box_support": sup, "affine_level": level}
    return None

"""cvxdp.ADMM: recognise -> extract arrays -> solvers.admm -> write back."""
from __future__ import annotations

import math
import time
import weakref
from typing import Any

import numpy as np
import cvxpy as cp

from ..solvers import admm as admm_solver
from ..solvers.result import SOLUTION_PRESENT, INFEASIBLE

from ..recognise.l1_consistency import Extraction, recognise
from .base import Outcome

NAME = "CVXDP_ADMM"

#: ADMM-specific options beyond the shared ones, with their meaning
EXTRA_OPTIONS = {
    "rho": "initial penalty (default: from the loss weights)",
    "alpha": "over-relaxation in (0, 2) (default 1.6)",
    "adaptive_rho": "residual-balancing rho updates (default: on, except pure L1 on a tree)",
    "polish": "active-set polish for an exact final solution (default True)",
    "check_every": "iterations between convergence checks (default 10)",
    "equality_split": "'projection' (default: project onto A x = b) or 'penalty' (Lee et al. "
                      "Algorithm 1: A x - b as a residual block, x-update with A^T A + 2 I)",
}

# Warm-start cache: the last ADMM state of each problem object.
_STATE: "weakref.WeakKeyDictionary[cp.Problem, Any]" = weakref.WeakKeyDictionary()


class ADMMMethod:
    name = NAME
    extra_options = EXTRA_OPTIONS

    def recognise(self, problem: cp.Problem) -> Extraction:
        return recognise(problem)

    def solve(self, problem: cp.Problem, ext: Extraction, opts: dict[str, Any]) -> Outcome:
        settings = admm_solver.ADMMSettings(
            max_iters=int(opts.get("max_iters") or admm_solver.ADMMSettings.max_iters),
            eps_abs=float(opts.get("eps_abs") or admm_solver.ADMMSettings.eps_abs),
            eps_rel=float(opts.get("eps_rel") or admm_solver.ADMMSettings.eps_rel),
            time_limit=float(opts.get("time_limit") or math.inf),
            verbose=bool(opts.get("verbose", False)),
            callback=opts.get("callback"),
        )
        for key, cast in (("rho", float), ("alpha", float), ("adaptive_rho", bool),
                          ("polish", bool), ("check_every", int), ("equality_split", str)):
            if opts.get(key) is not None:
                setattr(settings, key, cast(opts[key]))
        if ext.trivially_infeasible:
            return Outcome(status=INFEASIBLE, primal={}, objective=math.inf, iterations=0,
                           solve_time=0.0, setup_time=0.0,
                           extra={"reason": ext.trivially_infeasible})
        x0 = state = None
        if opts.get("warm_start", True):
            if all(v.value is not None for v in ext.variables):
                x0 = np.concatenate([np.asarray(v.value, dtype=float).ravel(order="F")
                                     for v in ext.variables])
            state = _STATE.get(problem)
            if state is not None and state.z.size != ext.data.n:
                state = None
        res = admm_solver.solve(ext.data, settings, x0=x0, state=state)
        if res.state:
            _STATE[problem] = res.state
        extra = {
            "method": "ADMM",
            "splitting": res.info.get("splitting"),
            "objective": res.objective,
            "lower_bound": res.lower_bound,
            "gap": res.gap,
            "primal_residual": res.primal_residual,        # largest violation of the returned x
            "dual_residual": res.dual_residual,            # ADMM's last dual residual
            "admm_primal_residual": res.info.get("admm_primal_residual"),
            "constraint_violation": res.info.get("violation"),
            "rho": res.info.get("rho"),
            "polish": res.info.get("polish"),
            "history": res.history,
        }
        if "certificate" in res.info:
            extra["infeasibility_certificate"] = res.info["certificate"]
        if "reason" in res.info:
            extra["reason"] = res.info["reason"]
        present = res.status in SOLUTION_PRESENT and res.x is not None
        duals = _map_duals(ext, res.duals) if present else {}
        primal = unstack(res.x, ext) if present else {}
        return Outcome(status=res.status, primal=primal, objective=res.objective,
                       iterations=res.iterations,
                       solve_time=res.solve_time, setup_time=res.setup_time, extra=extra,
                       duals=duals)


def _map_duals(ext: Extraction, duals: dict) -> dict[int, Any]:
    """Solver multipliers -> ``{constraint id: dual value}`` in cvxpy's conventions:
    equality ``y^T (lhs - rhs)``, inequality ``lam^T (lhs - rhs)`` with ``lam >= 0``."""
    out: dict[int, Any] = {}
    y = duals.get("eq")
    for con, start, stop in ext.eq_blocks:
        val = np.zeros(stop - start) if y is None else np.asarray(y[start:stop], dtype=float)
        out[con.id] = _shape_like(con, val)
    ineq_vals = [np.zeros(c.size) for c in ext.ineq_constraints]
    for key, src in (("lower", ext.lower_src), ("upper", ext.upper_src)):
        s = duals.get(key)
        if s is None or src is None:
            continue
        coords = np.flatnonzero(src >= 0)
        for j in coords:
            cid, row, a = ext.bound_sources[int(src[j])]
            ineq_vals[cid][row] = float(s[j]) / abs(a)
    order = duals.get("order")
    if order is not None and ext.data.chains is not None:
        for chain, mult in zip(ext.data.chains.chains, order):
            for pos in range(chain.size - 1):
                cid, row, coef, _ = ext.order_edges[int(chain[pos])]
                ineq_vals[cid][row] = float(mult[pos]) / coef
    for con, val in zip(ext.ineq_constraints, ineq_vals):
        out[con.id] = _shape_like(con, val)
    return out


def unstack(x: np.ndarray, ext: Extraction) -> dict[int, Any]:
    """Split the stacked vector into ``{variable id: value}`` (column-major)."""
    out = {}
    for v in ext.variables:
        off = ext.linearizer.offsets[v.id]
        val = np.asarray(x[off:off + v.size], dtype=float)
        out[v.id] = float(val[0]) if v.shape == () else val.reshape(v.shape, order="F")
    return out


def _shape_like(con, flat: np.ndarray):
    if con.shape == ():
        return float(flat[0])
    return np.asarray(flat).reshape(con.shape, order="F")

"""Exact routes for the general case of the consistency problem (issue 26, item 5).

The general ADMM splitting (:mod:`~cvxdp.solvers.consistency.general`: loss rows ``M x - y``
that are not separable, equalities ``A x = b`` that are no tree) converges slowly: its
x-update couples every coordinate through ``M^T M``, residual balancing has to stay in a
narrow range, and the certificate (a dual point in every conjugate's domain) is reached
long after the iterate is accurate.  Off the tree / separable structures a sparse
factorisation of the whole problem is the faster tool, so this module solves

* **pure L1** (every row's ``w2 = 0``) as the LP ``min w1^T (t+ + t-)`` over
  ``(x, t+, t-)`` with ``M x - t+ + t- = y``, ``A x = b``, ``D x <= 0`` (order chains) and
  the bounds, by HiGHS through :func:`scipy.optimize.linprog` (interior point, then
  crossover to a vertex: exact multipliers);
* **elastic net / squared** rows as a QP by the primal-dual interior point of
  :mod:`~cvxdp.solvers.consistency.ipm` (each row's columns eliminated, every Newton step one
  factorisation in ``x``), then its active-set polish (:func:`.active_set_qp.polish`: exact
  multipliers).  OSQP on the same QP (an ADMM on the sparse KKT system, polished) was
  measured first: 1,450 iterations and 2.5 s on the issue's 600-variable elastic net against
  Clarabel's 0.9 s, and its polish failed at looser tolerances.

The multipliers are mapped to the family's (``w`` for the loss rows, ``eq``, ``lower``,
``upper``, ``order``; :mod:`~cvxdp.solvers.consistency.kkt`) and the result goes through
the same certificate as the ADMM's (:func:`~cvxdp.solvers.consistency.certify.certify`):
``optimal`` only with a certified gap and multipliers passing the KKT check.  What does
not certify returns ``None`` with the point, and the caller runs the ADMM from it.
"""
from __future__ import annotations

import math
import time
from dataclasses import replace

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from .. import result as R
from .certify import certify
from .active_set_qp import polish as ipm_polish
from .ipm import IPMResult, solve_qp as ipm_qp
from .kkt import exact_dual_point, has_chains, has_eq, lagrangian_bound, order_matrix, split_order
from .lp import constraints_feasible
from .problem import ADMMSettings, ConsistencyData
from ..result import SolverResult, relative_gap

__all__ = ["applies", "run", "certified_rerun", "from_point", "solve_lp", "solve_qp", "polish", "ROUTE_LP",
           "ROUTE_LP_SIMPLEX", "ROUTE_QP", "ROUTE_ACTIVE"]

ROUTE_LP = "LP (HiGHS interior point)"
ROUTE_LP_SIMPLEX = "LP (HiGHS dual simplex)"
# HiGHS's dual simplex up to this many LP columns (n + 2 x loss rows), its interior point and
# crossover beyond: at n = 100 (500 columns) the simplex took 8.0-9.6 ms a solve against
# 9.8-10.8 ms, at n = 300 (1,500) 30-47 ms against 25-31 ms, at 1,000 five times as long
_SIMPLEX_COLUMNS = 800
ROUTE_QP = "QP (interior point)"
# the interior point's iterates polished before this accuracy get this many active-set rounds
# (successful early polishes took 1-4, measured at n = 1,000 and 3,000); tighter ones the full
_TIGHT_ATTEMPT = 1e-7
_LOOSE_ROUNDS = 3
ROUTE_ACTIVE = "active set of the iterations' point"
# a coordinate this close to a bound, an L1 residual this close to zero (relative to the
# point's / the rows' largest terms) is guessed active by :func:`from_point` (the polish
# corrects a wrong guess: 1e-12 to 1e-6 all certified the four instances measured)
_ACTIVE_TOL = 1e-9


def applies(data: ConsistencyData, s: ADMMSettings) -> bool:
    """The general case (the ADMM would take the general splitting) with ``general_route``
    ``"auto"``, the default projection split and polishing on (``polish=False`` asks for the
    ADMM's own iterate, ``equality_split="penalty"`` for Lee et al.'s Algorithm 1)."""
    if s.general_route not in ("auto", "admm"):
        raise ValueError(f"general_route must be 'auto' or 'admm', got {s.general_route!r}")
    if s.general_route != "auto" or s.equality_split != "projection" or not s.polish:
        return False
    return data.separable_loss() is None or (has_eq(data) and has_chains(data))


def run(data: ConsistencyData, s: ADMMSettings):
    """The exact route: a certified :class:`SolverResult` (``optimal`` with certified
    multipliers, or ``infeasible``), else ``(None, x)`` with the route's point (or ``None``)
    for the ADMM to start from."""
    t0 = time.perf_counter()
    pure_l1 = not np.any(data.w2 > 0)
    res, w = solve_lp(data, s) if pure_l1 else (None, None)
    if res is None:
        res, w = solve_qp(data, s)
    if res is None:
        if constraints_feasible(data) is False:
            return _infeasible(ROUTE_QP, t0, "HiGHS, constraints alone")
        return None, w
    if res.status == R.INFEASIBLE:
        return res
    out = res if res.info.pop("finished", False) else _finish(data, res, w, s)
    if out is None:
        return None, res.x
    out.solve_time = time.perf_counter() - t0
    out.state = {}
    return out


def certified_rerun(data: ConsistencyData, s: ADMMSettings, t0: float,
                    x: np.ndarray | None = None) -> SolverResult | None:
    """The exact route's result when it is ``optimal`` with certified multipliers, run within
    what is left of ``s.time_limit`` since ``t0`` (a ``time.perf_counter()`` time); else
    ``None``.  How an iterative answer that certified its gap but not its multipliers is
    finished (:func:`cvxdp.solvers.consistency.admm.solve`,
    :mod:`cvxdp.solvers.local.exact`).  ``x``, the iterations' point, is tried first: the
    exact solution on the active set it points at (:func:`from_point`)."""
    out = from_point(data, x, s) if x is not None else None
    if out is not None:
        return out
    left = s.time_limit - (time.perf_counter() - t0)
    if left <= 0:
        return None
    out = run(data, replace(s, time_limit=left))
    if isinstance(out, SolverResult) and out.status == R.OPTIMAL and out.info.get("duals_certified"):
        return out
    return None


def from_point(data: ConsistencyData, x: np.ndarray, s: ADMMSettings) -> SolverResult | None:
    """The exact solution on the active set that ``x`` (a point optimal to ``eps_rel``)
    points at: coordinates within :data:`_ACTIVE_TOL` of a bound fixed there, L1 rows whose
    residual is that small held at their kink (the interior point's polish,
    :func:`.active_set_qp.polish`, with its corrections of a wrong guess).  Its certified
    result, or ``None`` (order chains; no consistent active set; no certificate).

    Why: where the data are many orders of magnitude above the optimum's objective (cells
    of 1e6 under a total of 1e7, an objective of 12: the stress set's ``local_scales``), the
    interior point cannot reach the relative accuracy the multipliers need (1e-12 of the
    data) and stalls, while the iterations' proximal steps put kinks and bounds exactly at
    zero: one solve on that active set gives exact multipliers (measured at seed 19: the
    4 answers without duals and 2 of the 3 that stalled at 10,000 iterations certified, in
    2-12 ms a solve; the third, still 5% above the optimum, did not)."""
    if has_chains(data):
        return None
    t0 = time.perf_counter()
    x = np.clip(np.asarray(x, dtype=float), data.lower, data.upper)
    mx = data.M @ x
    r = mx - data.y
    xtol = _ACTIVE_TOL * max(1.0, float(np.max(np.abs(x), initial=0.0)))
    rtol = _ACTIVE_TOL * max(1.0, float(np.max(np.abs(mx), initial=0.0)),
                             float(np.max(np.abs(data.y), initial=0.0)))
    at_lo = x - data.lower <= xtol
    at_hi = (data.upper - x <= xtol) & ~at_lo
    kink = (data.w1 > 0) & (np.abs(r) <= rtol)
    out = ipm_polish(data, IPMResult(x, None, None, 0, 0.0, at_lo, at_hi, kink), s.eps_abs)
    if out is None:
        return None
    xp, duals, w = out
    res = _result(data, xp, duals, R.OPTIMAL, ROUTE_ACTIVE, 0, t0)
    exact = exact_dual_point(data, duals, w)
    bound = lagrangian_bound(data, exact[0], exact[1]) if exact is not None else -math.inf
    # on the right active set the polish's multipliers are exact and their bound meets the
    # objective; otherwise the full certificate (which may solve an LP for a bound) is not
    # worth its cost here: the caller goes on
    if relative_gap(res.objective, bound) > s.eps_rel:
        return None
    return _certified(data, res, w, s, bound)


def _finish(data, res: SolverResult, w, s, rounds: int | None = None) -> SolverResult | None:
    """The certified result of a route's point, or ``None``.  The interior point's point is
    polished first (one sparse solve: exact multipliers, where its own miss the
    complementarity test at degenerate coordinates), its own multipliers are the second
    choice."""
    pol = polish(data, res, s, rounds) if "ipm_active" in res.info else None
    res.info.pop("ipm_active", None)
    out = _certified(data, pol[0], pol[1], s) if pol is not None else None
    return out if out is not None else _certified(data, res, w, s)


def _infeasible(route: str, t0: float, how: str) -> SolverResult:
    return SolverResult(x=None, status=R.INFEASIBLE, objective=math.inf,
                        solve_time=time.perf_counter() - t0,
                        info={"reason": f"the constraints (A x = b, bounds, order) have no solution ({how})",
                              "certificate": "lp", "route": route})


def _certified(data, res: SolverResult, w, s, bound: float | None = None) -> SolverResult | None:
    """``res`` through the family's certificate, with the Lagrangian bound of its own
    multipliers (``bound`` when the caller has it) as the starting lower bound; ``None``
    unless ``optimal`` with certified multipliers."""
    if bound is None:
        exact = exact_dual_point(data, res.duals, w) if w is not None else None
        bound = lagrangian_bound(data, exact[0], exact[1]) if exact is not None else -math.inf
    res.lower_bound = max(res.lower_bound, bound)
    res = certify(data, res, s, w)
    if res.status == R.OPTIMAL and (res.info.get("duals_certified") or not s.duals):
        return res
    return None


def _loss_rows(data: ConsistencyData, keep: np.ndarray):
    M = data.M.tocsr()
    return M[keep], data.y[keep]


def solve_lp(data: ConsistencyData, s: ADMMSettings):
    """``min sum w1 |M x - y|`` under the constraints as an LP (HiGHS)."""
    t0 = time.perf_counter()
    n = data.n
    rows = np.flatnonzero(data.w1 > 0)
    Ml, yl = _loss_rows(data, rows)
    k = rows.size
    I = sp.identity(k, format="csr")
    blocks = [sp.hstack([Ml, -I, I])]
    rhs = [yl]
    p = data.A.shape[0] if has_eq(data) else 0
    if p:
        blocks.append(sp.hstack([data.A, sp.csr_matrix((p, 2 * k))]))
        rhs.append(data.b)
    A_eq = sp.vstack(blocks).tocsc()
    b_eq = np.concatenate(rhs)
    A_ub = b_ub = None
    if has_chains(data):
        D = order_matrix(data.chains, n)
        A_ub = sp.hstack([D, sp.csr_matrix((D.shape[0], 2 * k))]).tocsc()
        b_ub = np.zeros(D.shape[0])
    w1 = data.w1[rows]
    c = np.r_[np.zeros(n), w1, w1]
    lo = np.r_[data.lower, np.zeros(2 * k)]
    hi = np.r_[data.upper, np.full(2 * k, np.inf)]
    options = {"disp": bool(s.verbose)}
    if math.isfinite(s.time_limit):
        options["time_limit"] = float(s.time_limit)
    simplex = c.size <= _SIMPLEX_COLUMNS
    route = ROUTE_LP_SIMPLEX if simplex else ROUTE_LP
    try:
        res = linprog(c, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=b_eq, bounds=np.c_[lo, hi],
                      method="highs-ds" if simplex else "highs-ipm", options=options)
    except (ValueError, MemoryError):
        return None, None
    if res.status == 2:
        return _infeasible(route, t0, "HiGHS"), None
    if res.status != 0 or res.x is None:
        return None, (res.x[:n] if res.x is not None else None)
    x = res.x[:n]
    # scipy's marginals are d fun / d rhs = minus cvxpy's multipliers
    nu = -np.asarray(res.eqlin.marginals)
    m = data.M.shape[0]
    w = np.zeros(m)
    w[rows] = np.clip(nu[:k], -w1, w1)
    duals = {"lower": np.maximum(np.asarray(res.lower.marginals)[:n], 0.0),
             "upper": np.maximum(-np.asarray(res.upper.marginals)[:n], 0.0)}
    if p:
        duals["eq"] = nu[k:k + p]
    if has_chains(data):
        duals["order"] = split_order(data.chains, np.maximum(-np.asarray(res.ineqlin.marginals), 0.0))
    out = _result(data, x, duals, R.OPTIMAL, route, int(getattr(res, "nit", 0) or 0), t0)
    return out, w


def solve_qp(data: ConsistencyData, s: ADMMSettings):
    """Squared / elastic-net rows: the interior point of :mod:`.ipm`."""
    t0 = time.perf_counter()
    deadline = t0 + s.time_limit if math.isfinite(s.time_limit) else math.inf
    finished: list[SolverResult] = []

    def as_result(out) -> SolverResult:
        res = _result(data, out.x, out.duals, R.OPTIMAL, ROUTE_QP, out.iterations, t0)
        res.info["ipm_accuracy"] = out.accuracy
        res.info["ipm_active"] = out
        return res

    def accept(out) -> bool:            # an early iterate that polishes and certifies ends it
        # a loose iterate's active set is right at once or not worth chasing: each round is
        # a factorisation, and where the Newton matrices fill in one costs several iterations
        # (n = 10,000: 8.9 s against 2.4 s; a loose attempt of 3 rounds failed in 26.6 s)
        loose = out.accuracy > _TIGHT_ATTEMPT
        if loose and out.filled:
            return False
        done = _finish(data, as_result(out), out.w, s, _LOOSE_ROUNDS if loose else None)
        if done is not None:
            done.info["finished"] = True
            finished.append(done)
        return done is not None

    out = ipm_qp(data, deadline, verbose=bool(s.verbose), accept=accept)
    if out is None:
        return None, None
    return (finished[0], out.w) if finished else (as_result(out), out.w)


def polish(data: ConsistencyData, res: SolverResult, s: ADMMSettings, rounds: int | None = None):
    """The interior point's near-degenerate coordinates (both slacks ~ sqrt(mu)) can leave a
    point whose multipliers miss the complementarity test at ``eps_abs``: the exact solution
    on the active set it points at (:func:`.active_set_qp.polish`).  ``(result, w)`` or ``None``."""
    act = res.info.get("ipm_active")
    if act is None:
        return None
    t0 = time.perf_counter()
    out = ipm_polish(data, act, s.eps_abs, rounds)
    if out is None:
        return None
    x, duals, w = out
    pol = _result(data, x, duals, R.OPTIMAL, res.info["route"], res.iterations, t0)
    pol.info["polish"] = {"attempts": 1, "success": True, "rounds": 1}
    return pol, w


def _result(data, x, duals, status, route, iters, t0) -> SolverResult:
    viol = float(max(0.0, np.max(data.lower - x, initial=0.0), np.max(x - data.upper, initial=0.0)))
    if has_eq(data):
        viol = max(viol, float(np.max(np.abs(data.A @ x - data.b), initial=0.0)))
    if has_chains(data):
        viol = max(viol, float(np.max(order_matrix(data.chains, data.n) @ x, initial=0.0)))
    return SolverResult(x=x, status=status, objective=data.objective(x), lower_bound=-math.inf,
                        duals=duals, iterations=iters, primal_residual=viol, dual_residual=math.nan,
                        solve_time=time.perf_counter() - t0,
                        info={"route": route, "violation": viol})

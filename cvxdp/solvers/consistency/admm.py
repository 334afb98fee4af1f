"""ADMM for maximum-likelihood post-processing under consistency constraints.

Problem (Lee, Wang, Kifer, KDD 2015, eqs. 7, 23 and 5)::

    minimize    sum_i  w1_i |(M x - y)_i| + (w2_i / 2) (M x - y)_i^2
    subject to  A x = b,   lower <= x <= upper,   x monotone along given chains

``w1`` alone is the Laplace MLE (``w1 = 1/b``), ``w2`` alone the Gaussian MLE
(``w2 = 1/sigma^2``), both the elastic net (eq. 23).

Two splittings, chosen from the structure of ``M``:

* **separable** (:mod:`~cvxdp.solvers.consistency.separable`; ``M`` has at most one entry per
  row and per column): the loss and bounds are one separable function with a closed-form
  prox, the constraint set is handled by its projection (tree, general ``A``, chains).
* **general** (:mod:`~cvxdp.solvers.consistency.general`; any ``M``, e.g. the matrix mechanism
  ``min |A x - r|_1, x >= 0``, Algorithm 4): residual split ``r = M x - y`` plus one
  consensus copy of ``x`` per constraint set.
* **lifted** (``data.lift``: ``M`` is a hierarchy's query matrix over the leaf
  counts, rows the indicators of a laminar family): solved in node space by the
  separable splitting with the tree projection, mapped back ``x = z[leaves]``.
* rows of ``A`` that fix one coordinate beside forest consistency (OpenDP's b-ary tree)
  become bounds (:mod:`~cvxdp.solvers.consistency.fixings`), then as above.

Beyond the paper, and what makes it fast: over-relaxation, residual-balancing
adaptive ``rho`` (one common ``rho``, so no refactorization is ever needed),
warm starts, a certified duality gap as the stopping rule, and a *polish*
(:mod:`~cvxdp.solvers.consistency.polish`) that fixes the identified active set and solves the
remaining equality-constrained problem exactly, which turns a 1e-3 iterate into a
solution optimal to rounding error.  What is returned is certified by
:mod:`~cvxdp.solvers.consistency.certify`.

This module holds :func:`solve` and the iteration loop shared by the splittings.
"""
from __future__ import annotations

import math
import time
from dataclasses import replace

import numpy as np
import scipy.sparse as sp

from . import fixings, singletons
from . import general_exact
from . import histogram_tree
from . import isotonic_l1
from .. import result as R
from .._table import IterationTable
from .certify import certify
from .general import GeneralADMM
from .kkt import constraint_gradient, separable_loss_multiplier
from .lp import constraints_feasible
from .polish import PolishResult
from .problem import ADMMSettings, ADMMState, ConsistencyData
from .separable import SeparableADMM
from .splitting import Candidate, Splitting
from ..result import SolverResult, relative_gap
from ..tree.forest import ancestor_sums

__all__ = ["ConsistencyData", "ADMMSettings", "solve", "ADMMState"]

# Problem size above which checks are spaced out (interval grows like sqrt(n)).
_CHECK_SPACING_N = 1e5
_MAX_CHECK_INTERVAL = 50
# A last polish after convergence (exact multipliers) is tried when at least this
# accuracy was asked for; at looser tolerances it rarely succeeds and costs a step's time.
_FINAL_POLISH_EPS = 1e-6
# Checks after a failed polish before trying again even if the gap has not halved.
_RETRY_CHECKS = 10
# Once the gap is certified but the multipliers fail the KKT check, iterating and
# polishing continues for at most this fraction of the time spent so far.
_PURSUIT_TIME_FRACTION = 0.3
# ... and at least this many seconds: a small problem's first 30 iterations take ~5 ms, so the
# fraction alone ended the pursuit after one more check (an elastic net on OpenDP's layout, 240
# nodes: exact multipliers 20 iterations later, issue 26)
_PURSUIT_MIN_SECONDS = 0.05
# The active set counts as settled when fewer than this fraction of coordinates
# changed status since the previous check.
_SETTLED_FRACTION = 1e-4
# an optimal answer without certified multipliers is solved again by the exact route up to
# this many unknowns (the interior point's dense path ends at 12,000)
_EXACT_DUALS_MAX = 5000

_COLUMNS = [("iter", "d"), ("objective", ".6e"), ("lower bnd", ".6e"), ("rel gap", ".2e"),
            ("pri res", ".2e"), ("dua res", ".2e"), ("rho", ".2e"), ("time [s]", ".2e")]


# ---------------------------------------------------------------------------
def solve(data: ConsistencyData, settings: ADMMSettings | None = None,
          x0: np.ndarray | None = None, state: ADMMState | None = None) -> SolverResult:
    """Solve ``data`` by ADMM.  ``x0`` (e.g. ``Variable.value``) and/or a previous
    ``state`` warm-start the iteration."""
    settings = settings or ADMMSettings()
    t0 = time.perf_counter()
    res = _solve(data, settings, x0, state)
    return _exact_duals(data, settings, res, t0)


def _exact_duals(data: ConsistencyData, s: ADMMSettings, res: SolverResult, t0: float) -> SolverResult:
    """An ``optimal`` answer whose multipliers did not certify: its point is optimal to
    ``eps_rel`` but not close enough to the exact optimum for the KKT check (stress seeds 0,
    7, 11: 1-3 of 1,500 instances, histograms with invariants and a matrix mechanism).  A
    small problem is then solved by the exact route (the LP, or the interior point and its
    active-set polish, :mod:`.general_exact`), whose certified result with its multipliers
    replaces it; otherwise it stays as it was.  Not when the ADMM's own general splitting
    was asked for (``general_route="admm"``, or no polish)."""
    if not (res.status == R.OPTIMAL and s.duals and not res.info.get("duals_certified")
            and data.n <= _EXACT_DUALS_MAX and s.general_route == "auto" and s.polish):
        return res
    out = general_exact.certified_rerun(data, s, t0, res.x)
    if out is None:
        return res
    out.info["route"] = f"{res.info.get('route')}, then {out.info.get('route')} for exact multipliers"
    out.iterations += res.iterations
    out.solve_time = time.perf_counter() - t0
    out.state = res.state
    return out


def _solve(data: ConsistencyData, settings: ADMMSettings, x0, state) -> SolverResult:
    tree = histogram_tree.detect(data, data.shape)
    if tree is not None:
        res = histogram_tree.solve(tree, eps_rel=settings.eps_rel, max_iters=settings.max_iters,
                                   time_limit=settings.time_limit, verbose=settings.verbose,
                                   callback=settings.callback)
        if res is not None:
            if res.status == R.OPTIMAL and settings.duals and not res.info["duals_certified"]:
                # multipliers the tree route does not read off (invariants): the family's
                # certificate looks for exact ones (an LP on the active sets) at its point
                res = certify(data, res, settings, None)
            return res
    if isotonic_l1.applies(data):
        res = isotonic_l1.solve(data, settings)
        if res.status == R.OPTIMAL:
            return res                   # otherwise the iterations below settle it
    if not data.has_chains and data.tree_queries() is not None:
        return _solve_lifted(data, settings, x0, state)
    fixed = fixings.find(data)
    if fixed is not None:              # rows fixing one coordinate beside a forest
        res = singletons.solve(data, settings, x0, state, solve)    # substituted out, or
        return res if res is not None else fixings.solve(data, fixed, settings, x0, state, solve)
    if general_exact.applies(data, settings):
        # off the tree / separable structures: the LP (HiGHS) or the interior point, certified
        # the same way; what does not certify falls to the ADMM, started from its point
        t0 = time.perf_counter()
        out = general_exact.run(data, settings)
        if isinstance(out, SolverResult):
            return out
        if x0 is None and out[1] is not None:
            x0 = out[1]
        settings = replace(settings, time_limit=settings.time_limit - (time.perf_counter() - t0))
    t0 = time.perf_counter()
    solver = _splitting(data, settings)
    infeasible = solver.infeasible_setup or (
        not solver.surely_feasible and constraints_feasible(data) is False)
    setup = time.perf_counter() - t0
    if infeasible:
        return SolverResult(x=None, status=R.INFEASIBLE, objective=math.inf, setup_time=setup,
                            info={"reason": "the constraints (A x = b, bounds, order) have no solution",
                                  "route": "ADMM " + solver.name})
    res, w = _Iteration(solver, settings).run(x0, state, t0)
    res = certify(data, res, settings, w)
    res.setup_time = setup
    res.solve_time = time.perf_counter() - t0 - setup
    return res


def _splitting(data: ConsistencyData, settings: ADMMSettings) -> Splitting:
    """The separable splitting when the loss is separable and one constraint set (or
    none) is present, else the general one."""
    if settings.equality_split not in ("projection", "penalty"):
        raise ValueError(f"equality_split must be 'projection' or 'penalty', got {settings.equality_split!r}")
    sep = data.separable_loss()
    both_sets = data.has_eq and data.has_chains
    penalty = settings.equality_split == "penalty" and data.has_eq
    if sep is not None and not both_sets and not penalty:
        return SeparableADMM(data, sep, settings)
    return GeneralADMM(data, settings)


def _solve_lifted(data: ConsistencyData, settings: ADMMSettings, x0, state) -> SolverResult:
    """``M`` is a hierarchy's query matrix over the columns (:class:`tree.TreeQueries`):
    solve in node space, where the loss is separable and the constraint is tree
    consistency (the O(n) projection), then map back ``x = z[leaves]`` and the
    multipliers (a node's bound multiplier acts on every leaf below it)."""
    t0 = time.perf_counter()
    tq = data.tree_queries()
    nd, n_cons = _node_space(data)
    inner = state.extra.get("inner") if state is not None and state.shape.startswith("lifted:") else None
    z0 = None if x0 is None else tq.nodes_from_leaves(np.asarray(x0, float))
    res = solve(nd, settings, x0=z0, state=inner)
    setup = time.perf_counter() - t0 - res.solve_time
    res.info["route"] = "ADMM lifted " + str(res.info.get("route")).removeprefix("ADMM ")
    res.info["lifted_nodes"] = tq.n_nodes
    inner_state = res.state if isinstance(res.state, ADMMState) else None
    if res.x is not None:
        w = _to_leaf_space(data, nd, n_cons, res)
        if res.status != R.INFEASIBLE:
            res = certify(data, res, settings, w)
    if inner_state is not None:
        res.state = ADMMState("lifted:" + inner_state.shape, inner_state.rho,
                              res.x.copy() if res.x is not None else np.zeros(data.n), np.zeros(0),
                              extra={"inner": inner_state})
    res.setup_time = max(setup, 0.0) + res.setup_time
    return res


def _node_space(data: ConsistencyData) -> tuple[ConsistencyData, int]:
    """The lifted problem over the hierarchy's nodes (loss node-wise, consistency rows
    first, then ``A`` moved onto the leaf nodes) and its number of consistency rows."""
    tq = data.tree_queries()
    F = tq.forest
    N, m = tq.n_nodes, tq.m
    # the user's rows in their order; a row of no column stays empty (a constant loss)
    Mn = sp.csr_matrix((tq.row_scale, (tq.rows, np.arange(tq.rows.size))), shape=(m, N))
    C = F.consistency_matrix()
    internal = F.internal
    if data.has_eq:
        A = data.A.tocoo()
        A_leaf = sp.csr_matrix((A.data, (A.row, tq.leaf_node[A.col])), shape=(A.shape[0], N))
        A_n, b_n, hint = sp.vstack([C, A_leaf]).tocsr(), np.r_[np.zeros(C.shape[0]), data.b], None
    else:
        A_n, b_n, hint = C, np.zeros(C.shape[0]), (F, internal, np.ones(internal.size))
    lo, up = tq.bounds_from_leaves(data.lower, data.upper)
    has_rows = A_n.shape[0] > 0
    nd = ConsistencyData(n=N, M=Mn, y=data.y, w1=data.w1, w2=data.w2, lower=lo, upper=up,
                         A=A_n if has_rows else None, b=b_n if has_rows else None,
                         constant=data.constant, forest_hint=hint if has_rows else None)
    return nd, C.shape[0]


def _to_leaf_space(data: ConsistencyData, nd: ConsistencyData, n_cons: int, res: SolverResult):
    """Map the node-space result to the leaves (in place); returns the loss multipliers
    ``w`` of the user's rows when the node-space duals give them."""
    tq = data.tree_queries()
    x = res.x[tq.leaf_node]
    duals = res.duals or {}
    w = None
    if duals:
        c = constraint_gradient(nd, duals)
        w = None if c is None else separable_loss_multiplier(nd, c)
        out = {"lower": ancestor_sums(tq.forest, duals["lower"])[tq.leaf_node],
               "upper": ancestor_sums(tq.forest, duals["upper"])[tq.leaf_node]}
        if data.has_eq:
            out["eq"] = np.asarray(duals["eq"])[n_cons:]
        duals = out
    res.x, res.duals = x, duals
    res.objective = data.objective(x)
    viol = float(max(0.0, np.max(data.lower - x, initial=0.0), np.max(x - data.upper, initial=0.0)))
    if data.has_eq:
        viol = max(viol, float(np.max(np.abs(data.A @ x - data.b), initial=0.0)))
    res.primal_residual = viol
    res.info["violation"] = viol
    return w


# ---------------------------------------------------------------------------
class _Iteration:
    """The loop shared by the splittings: steps, periodic checks (certified bound,
    best feasible point), polish attempts, and the stopping rules.

    Polish schedule: once the identified active set has settled (few changes since the
    last check) and differs from the one a previous attempt failed on; after a failure,
    when the gap has halved or several checks have passed (the certified gap of some
    splittings stalls while the active set is right).  Once the gap is certified but the
    multipliers are not exact, a *pursuit* keeps iterating and polishing for a while."""

    def __init__(self, solver: Splitting, settings: ADMMSettings) -> None:
        self.sp = solver
        self.s = settings
        self.table = IterationTable(_COLUMNS, settings.verbose)
        self.history: list[dict] = []
        self.best: Candidate | None = None
        self.kkt_best: Candidate | None = None   # the best point whose multipliers pass the KKT check
        self.lower = -math.inf
        self.polish_info: dict = {"attempts": 0, "success": False, "rounds": 0}
        self.prev_sig = self.tried_sig = None
        self.tried_gap = math.inf
        self.checks_since_try = 0
        self.pursuit_end = None                  # converged, still polishing for exact multipliers
        self.pursuit_sig = None
        self.pursuit_deadline = math.inf

    def _check_interval(self) -> int:
        """A check (dual bound, feasible candidates) costs a few steps; on large problems
        they are spaced out, deterministically, so that runs are reproducible."""
        s = self.s
        return min(max(s.check_every, int(math.ceil(s.check_every * math.sqrt(self.sp.n / _CHECK_SPACING_N)))),
                   _MAX_CHECK_INTERVAL)

    def run(self, x0, state, t0) -> tuple[SolverResult, np.ndarray | None]:
        """Iterate to a status; returns the result and the loss multipliers of its duals."""
        s, sp_ = self.s, self.sp
        sp_.init_iterates(x0, state)
        self.table.header(f"cvxdp ADMM ({sp_.name} splitting), n = {sp_.data.n}")
        status, it, last_check, next_check = None, 0, None, 1
        interval = self._check_interval()
        for it in range(1, s.max_iters + 1):
            sp_.step()
            if sp_.adaptive and it % s.adaptive_rho_interval == 0:
                sp_.adapt_rho(sp_.residuals())
            if it < next_check and it < s.max_iters:
                continue
            chk = sp_.check()
            next_check = it + interval
            last_check = chk
            status = self._after_check(chk, it, time.perf_counter() - t0, interval)
            if status is not None:
                break
        if status is None:
            status = R.OPTIMAL_INACCURATE
        if status == R.OPTIMAL and s.polish and not self.polish_info["success"] and s.eps_rel <= _FINAL_POLISH_EPS:
            self._final_polish()
        if last_check is None:
            last_check = sp_.check()
        if status == R.INFEASIBLE:
            return self._infeasible_result(it, last_check), None
        return self._result(status, it, last_check)

    def _after_check(self, chk: dict, it: int, elapsed: float, interval: int):
        """Bookkeeping of one check; the status to stop with, or ``None``."""
        s = self.s
        self.lower = max(self.lower, chk["lower"])
        if chk["feasible_x"] is not None and (self.best is None or chk["primal_obj"] < self.best.objective):
            self.best = Candidate(chk["primal_obj"], chk["feasible_x"])
        self.checks_since_try += 1
        if self.pursuit_end is not None and self._pursuit_polish():
            pass
        elif s.polish and not self.polish_info["success"]:
            self._scheduled_polish()
        gap = self._gap()
        row = {"iter": it, "objective": self.best.objective if self.best else chk["primal_obj"],
               "lower bnd": self.lower, "rel gap": gap, "pri res": chk["r_prim"],
               "dua res": chk["r_dual"], "rho": self.sp.rho, "time [s]": elapsed}
        self.history.append(row)
        self.table.row(row)
        if self.best is not None and gap < -s.eps_rel:
            self.best = self.sp.unbelow(self.best)
            gap = self._gap()
        if self.best is not None and -s.eps_rel <= gap <= s.eps_rel:
            status = self._certified_stop(it, elapsed, interval)
            if status is not None:
                return status
        # converged residuals end the run, but not a pursuit of the multipliers under way (it
        # has its own end): an elastic net on OpenDP's layout stopped there, 20 iterations
        # short of exact multipliers (issue 26)
        if chk.get("residuals_converged") and chk["x_candidate_ok"] and self.pursuit_end is None:
            return R.OPTIMAL
        if chk.get("infeasible"):
            return R.INFEASIBLE
        if s.callback is not None and s.callback(dict(row, x=self.sp.current_x())):
            return R.USER_LIMIT
        if elapsed >= s.time_limit:
            return R.OPTIMAL_INACCURATE
        return None

    def _gap(self) -> float:
        return relative_gap(self.best.objective, self.lower) if self.best is not None else math.inf

    def _certified_stop(self, it: int, elapsed: float, interval: int):
        """The gap is certified: stop when the multipliers pass too (or polishing is
        off); else keep iterating and polishing for a while, the point found so far
        staying the answer."""
        s = self.s
        kb = self.kkt_best
        if kb is not None and -s.eps_rel <= relative_gap(kb.objective, self.lower) <= s.eps_rel:
            self.best = kb
            return R.OPTIMAL
        if not s.polish or not s.duals or self.sp.duals_certify(self.best):
            return R.OPTIMAL
        if self.pursuit_end is None:
            self.pursuit_end = it + max(5 * interval, it // 4)
            self.pursuit_deadline = max(elapsed * (1.0 + _PURSUIT_TIME_FRACTION),
                                        elapsed + _PURSUIT_MIN_SECONDS)
        elif it >= self.pursuit_end or elapsed >= self.pursuit_deadline:
            return R.OPTIMAL
        return None

    def _polish(self, record_reason: bool, thorough: bool = True) -> PolishResult:
        pol = self.sp.polish(thorough)
        self.polish_info["attempts"] += 1
        self.polish_info["rounds"] += pol.rounds
        if record_reason:
            self.polish_info["reason"] = pol.reason
        return pol

    @staticmethod
    def _candidate(pol: PolishResult) -> Candidate:
        return Candidate(pol.objective, pol.x, pol.duals, pol.w)

    def _pursuit_polish(self) -> bool:
        """During the pursuit: polish whenever the active set changed (``False``: it
        did not, and the regular schedule decides)."""
        sig = self.sp.active_signature()
        if not (sig is None or self.pursuit_sig is None or np.count_nonzero(sig != self.pursuit_sig) > 0):
            return False
        self.pursuit_sig = sig
        pol = self._polish(record_reason=False)
        if pol.ok and relative_gap(pol.objective, max(self.lower, pol.lower_bound)) <= self.s.eps_rel:
            self.lower = max(self.lower, pol.lower_bound)
            cand = self._candidate(pol)
            if self.sp.duals_certify(cand):
                self.kkt_best = cand
                self.polish_info["success"] = True
        return True

    def _settled(self, sig) -> bool:
        """Few coordinates changed status since the previous check."""
        changes = math.inf if self.prev_sig is None or sig is None else int(np.count_nonzero(sig != self.prev_sig))
        self.prev_sig = sig
        return sig is not None and changes <= max(2, _SETTLED_FRACTION * sig.size)

    def _scheduled_polish(self) -> None:
        """Polish when the active set settled on one not tried before and the gap is
        small enough (or halved since the last try, or enough checks passed)."""
        s = self.s
        sig = self.sp.active_signature()
        gap = self._gap()
        if not (self._settled(sig)
                and (gap <= min(s.polish_gap, self.tried_gap / 2) or self.checks_since_try >= _RETRY_CHECKS)
                and (self.tried_sig is None or np.count_nonzero(sig != self.tried_sig) > 0)):
            return
        self.tried_sig, self.tried_gap, self.checks_since_try = sig, gap, 0
        pol = self._polish(record_reason=True, thorough=False)
        if not pol.ok:
            return
        self.lower = max(self.lower, pol.lower_bound)
        cand = self._candidate(pol)
        if self.best is None or pol.objective <= self.best.objective:
            self.best = cand
        self.polish_info["success"] = relative_gap(pol.objective, pol.lower_bound) <= s.eps_rel
        if self.polish_info["success"] and self.sp.duals_certify(cand):
            self.kkt_best = cand

    def _final_polish(self) -> None:
        """Converged on the ADMM certificate: one polish turns the iterate into an
        exact KKT point (exact multipliers too) when the active set is right."""
        s, best = self.s, self.best
        pol = self._polish(record_reason=True)
        if (pol.ok and relative_gap(pol.objective, pol.lower_bound) <= s.eps_rel
                and (best is None or pol.objective <= best.objective + s.eps_rel * max(1.0, abs(best.objective)))):
            self.best = self._candidate(pol)
            self.lower = max(self.lower, pol.lower_bound)
            self.polish_info["success"] = True

    def _infeasible_result(self, it: int, last_check: dict) -> SolverResult:
        res = SolverResult(x=None, status=R.INFEASIBLE, objective=math.inf, iterations=it,
                           primal_residual=last_check["r_prim"], dual_residual=last_check["r_dual"],
                           history=self.history,
                           info={"route": "ADMM " + self.sp.name, "rho": self.sp.rho,
                                 "certificate": last_check.get("certificate")})
        res.state = self.sp.export_state()
        self.table.footer(f"status: {R.INFEASIBLE} after {it} iterations")
        return res

    def _returned_candidate(self, last_check: dict) -> Candidate:
        """The best certified-feasible point (else the constraint-satisfying iterate);
        below the certified bound it gains from its (allowed, <= eps_abs) violation,
        which large weights turn into a real objective difference: then an exactly
        feasible repair of it is preferred."""
        sp_, s = self.sp, self.s
        if self.best is None:
            x = last_check["x_candidate"]
            cand = Candidate(sp_.data.objective(x), x)
        else:
            cand = self.best
        if relative_gap(cand.objective, self.lower) < -s.eps_rel:
            xr = sp_.repair(cand.x)
            if xr is not None and sp_.violation(xr) <= min(s.eps_abs, sp_.violation(cand.x)):
                obj_r = sp_.data.objective(xr)
                if relative_gap(obj_r, self.lower) >= -s.eps_rel or obj_r > cand.objective:
                    cand = Candidate(obj_r, xr)
        return cand

    def _result(self, status: str, it: int, last_check: dict) -> tuple[SolverResult, np.ndarray | None]:
        sp_ = self.sp
        cand = self._returned_candidate(last_check)
        duals, w = sp_.multipliers_of(cand)
        obj, lower = cand.objective, self.lower
        viol = sp_.violation(cand.x)
        res = SolverResult(
            x=cand.x, status=status, objective=obj, lower_bound=lower, gap=relative_gap(obj, lower),
            duals=dict(duals), iterations=it, primal_residual=viol, dual_residual=last_check["r_dual"],
            history=self.history,
            info={"route": "ADMM " + sp_.name, "rho": sp_.rho, "polish": self.polish_info,
                  "violation": viol, "admm_primal_residual": last_check["r_prim"]})
        res.state = sp_.export_state()
        self.table.footer(f"status: {status}, objective {obj:.10g}, certified gap {res.gap:.2e}, "
                          f"{it} iterations, polish {'ok' if self.polish_info['success'] else 'no'}")
        return res, w

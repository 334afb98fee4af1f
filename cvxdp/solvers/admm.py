"""ADMM for maximum-likelihood post-processing under consistency constraints.

Problem (Lee, Wang, Kifer, KDD 2015, eqs. 7, 23 and 5)::

    minimize    sum_i  w1_i |(M x - y)_i| + (w2_i / 2) (M x - y)_i^2
    subject to  A x = b,   lower <= x <= upper,   x monotone along given chains

``w1`` alone is the Laplace MLE (``w1 = 1/b``), ``w2`` alone the Gaussian MLE
(``w2 = 1/sigma^2``), both the elastic net (eq. 23).

Two splittings, chosen from the structure of ``M``:

* **separable** (``M`` has at most one entry per row and per column, e.g. the
  noisy nodes of a hierarchy are measured directly): the loss and the bounds form
  one separable function ``f`` whose prox is the (elastic-net) soft threshold of
  eqs. 13-14 followed by a clip; the constraint set ``C`` (tree consistency,
  general ``A x = b``, or an order cone) is handled by its projection ``g = I_C``:
  the tree two-pass projection of Hay et al. (Algorithm 3's HTREE), a cached
  factorization for general ``A`` (Algorithms 1-2), or pool-adjacent-violators for
  order constraints.  Two-block ADMM ``x = prox_f(z - u)``, ``z = P_C(x + u)``.
* **general** (any ``M``, e.g. the matrix mechanism ``min |A x - r|_1, x >= 0``,
  Algorithm 4): residual split ``r = M x - y`` plus one consensus copy of ``x``
  per constraint set; the x-update solves with ``M^T M + k I`` factorized once.
* **lifted** (``data.lift``: ``M`` is a hierarchy's query matrix over the leaf
  counts, rows the indicators of a laminar family): solved in node space by the
  separable splitting with the tree projection, mapped back ``x = z[leaves]``.

Beyond the paper, and what makes it fast: over-relaxation, residual-balancing
adaptive ``rho`` (one common ``rho``, so no refactorization is ever needed),
warm starts, a certified duality gap as the stopping rule, and a *polish* that
fixes the identified active set (zero residuals, active bounds) and solves the
remaining equality-constrained problem exactly (primal by a weighted projection,
dual by interval propagation on the tree), which turns a 1e-3 iterate into a
solution optimal to rounding error.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np
import scipy.linalg as la
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from . import result as R
from ._table import IterationTable
from .affine import AffineProjector, ForestProjector, make_projector
from .isotonic import Chains, chain_dual
from .losses import SeparableLoss
from .polish import forest_dual
from ._linalg import dot as _dot, norm as _norm
from .result import SolverResult, relative_gap

__all__ = ["ConsistencyData", "ADMMSettings", "solve", "ADMMState"]


@dataclass
class ConsistencyData:
    """Arrays of the problem above.  ``M`` is ``m x n`` sparse; ``A``/``b`` may be
    ``None``; ``chains`` may be ``None``; ``constant`` is added to the objective."""

    n: int
    M: sp.csr_matrix
    y: np.ndarray
    w1: np.ndarray
    w2: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    A: sp.csr_matrix | None = None
    b: np.ndarray | None = None
    chains: Chains | None = None
    constant: float = 0.0
    forest_hint: Any = None          # (Forest, row_parent, row_scale) when known
    lift: Any = None                 # tree.TreeQueries when M is a hierarchy's query matrix

    def objective(self, x: np.ndarray) -> float:
        r = self.M @ x - self.y
        return float(_dot(self.w1, np.abs(r)) + 0.5 * _dot(self.w2, r * r)) + self.constant


@dataclass
class ADMMSettings:
    """Options (cvxpy-style names).  Tolerances: the result is *optimal* only when the
    returned point violates no constraint by more than ``eps_abs`` (absolute, in units
    of x) and its certified relative gap ``(f - L) / max(1, |f|)`` lies in
    ``[-eps_rel, eps_rel]`` (a point below the bound is gaining from its violation).
    OSQP-style residual convergence only stops the iteration; without a certificate
    (from the ADMM dual, the polish, or an LP over the multipliers) the status is
    ``optimal_inaccurate``.  Returned multipliers always pass a KKT check at the
    returned point (else ``duals = {}`` and ``info["duals_certified"] = False``)."""

    max_iters: int = 10000
    eps_abs: float = 1e-6
    eps_rel: float = 1e-6
    time_limit: float = math.inf
    rho: float | None = None
    adaptive_rho: bool | None = None   # None: automatic (see _SeparableADMM)
    adaptive_rho_interval: int = 20
    adaptive_rho_tolerance: float = 5.0
    alpha: float = 1.6
    check_every: int = 10
    polish: bool = True
    polish_gap: float = 1e-2          # try polishing once the gap is below this
    equality_split: str = "projection"  # or "penalty": A x = b as a residual block (Alg. 1)
    verbose: bool = False
    callback: Callable[[dict], bool] | None = None


@dataclass
class ADMMState:
    """What a warm start resumes from."""

    shape: str
    rho: float
    z: np.ndarray
    u: np.ndarray
    extra: dict = field(default_factory=dict)


# Initial rho for L1 terms, relative to (1/b)^2; and the fixed rho for pure L1 on a forest.
_L1_RHO_FACTOR = 0.5
_L1_FOREST_RHO = 2.0

# Problem size above which checks are spaced out (interval grows like sqrt(n)).
_CHECK_SPACING_N = 1e5

_MAX_CHECK_INTERVAL = 50

# A last polish after convergence (exact multipliers) is tried when at least this
# accuracy was asked for; at looser tolerances it rarely succeeds and costs a step's time.
_FINAL_POLISH_EPS = 1e-6

# Multipliers below this (relative) size are rounding noise in the dual bound.
_DUAL_ZERO_RTOL = 1e-9

# Checks after a failed polish before trying again even if the gap has not halved.
_RETRY_CHECKS = 10

# Below this scale factor the dual point is repaired coordinate-wise instead: scaling
# by even 0.999 costs 1e-3 of the objective, ten times a 1e-4 target.
_REPAIR_BELOW = 1.0

# rho is kept within [_RHO_MIN_FACTOR, _RHO_MAX_FACTOR] x its initial value: residual
# balancing on a degenerate iterate (a zero residual, a dual that vanished) would
# otherwise drive it to 1e-32 or to overflow, after which nothing moves.
_RHO_MIN_FACTOR = 1e-2
_RHO_MAX_FACTOR = 1e2
# The general splitting starts from a rho scaled to diag(M^T M); residual balancing
# there trades primal for dual progress and stalls the certificate when it strays far
# (600 variables, 200 random 0/1 rows, elastic net: 1e-3 x the scaled rho never
# certified in 10000 iterations; the scaled rho itself does in 381), so it gets a
# narrower range.
_GENERAL_RHO_RANGE = 3.0

# Exact checks with HiGHS (feasibility of the constraints alone; KKT multipliers for a
# given point) are run on problems up to this many nonzeros.
_LP_MAX_NNZ = 2_000_000

# Once the gap is certified but the multipliers fail the KKT check, iterating and
# polishing continues for at most this fraction of the time spent so far.
_PURSUIT_TIME_FRACTION = 0.3

# The active set counts as settled when fewer than this fraction of coordinates
# changed status since the previous check.
_SETTLED_FRACTION = 1e-4

_COLUMNS = [("iter", "d"), ("objective", ".6e"), ("lower bnd", ".6e"), ("rel gap", ".2e"),
            ("pri res", ".2e"), ("dua res", ".2e"), ("rho", ".2e"), ("time [s]", ".2e")]


# ---------------------------------------------------------------------------
def solve(data: ConsistencyData, settings: ADMMSettings | None = None,
          x0: np.ndarray | None = None, state: ADMMState | None = None) -> SolverResult:
    """Solve ``data`` by ADMM.  ``x0`` (e.g. ``Variable.value``) and/or a previous
    ``state`` warm-start the iteration."""
    settings = settings or ADMMSettings()
    if data.lift is not None and not (data.chains is not None and data.chains.chains):
        return _solve_lifted(data, settings, x0, state)
    t0 = time.perf_counter()
    sep = _separable_form(data)
    both_sets = (data.A is not None and data.A.shape[0] > 0
                 and data.chains is not None and bool(data.chains.chains))
    if settings.equality_split not in ("projection", "penalty"):
        raise ValueError(f"equality_split must be 'projection' or 'penalty', got {settings.equality_split!r}")
    penalty = settings.equality_split == "penalty" and data.A is not None and data.A.shape[0] > 0
    if sep is not None and not both_sets and not penalty:
        solver: _Base = _SeparableADMM(data, sep, settings)
    else:
        solver = _GeneralADMM(data, settings)
    if not solver.infeasible_setup and not getattr(solver, "_surely_feasible", False) \
            and _constraints_feasible(data) is False:
        solver.infeasible_setup = True
    setup = time.perf_counter() - t0
    if solver.infeasible_setup:
        return SolverResult(x=None, status=R.INFEASIBLE, objective=math.inf, setup_time=setup,
                            info={"reason": "the constraints (A x = b, bounds, order) have no solution",
                                  "splitting": solver.name})
    res = solver.run(x0, state, t0)
    res = _finalize(data, res, settings)
    res.setup_time = setup
    res.solve_time = time.perf_counter() - t0 - setup
    return res


def _solve_lifted(data: ConsistencyData, settings: ADMMSettings, x0, state) -> SolverResult:
    """``M`` is a hierarchy's query matrix over the columns (:class:`tree.TreeQueries`):
    solve in node space, where the loss is separable and the constraint is tree
    consistency (the O(n) projection), then map back ``x = z[leaves]`` and the
    multipliers (a node's bound multiplier acts on every leaf below it)."""
    from .tree import ancestor_sums
    from .polish import _constraint_gradient, separable_loss_multiplier

    t0 = time.perf_counter()
    tq = data.lift
    F = tq.forest
    N, m, n = tq.n_nodes, tq.m, data.n
    Mn = sp.csr_matrix((tq.row_scale, (np.arange(m), np.arange(m))), shape=(m, N))
    C = F.consistency_matrix()
    internal = F.internal
    has_eq = data.A is not None and data.A.shape[0] > 0
    if has_eq:
        A = data.A.tocoo()
        A_leaf = sp.csr_matrix((A.data, (A.row, tq.leaf_node[A.col])), shape=(A.shape[0], N))
        A_n, b_n, hint = sp.vstack([C, A_leaf]).tocsr(), np.r_[np.zeros(C.shape[0]), data.b], None
    else:
        A_n, b_n, hint = C, np.zeros(C.shape[0]), (F, internal, np.ones(internal.size))
    lo, up = tq.bounds_from_leaves(data.lower, data.upper)
    nd = ConsistencyData(n=N, M=Mn, y=data.y, w1=data.w1, w2=data.w2, lower=lo, upper=up,
                         A=A_n if A_n.shape[0] else None, b=b_n if A_n.shape[0] else None,
                         constant=data.constant, forest_hint=hint if A_n.shape[0] else None)
    inner = None
    if state is not None and state.shape.startswith("lifted:"):
        inner = state.extra.get("inner")
    z0 = None if x0 is None else tq.nodes_from_leaves(np.asarray(x0, float))
    res = solve(nd, settings, x0=z0, state=inner)
    setup = time.perf_counter() - t0 - res.solve_time
    res.info["splitting"] = "lifted " + str(res.info.get("splitting"))
    res.info["lifted_nodes"] = N
    inner_state = res.state if isinstance(res.state, ADMMState) else None
    if res.x is not None:
        z = res.x
        x = z[tq.leaf_node]
        duals = res.duals or {}
        w = None
        if duals:
            c = _constraint_gradient(nd, duals)
            w = None if c is None else separable_loss_multiplier(nd, c)
            out = {"lower": ancestor_sums(F, duals["lower"])[tq.leaf_node],
                   "upper": ancestor_sums(F, duals["upper"])[tq.leaf_node]}
            if has_eq:
                out["eq"] = np.asarray(duals["eq"])[C.shape[0]:]
            duals = out
        res.x, res.duals = x, duals
        res.objective = data.objective(x)
        viol = float(max(0.0, np.max(data.lower - x, initial=0.0), np.max(x - data.upper, initial=0.0)))
        if has_eq:
            viol = max(viol, float(np.max(np.abs(data.A @ x - data.b), initial=0.0)))
        res.primal_residual = viol
        res.info["violation"] = viol
        res.info["_w"] = None if w is None else w[:m]
        if res.status == R.INFEASIBLE:
            res.info.pop("_w", None)
        else:
            res = _finalize(data, res, settings)
    if inner_state is not None:
        res.state = ADMMState("lifted:" + inner_state.shape, inner_state.rho,
                              res.x.copy() if res.x is not None else np.zeros(n), np.zeros(0),
                              extra={"inner": inner_state})
    res.setup_time = max(setup, 0.0) + res.setup_time
    return res


def _lp_size(data: ConsistencyData) -> int:
    nnz = data.M.nnz + data.n
    if data.A is not None:
        nnz += data.A.nnz
    return nnz


def _constraints_feasible(data: ConsistencyData) -> bool | None:
    """Exact feasibility of the constraints alone (``A x = b``, bounds, order chains) by
    HiGHS: ``True``/``False``, or ``None`` when the LP is too large or inconclusive."""
    from scipy.optimize import linprog
    from .polish import _order_matrix

    has_eq = data.A is not None and data.A.shape[0] > 0
    has_ch = data.chains is not None and bool(data.chains.chains)
    if _lp_size(data) > _LP_MAX_NNZ:
        return None
    lo = np.where(np.isfinite(data.lower), data.lower, None)
    hi = np.where(np.isfinite(data.upper), data.upper, None)
    D = _order_matrix(data.chains, data.n) if has_ch else None
    try:
        res = linprog(np.zeros(data.n), A_eq=data.A if has_eq else None, b_eq=data.b if has_eq else None,
                      A_ub=D, b_ub=np.zeros(D.shape[0]) if D is not None else None,
                      bounds=list(zip(lo.tolist(), hi.tolist())), method="highs")
    except (ValueError, MemoryError):
        return None
    if res.status == 2:
        return False
    if res.status == 0:
        return True
    return None


def _finalize(data: ConsistencyData, res: SolverResult, s: ADMMSettings) -> SolverResult:
    """Certify what is returned: the multipliers must satisfy the KKT conditions at
    ``x`` (else they are dropped, ``info["duals_certified"] = False``); ``optimal``
    needs ``violation <= eps_abs`` and a certified gap ``<= eps_rel``; a run that did not
    reach ``optimal`` is checked for infeasibility of the constraints by an LP."""
    from .polish import kkt_check, kkt_dual_lp, lagrangian_bound, _constraint_gradient

    w = res.info.pop("_w", None)
    if res.x is None or res.status not in R.SOLUTION_PRESENT:
        return res
    x = res.x
    duals = res.duals or {}
    if w is None and _separable_form(data) is not None:
        from .polish import separable_loss_multiplier

        c = _constraint_gradient(data, duals)
        w = None if c is None else separable_loss_multiplier(data, c)
    chk = kkt_check(data, x, duals, w, s.eps_abs, s.eps_rel)
    source = "admm"
    if not chk["ok"] and _lp_size(data) <= _LP_MAX_NNZ:
        lp = kkt_dual_lp(data, x, s.eps_abs)
        if lp is not None:
            chk2 = kkt_check(data, x, lp[0], lp[1], s.eps_abs, s.eps_rel)
            if chk2["ok"]:
                duals, w = lp
                chk, source = chk2, "lp"
    if relative_gap(res.objective, res.lower_bound) > s.eps_rel and res.primal_residual <= s.eps_abs \
            and _lp_size(data) <= _LP_MAX_NNZ:
        # the ADMM dual point does not certify: the best dual with the smooth loss
        # multipliers fixed at x (an LP) usually does, and gives multipliers with it
        from .polish import dual_bound_lp

        db = dual_bound_lp(data, x, s.eps_abs)
        if db is not None:
            res.info["lp_lower_bound"] = db[0]
            res.lower_bound = max(res.lower_bound, db[0])
            if not chk["ok"]:
                chk3 = kkt_check(data, x, db[1], db[2], s.eps_abs, s.eps_rel)
                if chk3["ok"]:
                    duals, w = db[1], db[2]
                    chk, source = chk3, "lp bound"
    res.info["kkt"] = {k: v for k, v in chk.items() if k != "ok"}
    if chk["ok"]:
        res.duals = duals
        res.info["duals_certified"] = True
        res.info["duals_source"] = source
        lb = lagrangian_bound(data, duals, w)
        res.info["duals_lower_bound"] = lb
        # a bound from multipliers that are stationary to rounding error certifies x
        if math.isfinite(lb) and chk.get("stationarity", 1.0) <= 1e-9:
            res.lower_bound = max(res.lower_bound, lb)
    else:
        res.duals = {}
        res.info["duals_certified"] = False
    res.gap = relative_gap(res.objective, res.lower_bound)
    viol = res.primal_residual
    # a gap below -eps_rel means the point undercuts the optimum through its violation
    certified = viol <= s.eps_abs and -s.eps_rel <= res.gap <= s.eps_rel
    if res.status == R.OPTIMAL and not certified:
        res.status = R.OPTIMAL_INACCURATE
    elif res.status == R.OPTIMAL_INACCURATE and certified:
        res.status = R.OPTIMAL
    if res.status != R.OPTIMAL:
        feas = _constraints_feasible(data)
        if feas is False:
            res.info["reason"] = "the constraints have no solution (HiGHS, constraints alone)"
            res.info["certificate"] = "lp"
            res.status = R.INFEASIBLE
            res.x = None
            res.objective = math.inf
            res.duals = {}
    return res


def _separable_form(data: ConsistencyData) -> SeparableLoss | None:
    """Per-coordinate loss if every row of ``M`` has one entry and no column two
    (computed once per data object)."""
    key = (id(data.M), id(data.y), id(data.w1), id(data.w2), id(data.lower), id(data.upper))
    cached = data.__dict__.get("_separable_cache")
    if cached is not None and cached[0] == key:
        return cached[1]
    out = _separable_form_uncached(data)
    data.__dict__["_separable_cache"] = (key, out)
    return out


def _separable_form_uncached(data: ConsistencyData) -> SeparableLoss | None:
    M = data.M.tocsr()
    nnz_row = np.diff(M.indptr)
    if np.any(nnz_row > 1):
        return None
    keep = nnz_row == 1
    cols = M.indices
    if np.unique(cols).size != cols.size:
        return None
    a = M.data
    rows = np.flatnonzero(keep)
    n = data.n
    y = np.zeros(n)
    w1 = np.zeros(n)
    w2 = np.zeros(n)
    # phi(a x - y) = |a| w1 |x - y/a| + a^2 w2/2 (x - y/a)^2
    y[cols] = data.y[rows] / a
    w1[cols] = data.w1[rows] * np.abs(a)
    w2[cols] = data.w2[rows] * a * a
    return SeparableLoss(y, w1, w2, data.lower, data.upper)


def _weight_scale(w1: np.ndarray, w2: np.ndarray) -> float:
    """Typical size of the loss weights (the dual variables scale with it)."""
    vals = np.r_[w1[w1 > 0], np.sqrt(w2[w2 > 0])]
    return float(np.median(vals)) if vals.size else 1.0


def _initial_rho(w1: np.ndarray, w2: np.ndarray) -> float:
    """rho has the units of a curvature; for |r|/b the natural one is 1/b^2, and half
    of it did best on hierarchies of 2^12 - 2^20 leaves (benchmarks/consistency.py)."""
    parts = []
    if np.any(w1 > 0):
        parts.append(_L1_RHO_FACTOR * float(np.median(w1[w1 > 0])) ** 2)
    if np.any(w2 > 0):
        parts.append(float(np.median(w2[w2 > 0])))
    return max(parts) if parts else 1.0


class _Base:
    name = "base"
    infeasible_setup = False

    @property
    def adaptive(self) -> bool:
        """Residual balancing is on unless switched off (or, for ``None``, unless the
        splitting knows better: see :class:`_SeparableADMM`)."""
        return self.s.adaptive_rho is not False

    def _balanced_rho(self, pri: float, dua: float) -> float | None:
        """Residual balancing (OSQP): rho * sqrt(pri / dua) for the normalized primal and
        dual residuals, or None while their ratio is within the tolerance."""
        if pri <= 0 or dua <= 0:
            return None
        ratio = math.sqrt(pri / dua)
        tol = self.s.adaptive_rho_tolerance
        if ratio > tol or ratio < 1.0 / tol:
            new = min(max(self.rho * ratio, self.rho_min), self.rho_max)
            return new if new != self.rho else None
        return None

    def _set_rho_range(self) -> None:
        self.rho_min = _RHO_MIN_FACTOR * self.rho
        self.rho_max = _RHO_MAX_FACTOR * self.rho

    def __init__(self, data: ConsistencyData, settings: ADMMSettings) -> None:
        self.data = data
        self.s = settings
        self.table = IterationTable(_COLUMNS, settings.verbose)

    def repair(self, x):
        return None

    def _unbelow(self, best, lower):
        """A point whose objective is below the certified bound gains from its (allowed)
        violation; replace it by an exactly feasible repair when there is one."""
        obj, x, duals = best
        xr = self.repair(x)
        if xr is not None and self.violation(xr) <= min(self.s.eps_abs, self.violation(x)):
            obj_r = self.data.objective(xr)
            if obj_r >= obj:
                return (obj_r, xr, None)
        return best

    def _duals_certify(self, best) -> bool:
        """Do the multipliers of ``best`` (or those the splitting gives at its point)
        pass the KKT check?"""
        from .polish import kkt_check, _constraint_gradient, separable_loss_multiplier

        obj, x, duals = best
        duals = dict(self.duals(x) if duals is None else duals)
        w = duals.pop("_w", None)
        if w is None:
            w = self.loss_multiplier_guess()
        if w is None and _separable_form(self.data) is not None:
            c = _constraint_gradient(self.data, duals)
            w = None if c is None else separable_loss_multiplier(self.data, c)
        return bool(kkt_check(self.data, x, duals, w, self.s.eps_abs, self.s.eps_rel)["ok"])

    # shared loop ---------------------------------------------------------
    def run(self, x0, state, t0) -> SolverResult:
        s = self.s
        self.init_iterates(x0, state)
        self.table.header(f"cvxdp ADMM ({self.name} splitting), n = {self.data.n}")
        history: list[dict] = []
        best = None                     # (objective, x, duals, lower_bound)
        lower = -math.inf
        status = None
        it = 0
        polish_info: dict = {"attempts": 0, "success": False}
        prev_sig = tried_sig = None
        tried_gap = math.inf
        checks_since_try = 0
        last_check = None
        next_check = 1
        kkt_best = None                 # the best point whose multipliers pass the KKT check
        pursuit_end = None              # converged, still polishing for exact multipliers
        pursuit_sig = None
        pursuit_deadline = math.inf
        # A check (dual bound, feasible candidates) costs a few steps; on large problems
        # they are spaced out, deterministically, so that runs are reproducible.
        interval = min(max(s.check_every, int(math.ceil(
            s.check_every * math.sqrt(self.n / _CHECK_SPACING_N)))), _MAX_CHECK_INTERVAL)
        for it in range(1, s.max_iters + 1):
            self.step()
            if self.adaptive and it % s.adaptive_rho_interval == 0:
                self.adapt_rho(self.residuals())
            if it < next_check and it < s.max_iters:
                continue
            chk = self.check()
            next_check = it + interval
            elapsed = time.perf_counter() - t0
            lower = max(lower, chk["lower"])
            if chk["feasible_x"] is not None and (best is None or chk["primal_obj"] < best[0]):
                best = (chk["primal_obj"], chk["feasible_x"], None)
            gap = relative_gap(best[0], lower) if best is not None else math.inf
            checks_since_try += 1
            sig_p = self.active_signature() if pursuit_end is not None else None
            if pursuit_end is not None and (sig_p is None or pursuit_sig is None
                                            or np.count_nonzero(sig_p != pursuit_sig) > 0):
                pursuit_sig = sig_p
                pol = self.polish()
                polish_info["attempts"] += 1
                if pol is not None and relative_gap(pol[0], max(lower, pol[3])) <= s.eps_rel:
                    lower = max(lower, pol[3])
                    cand = (pol[0], pol[1], pol[2])
                    if self._duals_certify(cand):
                        kkt_best = cand
                        polish_info["success"] = True
            elif s.polish and not polish_info["success"]:
                # Polish once the identified active set has settled (few changes since the
                # last check) and differs from the one a previous attempt failed on; after a
                # failure, wait until the gap halves or several checks have passed (the
                # certified gap of some splittings stalls while the active set is right).
                sig = self.active_signature()
                changes = math.inf if prev_sig is None or sig is None else int(np.count_nonzero(sig != prev_sig))
                prev_sig = sig
                if (sig is not None and changes <= max(2, _SETTLED_FRACTION * sig.size)
                        and (gap <= min(s.polish_gap, tried_gap / 2) or checks_since_try >= _RETRY_CHECKS)
                        and (tried_sig is None or np.count_nonzero(sig != tried_sig) > 0)):
                    tried_sig, tried_gap, checks_since_try = sig, gap, 0
                    pol = self.polish()
                    polish_info["attempts"] += 1
                    polish_info["reason"] = getattr(self, "polish_reason", None)
                    if pol is not None:
                        obj, xp, duals, lb = pol
                        lower = max(lower, lb)
                        if best is None or obj <= best[0]:
                            best = (obj, xp, duals)
                        gap = relative_gap(best[0], lower)
                        polish_info["success"] = relative_gap(obj, lb) <= s.eps_rel
                        if polish_info["success"] and self._duals_certify((obj, xp, duals)):
                            kkt_best = (obj, xp, duals)
            row = {"iter": it, "objective": best[0] if best else chk["primal_obj"],
                   "lower bnd": lower, "rel gap": gap, "pri res": chk["r_prim"],
                   "dua res": chk["r_dual"], "rho": self.rho, "time [s]": elapsed}
            history.append(row)
            self.table.row(row)
            last_check = chk
            if best is not None and gap < -s.eps_rel:
                best = self._unbelow(best, lower)
                gap = relative_gap(best[0], lower)
            if best is not None and -s.eps_rel <= gap <= s.eps_rel:
                if kkt_best is not None and -s.eps_rel <= relative_gap(kkt_best[0], lower) <= s.eps_rel:
                    best = kkt_best
                    status = R.OPTIMAL
                    break
                if not s.polish or self._duals_certify(best):
                    status = R.OPTIMAL
                    break
                # certified, but the multipliers are not exact yet: keep iterating (and
                # polishing) for a while; the point found so far stays the answer
                if pursuit_end is None:
                    pursuit_end = it + max(5 * interval, it // 4)
                    pursuit_deadline = elapsed * (1.0 + _PURSUIT_TIME_FRACTION)
                elif it >= pursuit_end or elapsed >= pursuit_deadline:
                    status = R.OPTIMAL
                    break
            if chk.get("residuals_converged") and chk["x_candidate_ok"]:
                status = R.OPTIMAL
                break
            if chk.get("infeasible"):
                status = R.INFEASIBLE
                break
            if s.callback is not None and s.callback(dict(row, x=self.current_x())):
                status = R.USER_LIMIT
                break
            if elapsed >= s.time_limit:
                status = R.OPTIMAL_INACCURATE
                break
        if status is None:
            status = R.OPTIMAL_INACCURATE
        if status == R.OPTIMAL and s.polish and not polish_info["success"] and s.eps_rel <= _FINAL_POLISH_EPS:
            # Converged on the ADMM certificate: one polish turns the iterate into an
            # exact KKT point (exact multipliers too) when the active set is right.
            pol = self.polish()
            polish_info["attempts"] += 1
            polish_info["reason"] = getattr(self, "polish_reason", None)
            if (pol is not None and relative_gap(pol[0], pol[3]) <= s.eps_rel
                    and (best is None or pol[0] <= best[0] + s.eps_rel * max(1.0, abs(best[0])))):
                best = (pol[0], pol[1], pol[2])
                lower = max(lower, pol[3])
                polish_info["success"] = True
        if last_check is None:
            last_check = self.check()
        if status == R.INFEASIBLE:
            res = SolverResult(x=None, status=status, objective=math.inf, iterations=it,
                               primal_residual=last_check["r_prim"],
                               dual_residual=last_check["r_dual"], history=history,
                               info={"splitting": self.name, "rho": self.rho,
                                     "certificate": last_check.get("certificate")})
            res.state = self.export_state()
            self.table.footer(f"status: {status} after {it} iterations")
            return res
        if best is None:
            # no certified-feasible point: return the constraint-satisfying iterate
            xbest = last_check["x_candidate"]
            obj = self.data.objective(xbest)
            duals = None
        else:
            obj, xbest, duals = best
        if relative_gap(obj, lower) < -s.eps_rel:
            # Below the certified bound: the point gains from its (allowed, <= eps_abs)
            # violation, which large weights turn into a real objective difference.
            # Prefer an exactly feasible repair of it.
            xr = self.repair(xbest)
            if xr is not None and self.violation(xr) <= min(s.eps_abs, self.violation(xbest)):
                obj_r = self.data.objective(xr)
                if relative_gap(obj_r, lower) >= -s.eps_rel or obj_r > obj:
                    xbest, obj, duals = xr, obj_r, None
        if duals is None:
            duals = self.duals(xbest)
        duals = dict(duals)
        w_cand = duals.pop("_w", None)
        if w_cand is None:
            w_cand = self.loss_multiplier_guess()
        viol = self.violation(xbest)
        res = SolverResult(
            x=xbest, status=status, objective=obj, lower_bound=lower, gap=relative_gap(obj, lower),
            duals=duals, iterations=it, primal_residual=viol, dual_residual=last_check["r_dual"],
            history=history,
            info={"splitting": self.name, "rho": self.rho, "polish": polish_info,
                  "violation": viol, "admm_primal_residual": last_check["r_prim"],
                  "_w": w_cand})
        res.state = self.export_state()
        self.table.footer(f"status: {status}, objective {obj:.10g}, certified gap {res.gap:.2e}, "
                          f"{it} iterations, polish {'ok' if polish_info['success'] else 'no'}")
        return res


# ---------------------------------------------------------------------------
class _SeparableADMM(_Base):
    """``min f(x) + I_C(z)  s.t. x = z`` with separable ``f`` (loss + bounds)."""

    def __init__(self, data: ConsistencyData, f: SeparableLoss, settings: ADMMSettings) -> None:
        super().__init__(data, settings)
        self.f = f
        n = data.n
        self.proj = None
        self.chains = data.chains if data.chains is not None and data.chains.chains else None
        if data.A is not None and data.A.shape[0] > 0:
            self.proj = make_projector(data.A, data.b, data.forest_hint)
            if not self.proj.feasible:
                self.infeasible_setup = True
            self.name = "separable/tree" if isinstance(self.proj, ForestProjector) else "separable/affine"
        elif self.chains is not None:
            self.name = "separable/order"
        else:
            self.name = "separable/none"
        # Pure L1 on a forest: the certified gap (with the node-wise dual repair) converges
        # fastest at a fixed rho = 2/b^2; residual balancing drives rho down by 3-5x there
        # and needs 3-5x the iterations (hierarchies of 2^10 - 2^20 leaves, eps 0.1 and 1).
        self._l1_forest = isinstance(self.proj, ForestProjector) and not np.any(f.w2)
        default_rho = (_L1_FOREST_RHO / _L1_RHO_FACTOR) * _initial_rho(f.w1, f.w2) \
            if self._l1_forest else _initial_rho(f.w1, f.w2)
        self.rho = settings.rho or default_rho
        self._set_rho_range()
        self.n = n
        # A point of C inside the bounds proves feasibility: then no infeasibility test.
        self._surely_feasible = (self.proj is None or not f.has_bounds
                                 or f.bound_violation(self.proj.particular) == 0.0
                                 or (isinstance(self.proj, ForestProjector)
                                     and f.bound_violation(self.proj.feasible_from(f.clip(self.proj.particular))) == 0.0
                                     and float(np.max(np.abs(self.proj.residual(
                                         self.proj.feasible_from(f.clip(self.proj.particular)))), initial=0.0)) == 0.0))
        if self.proj is None and self.chains is not None and f.has_bounds:
            pt = f.clip(self.chains.project(f.clip(np.zeros(n))))
            self._surely_feasible = f.bound_violation(pt) == 0.0 and self.chains.violation(pt) == 0.0

    # projection onto C and its support-function pieces ------------------
    def P(self, v: np.ndarray) -> np.ndarray:
        if self.proj is not None:
            return self.proj.project(v)
        if self.chains is not None:
            return self.chains.project(v)
        return v

    def init_iterates(self, x0, state) -> None:
        f = self.f
        if state is not None and state.shape == self.name and state.z.size == self.n:
            # Keep this problem's rho (the data, e.g. a noise-scale Parameter, may have
            # changed); carry the multipliers lam = rho u over, rescaled by how much the
            # loss weights changed, since the dual scales with them.
            z = state.z.copy() if x0 is None else self.P(np.asarray(x0, float))
            weight_ratio = _weight_scale(f.w1, f.w2) / state.extra.get("weight_scale", _weight_scale(f.w1, f.w2))
            u = state.u * (state.rho * weight_ratio / self.rho)
        else:
            start = f.clip(np.where(f.w1 + f.w2 > 0, f.y, 0.0)) if x0 is None else np.asarray(x0, float)
            z = self.P(start)
            u = np.zeros(self.n)
        # Douglas-Rachford form of the same iteration: w = z + u is the projection's input.
        self.w = z + u
        self.z = self.z_prev = z
        self.w_used = self.w
        self.x = f.prox(z - u, self.rho)

    @property
    def u(self) -> np.ndarray:
        """The scaled dual matching the current ``(x, z)``: ``u = w - P(w)``."""
        return self.w_used - self.z

    def step(self) -> None:
        """``z = P(w)``, ``x = prox_f(2z - w)``, ``w += alpha (x - z)``: ADMM with
        over-relaxation ``alpha`` written on ``w = z + u`` (fewer passes over memory)."""
        self.z_prev = self.z
        z = self.P(self.w)
        t = np.subtract(z, self.w)
        t += z
        x = self.f.prox(t, self.rho, out_of_place=False)
        d = x - z
        d *= self.s.alpha
        self.w_used = self.w
        self.w = self.w + d
        self.x, self.z = x, z

    def current_x(self) -> np.ndarray:
        return self.z

    @property
    def adaptive(self) -> bool:
        if self.s.adaptive_rho is None:
            return not self._l1_forest
        return bool(self.s.adaptive_rho)

    def residuals(self) -> dict:
        return {"r_prim": float(_norm(self.x - self.z)),
                "r_dual": float(self.rho * _norm(self.z - self.z_prev))}

    def adapt_rho(self, chk) -> None:
        """Residual balancing (OSQP): scale rho by sqrt of the normalized residual ratio."""
        xn = max(_norm(self.x), _norm(self.z), 1e-300)
        un = max(self.rho * _norm(self.u), 1e-300)
        pri = chk["r_prim"] / xn
        dua = chk["r_dual"] / un
        new = self._balanced_rho(pri, dua)
        if new is not None:
            # rescale the scaled dual u = w - z: w = z + u * rho / rho_new
            self.w = self.z + (self.w - self.z) * (self.rho / new)
            self.w_used = self.w
            self.x = self.f.prox(self.z - (self.w - self.z), new)
            self.rho = new

    def violation(self, x) -> float:
        v = self.f.bound_violation(x)
        if self.proj is not None:
            v = max(v, float(np.max(np.abs(self.proj.residual(x)), initial=0.0)))
        if self.chains is not None:
            v = max(v, self.chains.violation(x))
        return v

    def _dual_value(self, lam: np.ndarray) -> float:
        """D(lam) = -f*(-lam) - sigma_C(lam) after moving lam into dom sigma_C.

        On a forest, lam is repaired into the domain of f* node by node (interval
        propagation, see :mod:`cvxdp.solvers.polish`), which loses far less than scaling
        the whole vector; elsewhere it is scaled by the largest feasible theta."""
        if self.proj is not None:
            lam = lam - self.proj.project_nullspace(lam)      # into range(A^T)
            support = float(_dot(lam, self.proj.particular))
        elif self.chains is not None:
            lam = lam - self.chains.project(lam)              # into the polar cone
            support = 0.0
        else:
            lam = np.zeros_like(lam)
            support = 0.0
        theta = self.f.max_dual_scale(-lam)
        if theta < _REPAIR_BELOW and self.chains is not None and self.proj is None:
            lo, hi = self.f.dual_domain()
            lam_c = chain_dual(self.chains, lo, hi, lam)
            if lam_c is not None:
                val = self.f.conjugate_sum(-lam_c)
                if math.isfinite(val):
                    self.last_dual_point = lam_c
                    return -val + self.data.constant
        if theta < _REPAIR_BELOW and isinstance(self.proj, ForestProjector):
            # Scaling the whole vector would lose too much: repair lam into the domain
            # of f* node by node instead (interval propagation on the forest).
            lo, hi = self.f.dual_domain()
            lam_f = forest_dual(self.proj, lo, hi, lam)
            if lam_f is not None:
                val = self.f.conjugate_sum(-lam_f)
                if math.isfinite(val):
                    self.last_dual_point = lam_f
                    return -val - float(_dot(lam_f, self.proj.particular)) + self.data.constant
        val = self.f.conjugate_sum(-theta * lam)
        if not math.isfinite(val):
            return -math.inf
        return -val - theta * support + self.data.constant

    def check(self) -> dict:
        f, d = self.f, self.data
        r_prim = float(_norm(self.x - self.z))
        r_dual = float(self.rho * _norm(self.z - self.z_prev))
        lower = self._dual_value(self.rho * self.u)
        # feasible candidates: z is in C by construction (only its bounds need checking);
        # with a forest, the clipped leaves of x summed up are consistent too
        cands = [(self.z, False)]
        if isinstance(self.proj, ForestProjector):
            cands.append((self.proj.feasible_from(f.clip(self.x)), False))
        if self.chains is not None and f.has_bounds:
            cands.append((f.clip(self.z), True))
        feasible_x, pobj = None, math.inf
        tol = self.s.eps_abs
        z_ok = None
        for c, full in cands:
            viol = self.violation(c) if full else f.bound_violation(c)
            if c is self.z:
                z_ok = viol <= tol
            if viol <= tol:
                val = f.value(c) + d.constant
                if val < pobj:
                    feasible_x, pobj = c, val
        out = {"r_prim": r_prim, "r_dual": r_dual, "lower": lower,
               "feasible_x": feasible_x, "primal_obj": pobj if feasible_x is not None else f.value(self.z) + d.constant,
               "x_candidate": self.z, "x_candidate_ok": bool(z_ok)}
        xn = max(_norm(self.x), _norm(self.z))
        eps_p = tol * math.sqrt(self.n) + self.s.eps_rel * xn
        eps_d = tol * math.sqrt(self.n) + self.s.eps_rel * self.rho * _norm(self.u)
        out["residuals_converged"] = r_prim <= eps_p and r_dual <= eps_d and not math.isfinite(lower)
        if r_prim > eps_p and self.proj is not None and f.has_bounds and not self._surely_feasible:
            cert = self._infeasibility_certificate()
            if cert is not None:
                out["infeasible"] = True
                out["certificate"] = cert
        return out

    def _infeasibility_certificate(self):
        """Separating hyperplane between the box and the affine set, from z - x."""
        lam = self.z - self.x
        lam = lam - self.proj.project_nullspace(lam)
        nrm = _norm(lam)
        if nrm == 0:
            return None
        lam /= nrm
        lo, hi = self.f.lower, self.f.upper
        with np.errstate(invalid="ignore"):
            sup_box = np.where(lam > 0, lam * hi, np.where(lam < 0, lam * lo, 0.0))
        if not np.all(np.isfinite(sup_box)):
            return None
        sup = float(sup_box.sum())
        level = float(_dot(lam, self.proj.particular))
        scale = 1.0 + _norm(self.proj.particular) + _norm(self.x)
        if sup < level - 1e-7 * scale:
            return {"direction": lam, "box_support": sup, "affine_level": level}
        return None

    def duals(self, x: np.ndarray) -> dict:
        """Multipliers from the ADMM dual ``lam = rho u`` (``lam in N_C``, ``-lam in df``),
        made exact for ``x`` where the constraint set allows it: on a forest (interval
        propagation) and on order chains, the multiplier closest to ``lam`` whose
        negative is a subgradient of ``f`` at ``x`` (kinks and bounds within eps_abs)."""
        from .polish import subdifferential_box

        lam = self.rho * self.u
        if isinstance(self.proj, ForestProjector) or (self.proj is None and self.chains is not None):
            L, U = subdifferential_box(self.f, x, self.s.eps_abs)
            if self.proj is not None:
                exact = forest_dual(self.proj, L, U, lam)
            else:
                exact = chain_dual(self.chains, L, U, lam - self.chains.project(lam))
            if exact is not None:
                return self._duals_from(x, exact)
        return self._duals_from(x, lam)

    def loss_multiplier_guess(self):
        return None

    def repair(self, x):
        """An exactly consistent point near ``x``: the clipped leaves summed up (forests)."""
        if not isinstance(self.proj, ForestProjector):
            if self.proj is None and self.chains is None:
                return self.f.clip(x)
            return None
        return self.proj.feasible_from(self.f.clip(x))

    def _duals_from(self, x, lam) -> dict:
        out = {}
        if self.proj is not None:
            lam_c = lam - self.proj.project_nullspace(lam)
            # cvxpy's Lagrangian: loss + y^T (A x - b) + s_lo^T (l - x) + s_up^T (x - u);
            # stationarity with -lam in df(x) gives A^T y = lam.
            out["eq"] = self.proj.multipliers(lam_c)
            g_total = -lam_c
        elif self.chains is not None:
            lam_c = lam - self.chains.project(lam)
            out["order"] = [np.maximum(o, 0.0) for o in self.chains.multipliers(lam_c)]
            g_total = -lam_c
        else:
            g_total = np.zeros(self.n)
        s_lo, s_up = self.f.subgradient_at(x, g_total, self.s.eps_abs)
        out["lower"] = s_lo
        out["upper"] = s_up
        return out

    def export_state(self) -> ADMMState:
        return ADMMState(self.name, self.rho, self.z.copy(), self.u.copy(),
                         extra={"weight_scale": _weight_scale(self.f.w1, self.f.w2)})

    # polish ---------------------------------------------------------------
    def active_signature(self):
        """Status code per coordinate of the prox output: 0 free, 1 zero residual,
        2 on the lower bound, 3 on the upper bound."""
        if self.proj is None:
            return None
        f, x = self.f, self.x
        sig = ((f.w1 > 0) & (x == f.y)).astype(np.int8)
        sig[x <= f.lower] = 2
        sig[x >= f.upper] = 3
        return sig

    def polish(self):
        if self.proj is None:
            self.polish_reason = "not available without equality constraints (order chains)"
            return None
        from .polish import polish_separable

        return polish_separable(self, self.x, self.rho * self.u)


# ---------------------------------------------------------------------------
class _GeneralADMM(_Base):
    """Residual split ``r = M x - y`` plus consensus copies ``x_j = x`` for the
    bounds, the affine set and the order cone; x-update with ``M^T M + k I``."""

    name = "general"

    def __init__(self, data: ConsistencyData, settings: ADMMSettings) -> None:  # noqa: C901
        super().__init__(data, settings)
        self.n = n = data.n
        has_eq = data.A is not None and data.A.shape[0] > 0
        self.penalty = has_eq and settings.equality_split == "penalty"
        M, y = data.M.tocsr(), data.y
        w1, w2 = data.w1, data.w2
        lo_r, hi_r = np.full(M.shape[0], -np.inf), np.full(M.shape[0], np.inf)
        self.m_loss = M.shape[0]
        if self.penalty:
            # Lee et al. Algorithm 1: A x - b is one more residual, held at zero by its
            # prox (the indicator of {0}); the x-update then solves with M^T M + A^T A + k I.
            p = data.A.shape[0]
            M = sp.vstack([M, data.A]).tocsr()
            y = np.concatenate([y, data.b])
            w1, w2 = np.r_[w1, np.zeros(p)], np.r_[w2, np.zeros(p)]
            lo_r, hi_r = np.r_[lo_r, np.zeros(p)], np.r_[hi_r, np.zeros(p)]
        self.M, self.MT, self.y_ext = M, M.T.tocsr(), y
        self.m = M.shape[0]
        self.loss = SeparableLoss(np.zeros(self.m), w1, w2, lo_r, hi_r)
        self._free_rows = np.isinf(lo_r) & (w2 == 0)      # their dual must lie in [-w1, w1]
        self.blocks: list[tuple[str, Callable]] = []
        self.box = SeparableLoss(np.zeros(n), np.zeros(n), np.zeros(n), data.lower, data.upper)
        self.proj = None
        self.chains = data.chains if data.chains is not None and data.chains.chains else None
        if self.box.has_bounds:
            self.blocks.append(("bounds", self.box.clip))
        if has_eq and not self.penalty:
            self.proj = make_projector(data.A, data.b, data.forest_hint)
            if not self.proj.feasible:
                self.infeasible_setup = True
            self.blocks.append(("eq", self.proj.project))
        if self.chains is not None:
            self.blocks.append(("order", self.chains.project))
        if not self.blocks:
            self.blocks.append(("free", lambda v: v))
        k = len(self.blocks)
        # a point of the affine set (or the origin) satisfying everything proves feasibility
        pt = self.proj.particular if self.proj is not None else (
            self.box.clip(np.zeros(n)) if self.chains is None else np.zeros(n))
        self._surely_feasible = bool(self.box.bound_violation(pt) == 0.0 and (
            self.chains is None or self.chains.violation(pt) == 0.0) and (
            self.proj is None or float(np.max(np.abs(self.proj.residual(pt)), initial=0.0)) <= 1e-12 * (1 + _norm(pt))))
        if self.penalty:
            self._surely_feasible = False
        self._factor(k)
        # the consensus blocks live in x-space, where the loss's curvature per unit weight
        # is diag(M^T M): scale rho by its mean (1 for a node-wise M)
        col_sq = float(data.M.multiply(data.M).sum()) / max(n, 1)
        self.rho = settings.rho or _initial_rho(data.w1, data.w2) * max(col_sq, 1e-12)
        self.rho_min = self.rho / _GENERAL_RHO_RANGE
        self.rho_max = self.rho * _GENERAL_RHO_RANGE
        self.name = "general/penalty" if self.penalty else "general"

    def _factor(self, k: int) -> None:
        """Cache a factorization of ``G = M^T M + k I`` (never dense for large n)."""
        n, m = self.n, self.m
        if m < n and m <= 3000:
            # Woodbury: G^{-1} = (I - M^T (k I + M M^T)^{-1} M) / k, with a dense m x m factor
            S = (self.M @ self.MT).toarray()
            S[np.diag_indices_from(S)] += k
            c = la.cho_factor(S, lower=True, check_finite=False)
            self._solveG = lambda r: (r - self.MT @ la.cho_solve(c, self.M @ r, check_finite=False)) / k
        elif n <= 3000:
            G = (self.MT @ self.M).toarray()
            G[np.diag_indices_from(G)] += k
            c = la.cho_factor(G, lower=True, check_finite=False)
            self._solveG = lambda r: la.cho_solve(c, r, check_finite=False)
        else:
            G = (self.MT @ self.M + k * sp.identity(n, format="csr")).tocsc()
            lu = spla.splu(G)
            self._solveG = lu.solve

    def init_iterates(self, x0, state) -> None:
        n, m, k = self.n, self.m, len(self.blocks)
        if state is not None and state.shape == self.name and state.z.size == n:
            self.x = state.z.copy()
            self.rho = min(max(state.rho, self.rho_min), self.rho_max) if not self.s.rho else self.rho
            self.r = state.extra["r"].copy()
            self.mu = state.extra["mu"].copy()
            self.xs = [v.copy() for v in state.extra["xs"]]
            self.us = [v.copy() for v in state.extra["us"]]
            if len(self.xs) != k:
                state = None
        if state is None or state.shape != self.name:
            x = np.zeros(n) if x0 is None else np.asarray(x0, float).copy()
            if x0 is None:
                # least squares start: (M^T M + k I) x = M^T y
                x = self._solveG(self.MT @ self.y_ext)
            self.x = x
            self.r = self.M @ x - self.y_ext
            self.mu = np.zeros(m)
            self.xs = [fn(x) for _, fn in self.blocks]
            self.us = [np.zeros(n) for _ in self.blocks]
        self.r_prev = self.r
        self.xs_prev = self.xs

    def step(self) -> None:
        a = self.s.alpha
        y = self.y_ext
        rhs = self.MT @ (y + self.r - self.mu)
        for xj, uj in zip(self.xs, self.us):
            rhs += xj - uj
        self.x = self._solveG(rhs)
        mx = self.M @ self.x - y
        mxr = a * mx + (1 - a) * self.r
        self.r_prev = self.r
        self.r = self.loss.prox(mxr + self.mu, self.rho)
        self.mu += mxr - self.r
        self.xs_prev = self.xs
        new_xs = []
        for (name, fn), xj, uj in zip(self.blocks, self.xs, self.us):
            xr = a * self.x + (1 - a) * xj
            xn = fn(xr + uj)
            uj += xr - xn
            new_xs.append(xn)
        self.xs = new_xs

    def current_x(self) -> np.ndarray:
        return self.x

    def _residuals(self):
        mx = self.M @ self.x - self.y_ext
        rp = _norm(mx - self.r) ** 2
        for xj in self.xs:
            rp += _norm(self.x - xj) ** 2
        rd_vec = self.MT @ (self.r - self.r_prev)
        for xj, xjp in zip(self.xs, self.xs_prev):
            rd_vec = rd_vec + (xj - xjp)
        return math.sqrt(rp), float(self.rho * _norm(rd_vec))

    def residuals(self) -> dict:
        r_prim, r_dual = self._residuals()
        return {"r_prim": r_prim, "r_dual": r_dual}

    def adapt_rho(self, chk) -> None:
        scale_p = max(_norm(self.x), _norm(self.r), 1e-300)
        scale_d = max(self.rho * (_norm(self.MT @ self.mu)
                                  + sum(_norm(u) for u in self.us)), 1e-300)
        pri, dua = chk["r_prim"] / scale_p, chk["r_dual"] / scale_d
        new = self._balanced_rho(pri, dua)
        if new is not None:
            f = self.rho / new
            self.mu *= f
            for u in self.us:
                u *= f
            self.rho = new

    def violation(self, x) -> float:
        v = self.box.bound_violation(x)
        if self.proj is not None:
            v = max(v, float(np.max(np.abs(self.proj.residual(x)), initial=0.0)))
        elif self.penalty:
            v = max(v, float(np.max(np.abs(self.data.A @ x - self.data.b), initial=0.0)))
        if self.chains is not None:
            v = max(v, self.chains.violation(x))
        return v

    def _dual_value(self) -> float:
        """D = -phi*(mu') - mu'^T y - sum_j g_j^*(lam_j) with stationarity
        ``M^T mu' + sum_j lam_j = 0`` enforced by the bounds block (or the single block)."""
        d = self.data
        mu = self.rho * self.mu
        w1 = self.loss.w1
        mu = np.where(self._free_rows, np.clip(mu, -w1, w1), mu)
        lams = [self.rho * u for u in self.us]
        names = [nm for nm, _ in self.blocks]
        # move each non-absorbing multiplier into its conjugate's domain
        for j, nm in enumerate(names):
            if nm == "eq":
                lams[j] = lams[j] - self.proj.project_nullspace(lams[j])
            elif nm == "order":
                lams[j] = lams[j] - self.chains.project(lams[j])
        absorb = names.index("bounds") if "bounds" in names else (0 if len(names) == 1 else None)
        if absorb is None:
            return -math.inf
        lams[absorb] = -(self.MT @ mu) - sum(l for j, l in enumerate(lams) if j != absorb)
        total = -self.loss.conjugate_sum(mu) - _dot(mu, self.y_ext)
        for j, nm in enumerate(names):
            lam = lams[j]
            if nm == "bounds":
                # multipliers at rounding level on an unbounded side count as zero
                tiny = _DUAL_ZERO_RTOL * max(1.0, float(np.max(np.abs(lam), initial=0.0)))
                lam = np.where(np.abs(lam) <= tiny, 0.0, lam)
                with np.errstate(invalid="ignore"):
                    sup = np.where(lam > 0, lam * d.upper, np.where(lam < 0, lam * d.lower, 0.0))
                if not np.all(np.isfinite(sup)):
                    return -math.inf
                total -= float(sup.sum())
            elif nm == "eq":
                if j == absorb:
                    resid = lam - (lam - self.proj.project_nullspace(lam))
                    if _norm(resid) > 1e-9 * (1 + _norm(lam)):
                        return -math.inf
                total -= _dot(lam, self.proj.particular)
            elif nm == "order":
                if j == absorb and _norm(self.chains.project(lam)) > 1e-9 * (1 + _norm(lam)):
                    return -math.inf
            elif nm == "free":
                if _norm(lam) > 1e-9 * (1 + _norm(mu)):
                    return -math.inf
        return total + d.constant

    def check(self) -> dict:
        r_prim, r_dual = self._residuals()
        lower = self._dual_value()
        tol = self.s.eps_abs
        # candidates: each block's copy satisfies its own set exactly
        cands = [self.x] + list(self.xs)
        feasible_x, pobj = None, math.inf
        for c in cands:
            if self.violation(c) <= tol:
                val = self.data.objective(c)
                if val < pobj:
                    feasible_x, pobj = c, val
        dim = self.n * len(self.blocks) + self.m
        scale_p = max(_norm(self.x), _norm(self.r))
        scale_d = self.rho * (_norm(self.MT @ self.mu) + sum(_norm(u) for u in self.us))
        eps_p = tol * math.sqrt(dim) + self.s.eps_rel * scale_p
        eps_d = tol * math.sqrt(self.n) + self.s.eps_rel * scale_d
        cand = self.xs[-1] if self.blocks[-1][0] != "free" else self.x
        return {"r_prim": r_prim, "r_dual": r_dual, "lower": lower, "feasible_x": feasible_x,
                "primal_obj": pobj if feasible_x is not None else self.data.objective(self.x),
                "x_candidate": cand, "x_candidate_ok": self.violation(cand) <= max(tol, eps_p),
                "residuals_converged": r_prim <= eps_p and r_dual <= eps_d and not math.isfinite(lower)}

    def duals(self, x: np.ndarray) -> dict:
        out = {}
        names = [nm for nm, _ in self.blocks]
        if self.penalty:
            out["eq"] = self.rho * self.mu[self.m_loss:]
        for (nm, _), u in zip(self.blocks, self.us):
            lam = self.rho * u
            if nm == "eq":
                lam = lam - self.proj.project_nullspace(lam)
                out["eq"] = self.proj.multipliers(lam)
            elif nm == "order":
                lam = lam - self.chains.project(lam)
                out["order"] = [np.maximum(o, 0.0) for o in self.chains.multipliers(lam)]
            elif nm == "bounds":
                out["lower"] = np.maximum(-lam, 0.0) * (x <= self.data.lower + self.s.eps_abs)
                out["upper"] = np.maximum(lam, 0.0) * (x >= self.data.upper - self.s.eps_abs)
        if "bounds" not in names:
            out["lower"] = np.zeros(self.n)
            out["upper"] = np.zeros(self.n)
        return out

    def loss_multiplier_guess(self):
        mu = self.rho * self.mu[:self.m_loss]
        w1 = self.data.w1
        free = self._free_rows[:self.m_loss]
        return np.where(free, np.clip(mu, -w1, w1), mu)

    def active_signature(self):
        """Zero residuals of the prox and bound hits of the bounds block."""
        if "bounds" not in [nm for nm, _ in self.blocks] or self.chains is not None:
            return None
        xb = self.xs[[nm for nm, _ in self.blocks].index("bounds")]
        d = self.data
        return np.r_[((d.w1 > 0) & (self.r[:self.m_loss] == 0)).astype(np.int8),
                     (xb <= d.lower).astype(np.int8) + 2 * (xb >= d.upper).astype(np.int8)]

    def polish(self):
        from .polish import polish_general

        return polish_general(self)

    def export_state(self) -> ADMMState:
        return ADMMState(self.name, self.rho, self.x.copy(), np.zeros(0),
                         extra={"r": self.r.copy(), "mu": self.mu.copy(),
                                "xs": [v.copy() for v in self.xs], "us": [v.copy() for v in self.us]})
